// A small Markdown renderer for model output that builds DOM nodes directly.
//
// Model text is untrusted: every character reaches the page through
// textContent or a text node, never through innerHTML, so raw HTML in the
// text shows up as literal text. Links are the only attribute the text can
// set, and only http:, https: and mailto: URLs become links.
//
// Supported: paragraphs, ATX headings, emphasis (* _ ** __ ~~), inline code,
// fenced code blocks with a Copy button, bullet and numbered lists (nested by
// indentation), block quotes, horizontal rules, [text](url) links, <url>
// autolinks and bare http(s) URLs. Everything else is shown as written.

const SAFE_PROTOCOLS = new Set(['http:', 'https:', 'mailto:']);

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)[^`]*$/;
const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$/;
const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
const LIST_ITEM = /^( *)([-*+]|\d{1,9}[.)])(?:[ \t]+(.*))?$/;
const QUOTE = /^ {0,3}> ?(.*)$/;
// Deeper nesting (quotes, lists, emphasis, link labels) is shown as plain
// text: model output like "> > > ..." or "****..." must not exhaust the
// stack or stall the page.
const MAX_NESTING = 12;

// Renders Markdown source into a DocumentFragment.
export function render(source) {
  const fragment = document.createDocumentFragment();
  const lines = String(source ?? '').replace(/\r\n?/g, '\n').replace(/\t/g, '    ').split('\n');
  renderBlocks(lines, fragment);
  return fragment;
}

// Returns the URL as a string when it is absolute and uses an allowed
// scheme, or null. Parsing without a base rejects relative URLs, and the
// URL parser strips the whitespace and control characters that tricks like
// " javascript:" or "java\tscript:" rely on before the scheme is compared.
export function safeUrl(raw) {
  let url;
  try {
    url = new URL(raw);
  } catch {
    return null;
  }
  return SAFE_PROTOCOLS.has(url.protocol) ? url.href : null;
}

function isBlank(line) {
  return line.trim() === '';
}

function indentOf(line) {
  return line.length - line.trimStart().length;
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || LIST_ITEM.test(line);
}

function renderBlocks(lines, parent, depth = 0) {
  if (depth > MAX_NESTING) {
    const element = document.createElement('p');
    appendText(lines.join('\n'), element);
    parent.append(element);
    return;
  }
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (isBlank(line)) {
      i += 1;
      continue;
    }
    const fence = FENCE.exec(line);
    if (fence) {
      i = renderFence(lines, i, fence, parent);
      continue;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      const element = document.createElement(`h${heading[1].length}`);
      renderInline(heading[2] ?? '', element, { depth, inLink: false });
      parent.append(element);
      i += 1;
      continue;
    }
    if (RULE.test(line)) {
      parent.append(document.createElement('hr'));
      i += 1;
      continue;
    }
    if (QUOTE.test(line)) {
      const quoted = [];
      while (i < lines.length && !isBlank(lines[i])) {
        const match = QUOTE.exec(lines[i]);
        quoted.push(match ? match[1] : lines[i]);
        i += 1;
      }
      const element = document.createElement('blockquote');
      renderBlocks(quoted, element, depth + 1);
      parent.append(element);
      continue;
    }
    if (LIST_ITEM.test(line)) {
      i = renderList(lines, i, parent, depth);
      continue;
    }
    const paragraph = [line];
    i += 1;
    while (i < lines.length && !isBlank(lines[i]) && !startsBlock(lines[i])) {
      paragraph.push(lines[i]);
      i += 1;
    }
    const element = document.createElement('p');
    renderInline(paragraph.map((l) => l.trim()).join('\n'), element, { depth, inLink: false });
    parent.append(element);
  }
}

// A fence without its closing line runs to the end of the text, which is
// what a code block looks like while it is still streaming in.
function renderFence(lines, start, fence, parent) {
  const marker = fence[1];
  const indent = indentOf(lines[start]);
  const body = [];
  let i = start + 1;
  while (i < lines.length) {
    const trimmed = lines[i].trim();
    if (trimmed.startsWith(marker[0].repeat(marker.length)) && /^(`+|~+)$/.test(trimmed)) {
      i += 1;
      break;
    }
    // Content indented like its fence loses that indentation.
    body.push(lines[i].replace(new RegExp(`^ {0,${indent}}`), ''));
    i += 1;
  }
  parent.append(codeBlock(body.join('\n'), fence[2]));
  return i;
}

function codeBlock(text, language) {
  const wrapper = document.createElement('div');
  wrapper.className = 'code-block';
  const head = document.createElement('div');
  head.className = 'code-head';
  const label = document.createElement('span');
  label.className = 'code-language';
  label.textContent = language || 'text';
  const copy = document.createElement('button');
  copy.type = 'button';
  copy.className = 'copy';
  copy.textContent = 'Copy';
  const pre = document.createElement('pre');
  const code = document.createElement('code');
  code.textContent = text;
  pre.append(code);
  copy.addEventListener('click', () => copyCode(code, copy));
  head.append(label, copy);
  wrapper.append(head, pre);
  return wrapper;
}

// The Clipboard API exists only in secure contexts (https, localhost); on a
// plain-http LAN address the code is selected instead so Ctrl+C copies it.
async function copyCode(code, button) {
  let copied = false;
  try {
    if (navigator.clipboard) {
      await navigator.clipboard.writeText(code.textContent);
      copied = true;
    }
  } catch {
    copied = false;
  }
  if (!copied) {
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.selectAllChildren(code);
  }
  button.textContent = copied ? 'Copied' : 'Press Ctrl+C';
  setTimeout(() => {
    button.textContent = 'Copy';
  }, 1500);
}

// A list runs while its lines are items at the list's own indentation,
// lines indented deeper (an item's continuation or a nested list), or lazy
// continuation lines of an item's paragraph. Each item's lines are rendered
// as blocks again, which is what makes nesting work.
function renderList(lines, start, parent, depth) {
  const first = LIST_ITEM.exec(lines[start]);
  const ordered = /\d/.test(first[2]);
  const baseIndent = first[1].length;
  const list = document.createElement(ordered ? 'ol' : 'ul');
  if (ordered) {
    const number = parseInt(first[2], 10);
    if (number !== 1) list.start = number;
  }
  const items = [];
  let loose = false;
  let i = start;
  while (i < lines.length) {
    const line = lines[i];
    const item = LIST_ITEM.exec(line);
    if (item && item[1].length <= baseIndent + 1) {
      if (/\d/.test(item[2]) !== ordered) break;
      items.push({ contentIndent: item[1].length + item[2].length + 1, lines: [item[3] ?? ''] });
      i += 1;
      continue;
    }
    const current = items[items.length - 1];
    if (isBlank(line)) {
      // A blank line continues the list only when more of it follows.
      let next = i + 1;
      while (next < lines.length && isBlank(lines[next])) next += 1;
      const following = lines[next];
      const continues = following !== undefined
        && (indentOf(following) > baseIndent
          || (LIST_ITEM.test(following) && /\d/.test(LIST_ITEM.exec(following)[2]) === ordered));
      if (!continues) break;
      loose = true;
      current.lines.push('');
      i += 1;
      continue;
    }
    if (indentOf(line) > baseIndent) {
      const dedent = Math.min(indentOf(line), current.contentIndent);
      current.lines.push(line.slice(dedent));
      i += 1;
      continue;
    }
    const previous = current.lines[current.lines.length - 1];
    if (previous !== '' && !startsBlock(line)) {
      current.lines.push(line);
      i += 1;
      continue;
    }
    break;
  }
  for (const item of items) {
    const element = document.createElement('li');
    renderBlocks(item.lines, element, depth + 1);
    // Tight lists keep their text inline rather than in paragraphs.
    if (!loose) {
      for (const child of [...element.children]) {
        if (child.tagName === 'P') child.replaceWith(...child.childNodes);
      }
    }
    list.append(element);
  }
  parent.append(list);
  return i;
}

// Inside a link's label no further links are made: nested anchors are
// invalid HTML, and "[https://x.org](https://x.org)" is common model output.
function renderInline(text, parent, { depth, inLink }) {
  if (depth > MAX_NESTING) {
    appendText(text, parent);
    return;
  }
  const inner = { depth: depth + 1, inLink };
  const closers = new Map();
  let plain = '';
  const flush = () => {
    if (plain) appendText(plain, parent);
    plain = '';
  };
  let i = 0;
  while (i < text.length) {
    const char = text[i];
    if (char === '\\' && i + 1 < text.length && /[!-\/:-@\[-`{-~]/.test(text[i + 1])) {
      plain += text[i + 1];
      i += 2;
      continue;
    }
    const parsed = parseCode(text, i) ?? parseEmphasis(text, i, inner, closers)
      ?? (inLink ? null : parseLink(text, i, inner) ?? parseAutolink(text, i) ?? parseBareUrl(text, i));
    if (parsed) {
      flush();
      parent.append(parsed.node);
      i = parsed.end;
      continue;
    }
    plain += char;
    i += 1;
  }
  flush();
}

// Line breaks inside a paragraph are kept: models use them for verse,
// addresses and short lines far more often than for reflowed prose.
function appendText(text, parent) {
  const parts = text.split('\n');
  parts.forEach((part, index) => {
    if (index > 0) parent.append(document.createElement('br'));
    if (part) parent.append(document.createTextNode(part));
  });
}

function parseCode(text, start) {
  if (text[start] !== '`') return null;
  let ticks = 0;
  while (text[start + ticks] === '`') ticks += 1;
  const fence = '`'.repeat(ticks);
  let search = start + ticks;
  for (;;) {
    const close = text.indexOf(fence, search);
    if (close < 0) return null;
    let after = close + ticks;
    if (text[after] === '`') {
      while (text[after] === '`') after += 1;
      search = after;
      continue;
    }
    let content = text.slice(start + ticks, close).replace(/\n/g, ' ');
    if (content.length > 2 && content.startsWith(' ') && content.endsWith(' ') && content.trim()) {
      content = content.slice(1, -1);
    }
    const node = document.createElement('code');
    node.textContent = content;
    return { node, end: after };
  }
}

const EMPHASIS = [
  { marker: '**', tag: 'strong' },
  { marker: '__', tag: 'strong' },
  { marker: '~~', tag: 'del' },
  { marker: '*', tag: 'em' },
  { marker: '_', tag: 'em' },
];

function isWordChar(char) {
  return char !== undefined && /[\p{L}\p{N}]/u.test(char);
}

// Emphasis opens before a non-space character and closes after one; an
// underscore inside a word (snake_case) is never emphasis. Whether a marker
// can close depends only on where it stands, so `closers` remembers, per
// marker, the last search: openers are tried left to right, and reusing
// the answer keeps text like "**a **a **a ..." linear instead of quadratic.
function parseEmphasis(text, start, inner, closers) {
  for (const { marker, tag } of EMPHASIS) {
    if (!text.startsWith(marker, start)) continue;
    const open = start + marker.length;
    if (open >= text.length || /\s/.test(text[open]) || (marker.length === 1 && text[open] === marker)) continue;
    if (marker === '_' && isWordChar(text[start - 1])) continue;
    let known = closers.get(marker);
    if (!known || known.from > open || (known.close >= 0 && known.close <= open)) {
      known = { from: open, close: findCloser(text, marker, open) };
      closers.set(marker, known);
    }
    if (known.close < 0) continue;
    const node = document.createElement(tag);
    renderInline(text.slice(open, known.close), node, inner);
    return { node, end: known.close + marker.length };
  }
  return null;
}

// The first position after `from` where `marker` can close emphasis, or -1.
function findCloser(text, marker, from) {
  const single = marker.length === 1;
  let search = from;
  for (;;) {
    let close = text.indexOf(marker, search);
    if (close < 0) return -1;
    // A double marker closes on the last two characters of a run, so
    // "***both***" becomes bold around italic.
    if (!single) while (text[close + marker.length] === marker[0]) close += 1;
    const after = close + marker.length;
    const doubled = single && (text[after] === marker || text[close - 1] === marker);
    const touches = close > from && !/\s/.test(text[close - 1]);
    const intraword = marker[0] === '_' && isWordChar(text[after]);
    if (touches && !doubled && !intraword) return close;
    search = close + 1;
  }
}

// Labels and destinations longer than this are not links; the bound keeps
// a paragraph full of unmatched brackets from costing quadratic time.
const MAX_LINK_PART = 2048;

function findClosingBracket(text, start) {
  let depth = 0;
  const end = Math.min(text.length, start + MAX_LINK_PART);
  for (let i = start; i < end; i += 1) {
    if (text[i] === '\\') {
      i += 1;
    } else if (text[i] === '[') {
      depth += 1;
    } else if (text[i] === ']') {
      depth -= 1;
      if (depth === 0) return i;
    }
  }
  return -1;
}

// [label](destination "optional title"). A destination with any other
// scheme, or a relative one, leaves the whole construct as plain text.
function parseLink(text, start, inner) {
  if (text[start] !== '[') return null;
  const closeBracket = findClosingBracket(text, start);
  if (closeBracket < 0 || text[closeBracket + 1] !== '(') return null;
  let depth = 0;
  let closeParen = -1;
  for (let i = closeBracket + 2; i < Math.min(text.length, closeBracket + 2 + MAX_LINK_PART); i += 1) {
    if (text[i] === '\\') {
      i += 1;
    } else if (text[i] === '(') {
      depth += 1;
    } else if (text[i] === ')') {
      if (depth === 0) {
        closeParen = i;
        break;
      }
      depth -= 1;
    }
  }
  if (closeParen < 0) return null;
  const label = text.slice(start + 1, closeBracket);
  const target = text.slice(closeBracket + 2, closeParen).trim();
  const match = /^<([^<>]*)>(?:\s+(?:"[^"]*"|'[^']*'))?$|^(\S*)(?:\s+(?:"([^"]*)"|'([^']*)'))?$/.exec(target);
  const destination = match ? (match[1] ?? match[2]) : null;
  const href = destination ? safeUrl(destination) : null;
  const end = closeParen + 1;
  if (!href) {
    const node = document.createTextNode(text.slice(start, end));
    return { node, end };
  }
  const node = link(href);
  renderInline(label, node, { ...inner, inLink: true });
  const title = match[3] ?? match[4];
  if (title) node.title = title;
  return { node, end };
}

function parseAutolink(text, start) {
  if (text[start] !== '<') return null;
  const match = /^<((?:https?:|mailto:)[^\s<>]+)>/i.exec(text.slice(start));
  const href = match ? safeUrl(match[1]) : null;
  if (!href) return null;
  const node = link(href);
  node.textContent = match[1];
  return { node, end: start + match[0].length };
}

// A bare URL ends before trailing punctuation and before a closing
// parenthesis it did not open, so "(see https://x.org/a)." links x.org/a.
function parseBareUrl(text, start) {
  if (text[start] !== 'h' && text[start] !== 'H') return null;
  const found = /^https?:\/\/[^\s<>"'`]+/i.exec(text.slice(start, start + 2048));
  if (!found || isWordChar(text[start - 1])) return null;
  let url = found[0];
  for (;;) {
    const last = url[url.length - 1];
    if (/[.,;:!?*_~]/.test(last)) {
      url = url.slice(0, -1);
    } else if (last === ')' && (url.match(/\(/g) ?? []).length < (url.match(/\)/g) ?? []).length) {
      url = url.slice(0, -1);
    } else {
      break;
    }
  }
  const href = safeUrl(url);
  if (!href || url.length <= 'https://'.length) return null;
  const node = link(href);
  node.textContent = url;
  return { node, end: start + url.length };
}

function link(href) {
  const node = document.createElement('a');
  node.href = href;
  node.rel = 'noopener noreferrer';
  node.target = '_blank';
  return node;
}

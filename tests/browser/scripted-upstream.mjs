// A scripted model behind an OpenAI-compatible chat API on 127.0.0.1, for
// the browser steps whose outcome the small real model cannot promise: its
// free text differs by host (the prompt describes the host's sandbox) and
// by sampling. skillhost drives it as an upstream in chat mode
// (`--upstream URL,mode=chat`), so the real server, its loop, its tools,
// its agents and the real page all run; only the model's choices are
// fixed. The real model's delegation is tested in
// tests/python/test_multi_agent.py.
//
// The script, by the root agent's latest user message:
// - FILE_PROMPT: one write_file call of FILE_PATH with FILE_CONTENT, then,
//   once the tool's result is in, FILE_ANSWER.
// - LONG_PROMPT: LONG_ANSWER, one word every LONG_WORD_MS (a minute in
//   all), stopped as soon as the caller goes away; `longAnswers` counts
//   the answers begun and those abandoned before their end.
// - RELOAD_PROMPT: RELOAD_ANSWER, one word every LONG_WORD_MS (eight
//   seconds in all): long enough to reload the page, or kill the server,
//   while it streams.
// - PDF_PROMPT: one shell call of PDF_COMMAND (pdftotext on the attached
//   PDF, in the sandbox), then, once the tool's result is in, a sentence
//   that starts with PDF_ANSWER and repeats the command's output;
//   `attachedPrompts` keeps the latest user message of each such request,
//   where the server names the attached files.
// - anything else: the request's own model starts two agents, waits until
//   both reports are in, and answers. Each child (its first message names
//   it) lists the skills, then reports. Every child answer comes after
//   CHILD_DELAY_MS, so the page shows the children working.

import { createServer } from 'node:http';

const CHILD_DELAY_MS = 1500;
const MARK = '[You are agent ';

export const FILE_PROMPT = 'Scripted: write the notes file.';
export const FILE_PATH = 'scripted-notes.txt';
// Not ASCII throughout, so a size counted in characters rather than bytes
// shows.
export const FILE_CONTENT = 'Notes from the scripted model: café, naïve, 3 µs.\n';
export const FILE_ANSWER = 'The notes file is written.';
export const LONG_PROMPT = 'Scripted: write a long answer slowly.';
export const LONG_ANSWER = Array.from({ length: 600 }, (_, i) => `word${i + 1}`).join(' ');
const LONG_WORD_MS = 100;
export const RELOAD_PROMPT = 'Scripted: write a medium answer slowly.';
export const RELOAD_ANSWER = Array.from({ length: 80 }, (_, i) => `part${i + 1}`).join(' ');

export const PDF_PROMPT = 'Summarize the attached statement.';
export const PDF_NAME = 'statement.pdf';
export const PDF_COMMAND = `pdftotext attachments/${PDF_NAME} -`;
export const PDF_ANSWER = 'The attached statement reads:';

// Long answers begun and those whose caller left before their end.
export const longAnswers = { begun: 0, abandoned: 0 };
// The latest user message of each PDF_PROMPT request, as text.
export const attachedPrompts = [];

const sleep = (ms) => new Promise((done) => setTimeout(done, ms));

function text(message) {
  if (typeof message.content === 'string') return message.content;
  if (Array.isArray(message.content)) return message.content.map((part) => part.text ?? '').join('');
  return '';
}

// The agent a request is for, and how many answers it has given so far.
function whoAndRound(messages) {
  const first = messages.find((m) => m.role === 'user' && text(m).includes(MARK));
  const agent = first ? text(first).split(MARK)[1].split(/[\s,\]]/)[0] : '/root';
  const round = messages.filter((m) => m.role === 'assistant').length;
  return { agent, round };
}

function call(id, name, args) {
  return { id, type: 'function', function: { name, arguments: JSON.stringify(args) } };
}

// The root agent's turn for FILE_PROMPT: the call, then an answer that
// repeats the tool's result unless it says the file was written.
function writeFile(messages, tools) {
  const offered = (tools ?? []).some((tool) => tool.function?.name === 'write_file');
  if (!offered) return { text: 'write_file was not offered: the server runs without --code-exec.' };
  const asked = messages.findLastIndex((m) => m.role === 'user');
  const since = messages.slice(asked + 1);
  if (!since.some((m) => m.role === 'assistant')) {
    return { calls: [call('call_write_notes', 'write_file', { path: FILE_PATH, content: FILE_CONTENT })] };
  }
  const result = since.filter((m) => m.role === 'tool').map(text).join('\n');
  return { text: result.includes('Wrote ') ? FILE_ANSWER : `write_file failed: ${result}` };
}

// The root agent's turn for PDF_PROMPT: the command, then what it printed
// (its result less the lines in brackets, which report the exit status).
function readPdf(messages, tools) {
  const offered = (tools ?? []).some((tool) => tool.function?.name === 'shell');
  if (!offered) return { text: 'shell was not offered: the server runs without --code-exec.' };
  const asked = messages.findLastIndex((m) => m.role === 'user');
  attachedPrompts.push(text(messages[asked]));
  const since = messages.slice(asked + 1);
  if (!since.some((m) => m.role === 'assistant')) {
    return { calls: [call('call_read_pdf', 'shell', { command: PDF_COMMAND })] };
  }
  const result = since.filter((m) => m.role === 'tool').map(text).join('\n');
  const printed = result.split('\n').map((line) => line.trim()).filter((line) => line && !/^\[.*\]$/.test(line)).join(' ');
  return { text: `${PDF_ANSWER} ${printed || result}` };
}

// What the agent says next: tool calls, a text answer, or a slow one.
function next(request) {
  const messages = request.messages ?? [];
  const { agent, round } = whoAndRound(messages);
  if (agent === '/root') {
    const asked = text(messages.findLast((m) => m.role === 'user') ?? {});
    if (asked.includes(FILE_PROMPT)) return writeFile(messages, request.tools);
    if (asked.includes(LONG_PROMPT)) return { slow: LONG_ANSWER };
    if (asked.includes(RELOAD_PROMPT)) return { slow: RELOAD_ANSWER };
    if (asked.includes(PDF_PROMPT)) return readPdf(messages, request.tools);
  }
  if (agent !== '/root') {
    if (round === 0) return { calls: [call(`call_${agent}_list`, 'skills_list', {})], delay: CHILD_DELAY_MS };
    return { text: `Report of ${agent}: the skills are listed.`, delay: CHILD_DELAY_MS };
  }
  if (round === 0) {
    return {
      calls: [
        call('call_spawn_1', 'spawn_agent', { message: 'List the skills you can use.', role: 'lister' }),
        call('call_spawn_2', 'spawn_agent', { message: 'List the skills too, and report.', role: 'checker' }),
      ],
    };
  }
  const results = messages.filter((m) => m.role === 'tool').map(text).join('\n');
  if (results.includes('Report of /root/1') && results.includes('Report of /root/2')) {
    return { text: 'Both helpers reported: the skills are listed.' };
  }
  return { calls: [call(`call_wait_${round}`, 'wait_agent', { timeout_ms: 60000 })] };
}

function chunk(res, body) {
  res.write(`data: ${JSON.stringify(body)}\n\n`);
}

// Streams `words` one every LONG_WORD_MS; false when the caller left first,
// and then nothing more is written.
async function slowly(res, base, words) {
  longAnswers.begun += 1;
  let left = false;
  res.once('close', () => {
    left = !res.writableFinished;
  });
  for (const word of words.split(/(?<= )/)) {
    if (left || res.destroyed) {
      longAnswers.abandoned += 1;
      return false;
    }
    chunk(res, { ...base, choices: [{ index: 0, delta: { content: word }, finish_reason: null }] });
    await sleep(LONG_WORD_MS);
  }
  return true;
}

async function answer(req, res) {
  let raw = '';
  for await (const piece of req) raw += piece;
  const request = JSON.parse(raw);
  const step = next(request);
  if (step.delay) await sleep(step.delay);
  const base = { id: 'chatcmpl-scripted', object: 'chat.completion.chunk', created: 0, model: 'scripted-agents' };
  res.writeHead(200, { 'Content-Type': 'text/event-stream' });
  if (step.slow) {
    if (!(await slowly(res, base, step.slow))) return;
    chunk(res, { ...base, choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] });
  } else if (step.calls) {
    const pieces = step.calls.map((c, index) => ({ index, ...c }));
    chunk(res, { ...base, choices: [{ index: 0, delta: { role: 'assistant', tool_calls: pieces }, finish_reason: null }] });
    chunk(res, { ...base, choices: [{ index: 0, delta: {}, finish_reason: 'tool_calls' }] });
  } else {
    for (const word of step.text.split(/(?<= )/)) {
      chunk(res, { ...base, choices: [{ index: 0, delta: { content: word }, finish_reason: null }] });
    }
    chunk(res, { ...base, choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] });
  }
  chunk(res, { ...base, choices: [], usage: { prompt_tokens: 100, completion_tokens: 10, total_tokens: 110 } });
  res.end('data: [DONE]\n\n');
}

// Starts the scripted upstream; resolves to { url, close }.
export function startScriptedUpstream() {
  const server = createServer((req, res) => {
    if (req.method === 'GET' && req.url === '/v1/models') {
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ object: 'list', data: [{ id: 'scripted-agents', object: 'model' }] }));
    } else if (req.method === 'POST' && req.url === '/v1/chat/completions') {
      answer(req, res).catch((error) => {
        res.writeHead(500);
        res.end(String(error));
      });
    } else {
      res.writeHead(404);
      res.end();
    }
  });
  return new Promise((started) => {
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      started({ url: `http://127.0.0.1:${port}`, close: () => new Promise((done) => server.close(done)) });
    });
  });
}

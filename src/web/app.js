// The skillhost Web UI: a chat view that streams POST /api/chat and an
// operators' view that manages skills through /api/skills. No framework and
// no build step. Text from the model, from skill files and from the server
// reaches the page only as text nodes (see markdown.js for model output).

import { render } from './markdown.js';

const $ = (id) => document.getElementById(id);

// Everything the chat view remembers between turns.
const chat = {
  // Messages sent with every turn. The server keeps a copy with each
  // conversation, which is where a reloaded page gets them back from.
  history: [],
  // The id the server issued (the first frame of a turn names it), sent
  // back with the next turn and kept in sessionStorage, so a reload opens
  // the same conversation.
  conversationId: null,
  // The AbortController of the turn that is running, or null.
  controller: null,
  // Bumped by every new conversation, so that a turn stopped by one does not
  // write its answer into the next.
  epoch: 0,
  // The server's models (GET /api/models), the default first.
  models: [],
  // Whether the server has skills at all (GET /api/models says null if not).
  skillsEnabled: false,
  // The running turn's child agents by id: { state, detail }.
  agents: new Map(),
  // Files for the next message, in the order they were added, each
  // uploaded as soon as it is attached: { key, name, bytes, state
  // ('uploading', 'ready' or 'failed'), id, error, controller, node }.
  attachments: [],
  // Numbers the attachments, so a chip's button names one.
  attachmentKeys: 0,
  // dragenter events not yet matched by a dragleave: a drag over the
  // view's children fires both on each of them.
  dragDepth: 0,
};

// Most files one message may carry; the server refuses more.
const MAX_ATTACHMENTS = 20;
// What GET /v1/files/{id} said of each file a chip in the history names,
// by id: a promise of { bytes } or { missing: true }. The page asks once
// per file; the sizes of files it uploaded itself are known at once.
const fileLookups = new Map();

// Who the page is signed in as. The key lives in sessionStorage (gone with
// the tab) and travels only in the Authorization header: never in a cookie
// (which any page could make the browser send) and never in a URL (which
// ends up in logs and history).
const KEY_STORAGE = 'skillhost.key';
// The conversation the tab has open: a reload opens it again; another tab
// starts with a new chat and picks any conversation from the list.
const CONVERSATION_STORAGE = 'skillhost.conversation';
// How often a turn whose connection dropped tries to read its frames again
// before the page gives up on it (the turn itself runs on in the server).
const REATTACH_TRIES = 5;
const auth = {
  key: sessionStorage.getItem(KEY_STORAGE),
  // 'admin', 'user' or null (GET /api/whoami).
  role: null,
  required: false,
  adminKeys: false,
};

// What the skills view last loaded.
const operator = {
  listing: { enabled: true, installable: true, skills: [], errors: [] },
  skills: new Map(),
  // Bumped per file request, so a slow response cannot replace a newer one.
  fileRequest: 0,
};

// ---------------------------------------------------------------------------
// Small helpers

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// Server errors are lower-case clauses ("a skill named 'x' is already
// installed; ..."); the page shows each as one sentence.
function sentence(text) {
  const trimmed = String(text ?? '').trim();
  if (!trimmed) return 'Something went wrong.';
  const capital = trimmed[0].toUpperCase() + trimmed.slice(1);
  return /[.!?]$/.test(capital) ? capital : `${capital}.`;
}

async function errorFrom(response) {
  let message = '';
  try {
    const body = await response.json();
    message = typeof body.error === 'string' ? body.error : body.error?.message ?? '';
  } catch {
    message = '';
  }
  return sentence(message || `the server answered ${response.status} ${response.statusText}`);
}

function withKey(options = {}) {
  if (!auth.key) return options;
  return { ...options, headers: { ...(options.headers ?? {}), Authorization: `Bearer ${auth.key}` } };
}

async function request(url, options) {
  let response;
  try {
    response = await fetch(url, withKey(options));
  } catch {
    throw new Error('The server could not be reached.');
  }
  if (response.status === 401) showSignIn('This server needs a key. Sign in to continue.');
  if (!response.ok) {
    // The body may carry more than the sentence (a refused skill's findings).
    const details = await response.clone().json().catch(() => null);
    const error = new Error(await errorFrom(response));
    error.status = response.status;
    error.details = details;
    throw error;
  }
  return response;
}

async function fetchJson(url, options) {
  return (await request(url, options)).json();
}

// A plain link cannot send the key: with one, fetch the file and hand the
// browser a local copy to save.
async function downloadWithKey(event) {
  if (!auth.key) return;
  event.preventDefault();
  const link = event.currentTarget;
  try {
    const blob = await (await request(link.getAttribute('href'))).blob();
    const local = document.createElement('a');
    local.href = URL.createObjectURL(blob);
    local.download = link.download || 'file';
    local.click();
    setTimeout(() => URL.revokeObjectURL(local.href), 60_000);
  } catch (error) {
    window.alert(error.message);
  }
}

// ---------------------------------------------------------------------------
// Signing in

async function refreshAuth() {
  try {
    const response = await fetch('/api/whoami', withKey());
    const who = await response.json();
    auth.required = Boolean(who.keys_required);
    auth.adminKeys = Boolean(who.admin_keys);
    auth.role = who.role ?? null;
  } catch {
    auth.role = null;
  }
  document.body.classList.toggle('is-admin', auth.role === 'admin');
  $('sign-out').hidden = !auth.key;
  // With admin keys only, chat needs no key; the skills page offers a way in.
  $('admin-sign-in').hidden = !(auth.adminKeys && auth.role !== 'admin');
  return auth.role;
}

function showSignIn(message) {
  $('sign-in-message').textContent = message;
  $('sign-in').hidden = false;
  $('sign-in-key').focus();
}

async function signIn(event) {
  event.preventDefault();
  const key = $('sign-in-key').value.trim();
  if (!key) return;
  auth.key = key;
  const role = await refreshAuth();
  // Where chat needs no key, only an admin key means anything.
  if (!role || (!auth.required && role !== 'admin')) {
    auth.key = null;
    await refreshAuth();
    $('sign-in-message').textContent = 'That key is not valid here.';
    return;
  }
  sessionStorage.setItem(KEY_STORAGE, key);
  $('sign-in-key').value = '';
  $('sign-in').hidden = true;
  loadModels().then(restoreConversations);
  if (location.hash === '#skills') loadSkills();
}

function signOut() {
  sessionStorage.removeItem(KEY_STORAGE);
  auth.key = null;
  refreshAuth().then((role) => {
    if (auth.required && !role) showSignIn('Signed out. Sign in with a key to continue.');
  });
}

function setStatus(node, text, kind) {
  node.textContent = text;
  node.classList.toggle('error', kind === 'error');
  node.classList.toggle('ok', kind === 'ok');
}

function formatBytes(bytes) {
  if (!Number.isFinite(bytes)) return '';
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KB`;
  return `${(bytes / 1024 / 1024).toFixed(1)} MB`;
}

function skillPath(id, path) {
  const encoded = path.split('/').map(encodeURIComponent).join('/');
  return `/api/skills/${encodeURIComponent(id)}/files/${encoded}`;
}

// ---------------------------------------------------------------------------
// Views

function showView() {
  const skills = location.hash === '#skills';
  $('chat-view').hidden = skills;
  $('skills-view').hidden = !skills;
  for (const [id, active] of [['nav-chat', !skills], ['nav-skills', skills]]) {
    if (active) $(id).setAttribute('aria-current', 'page');
    else $(id).removeAttribute('aria-current');
  }
  if (skills) loadSkills();
  else $('prompt').focus();
}

async function loadModels() {
  let models;
  try {
    models = await fetchJson('/api/models');
  } catch (error) {
    $('model-info').textContent = error.message;
    // 503 means the model is still loading: ask again shortly.
    if (error.status === 503) setTimeout(loadModels, 2000);
    return;
  }
  chat.models = models.data ?? [];
  // With several models, a picker: each turn runs on the one it shows
  // (the default, listed first, until the user picks another).
  const picker = $('model-picker');
  if (chat.models.length > 1) {
    const before = picker.value;
    picker.replaceChildren(...chat.models.map((model) => new Option(model.id, model.id)));
    if (chat.models.some((model) => model.id === before)) picker.value = before;
    picker.hidden = false;
  }
  showModel();
  // null means this server has no skills: no picker at all, not an empty one.
  chat.skillsEnabled = Boolean(models.skills);
  if (!chat.skillsEnabled) return;
  try {
    renderPicker((await fetchJson('/api/skills')).skills ?? []);
  } catch (error) {
    $('skill-options').replaceChildren(el('span', 'error-text', error.message));
    $('skill-picker').hidden = false;
  }
}

// After a turn: whether the chosen model is loaded now, and its context.
async function refreshModels() {
  if ($('model-picker').hidden) return;
  try {
    chat.models = (await fetchJson('/api/models')).data ?? chat.models;
    showModel();
  } catch {
    // The header keeps what it showed.
  }
}

// The header's line for the chosen model: its name, and its context once
// it is loaded (one not loaded yet loads with the next turn).
function showModel() {
  const picker = $('model-picker');
  const model = chat.models.find((m) => !picker.hidden && m.id === picker.value) ?? chat.models[0];
  const context = Number.isFinite(model?.context_length)
    ? ` · ${model.context_length.toLocaleString('en')} tokens of context`
    : model && model.loaded === false ? ' · loads with the next turn' : '';
  $('model-info').textContent = model ? `${model.id}${context}` : 'No model is loaded.';
}

// ---------------------------------------------------------------------------
// Skill picker

function selectedSkills() {
  return [...$('skill-options').querySelectorAll('input:checked')].map((box) => box.value);
}

function renderPicker(skills) {
  if (!chat.skillsEnabled) return;
  const before = selectedSkills();
  const options = $('skill-options');
  options.replaceChildren();
  // A skill whose SKILL.md says user-invocable: false is the model's to use,
  // not the user's to pick.
  const offered = skills.filter((skill) => skill.user_invocable !== false);
  if (offered.length === 0) options.append(el('span', 'empty', 'No skills are registered.'));
  for (const skill of offered) {
    const label = el('label', 'toggle');
    label.title = skill.description ?? '';
    const box = document.createElement('input');
    box.type = 'checkbox';
    box.value = skill.id;
    box.dataset.skill = skill.id;
    box.checked = before.includes(skill.id);
    label.append(box, ` ${skill.id}`);
    options.append(label);
  }
  $('skill-picker').hidden = false;
  // A selected skill that is gone changes what the model sees.
  if (selectedSkills().length !== before.length) newConversation();
}

// ---------------------------------------------------------------------------
// Chat

// A new, empty conversation. The one that was open stays on the server
// (its turn, if one runs, goes on) and in the list.
function newConversation() {
  detachTurn();
  chat.epoch += 1;
  setConversation(null);
  chat.history = [];
  $('messages').replaceChildren($('empty-chat'));
  $('empty-chat').hidden = false;
  clearActivity();
  loadConversations();
}

function setConversation(id) {
  chat.conversationId = id;
  if (id) sessionStorage.setItem(CONVERSATION_STORAGE, id);
  else sessionStorage.removeItem(CONVERSATION_STORAGE);
  $('delete-chat').hidden = !id;
  $('conversation-list').value = id ?? '';
}

function conversationPath(id, rest = '') {
  return `/api/conversations/${encodeURIComponent(id)}${rest}`;
}

// Stops reading the running turn's frames without stopping the turn.
function detachTurn() {
  if (chat.controller) {
    chat.controller.detached = true;
    chat.controller.abort();
  }
}

// Stop: the server ends the turn (keeping what it said); the page stops
// reading at once.
function stopTurn() {
  if (!chat.controller) return;
  if (chat.conversationId) {
    fetch(conversationPath(chat.conversationId, '/turn'), withKey({ method: 'DELETE' })).catch(() => {});
  }
  chat.controller.abort();
}

// The conversation picker: the caller's conversations, the most recent first.
async function loadConversations() {
  let listing;
  try {
    listing = await fetchJson('/api/conversations');
  } catch {
    return;
  }
  const list = $('conversation-list');
  const options = [new Option('New chat', '')];
  for (const conversation of listing.data ?? []) {
    const option = new Option(conversation.running ? `${conversation.title} (running)` : conversation.title, conversation.id);
    options.push(option);
  }
  list.replaceChildren(...options);
  list.value = chat.conversationId ?? '';
  list.hidden = options.length === 1;
}

// Opens a stored conversation: its messages, its skills, and its running
// turn, whose frames the page reads from the first.
async function openConversation(id) {
  if (!id) {
    newConversation();
    return;
  }
  let stored;
  try {
    stored = await fetchJson(conversationPath(id));
  } catch (error) {
    if (error.status === 404 && id === sessionStorage.getItem(CONVERSATION_STORAGE)) setConversation(null);
    return;
  }
  detachTurn();
  chat.epoch += 1;
  clearActivity();
  setConversation(id);
  $('messages').replaceChildren($('empty-chat'));
  $('empty-chat').hidden = true;
  for (const box of $('skill-options').querySelectorAll('input[type=checkbox]')) {
    box.checked = (stored.skills ?? []).includes(box.value);
  }
  if (typeof stored.skills_discovery === 'boolean') $('discovery').checked = stored.skills_discovery;
  // The model its last turn ran on, when the server still offers it.
  if (chat.models.some((model) => model.id === stored.model)) {
    $('model-picker').value = stored.model;
    showModel();
  }
  const messages = stored.messages ?? [];
  chat.history = historyOf(messages, stored.running);
  for (const message of messages) {
    if (message.role === 'user') appendUserMessage(message.content);
    else if (message.role === 'assistant') showStoredAnswer(message);
  }
  $('empty-chat').hidden = messages.length > 0;
  if (stored.running) followTurn(chat.epoch, appendAssistantMessage(), 0);
}

// What the next turn sends: the stored messages, less the turns that
// ended with no text (so two user messages never follow each other) and
// the running turn's own message (its answer joins the history when it ends).
function historyOf(messages, running) {
  const history = [];
  for (const message of messages) {
    if (message.role === 'assistant' && !message.content) history.pop();
    else history.push({ role: message.role, content: message.content ?? '' });
  }
  if (running && history.at(-1)?.role === 'user') chat.pendingUser = history.pop();
  else chat.pendingUser = null;
  return history;
}

function showStoredAnswer(message) {
  const view = appendAssistantMessage();
  view.setContent(textOf(message.content));
  if (message.reasoning) view.setReasoning(message.reasoning);
  view.addArtifacts(message.artifacts);
  if (message.error) view.fail(sentence(message.error));
  else if (message.note === 'stopped') view.stop();
  else if (message.note) view.fail(sentence(message.note));
  else view.finish(message);
}

function setRunning(controller) {
  chat.controller = controller;
  updateSend();
  $('stop').hidden = !controller;
}

// Send waits for a running turn to end and for every upload to finish.
function updateSend() {
  $('send').disabled = Boolean(chat.controller) || uploading();
}

function showActivity(text) {
  const activity = $('activity');
  activity.textContent = text;
  activity.hidden = !text;
}

function clearActivity() {
  showActivity('');
  chat.agents.clear();
  renderAgents();
}

// The child agents of the running turn, each with its state and latest
// step; the panel lists them while the turn runs.
function renderAgents() {
  const list = $('agents');
  list.replaceChildren(
    ...[...chat.agents].map(([id, agent]) => {
      const item = el('li', '', [id, agent.state, agent.detail].filter(Boolean).join(' · '));
      item.dataset.state = agent.state;
      item.dataset.agent = id;
      return item;
    }),
  );
  list.hidden = chat.agents.size === 0;
}

function noteAgent(id, state, detail) {
  if (!id || id === '/root') return;
  const agent = chat.agents.get(id) ?? { state: 'working', detail: '' };
  if (state) agent.state = state;
  if (detail !== undefined) agent.detail = detail;
  chat.agents.set(id, agent);
  renderAgents();
}

// "/root/1 spawned · Read the notes skill."
function describeAgent(agent) {
  return [`${agent.agent_id} ${agent.phase}`, agent.detail].filter(Boolean).join(' · ');
}

// "skills_read notes · SKILL.md", with the agent named when a child made the call.
function describeSkillStep(frame) {
  const agent = frame.agent_id && frame.agent_id !== '/root' ? `${frame.agent_id}: ` : '';
  const parts = [`${agent}${frame.skill_step} ${frame.skill ?? ''}`.trim()];
  if (frame.detail) parts.push(frame.detail);
  if (frame.ok === false) parts.push('failed');
  return parts.join(' · ');
}

// "shell · running · python test.py", with the agent named when a child made the call.
function describeToolProgress(progress) {
  const agent = progress.agent_id && progress.agent_id !== '/root' ? `${progress.agent_id}: ` : '';
  return agent + [progress.tool, progress.phase, progress.detail].filter(Boolean).join(' · ');
}

function isNearBottom() {
  return window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 120;
}

function appendMessage(role) {
  $('empty-chat').hidden = true;
  const article = el('article', `message ${role}`);
  article.setAttribute('aria-label', role === 'user' ? 'You' : 'Assistant');
  const follow = isNearBottom();
  $('messages').append(article);
  if (follow) window.scrollTo(0, document.documentElement.scrollHeight);
  return article;
}

// A user message's content is a string, or an OpenAI part list when it
// carries files: [{type: 'text', text}, {type: 'file', file: {file_id,
// filename}}, …]. The page shows its text and its files as chips.
function appendUserMessage(content) {
  const article = appendMessage('user');
  const text = textOf(content);
  const files = filesOf(content);
  if (text || files.length === 0) article.append(el('div', 'body plain', text));
  if (files.length) {
    const chips = el('div', 'message-files');
    chips.setAttribute('aria-label', 'Attached files');
    chips.append(...files.map(fileChip));
    article.append(chips);
  }
}

// The text of a message's content, whichever form it has.
function textOf(content) {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  return content.filter((part) => part?.type === 'text' && typeof part.text === 'string').map((part) => part.text).join('\n');
}

// The files a message's content names: [{ id, name }].
function filesOf(content) {
  if (!Array.isArray(content)) return [];
  return content
    .filter((part) => part?.type === 'file' && part.file && typeof part.file === 'object')
    .map((part) => ({
      id: typeof part.file.file_id === 'string' ? part.file.file_id : null,
      name: typeof part.file.filename === 'string' && part.file.filename ? part.file.filename : 'file',
    }));
}

function filePath(id, rest = '') {
  return `/v1/files/${encodeURIComponent(id)}${rest}`;
}

// A file of a sent message: a chip that downloads it (with the key, when
// the page has one), with its size once known.
function fileChip(file) {
  const chip = el(file.id ? 'a' : 'span', 'artifact file-chip');
  chip.append(el('span', 'file-chip-name', file.name));
  const size = el('span', 'artifact-size');
  chip.append(size);
  if (!file.id) return chip;
  chip.href = filePath(file.id, '/content');
  chip.download = file.name;
  chip.dataset.fileId = file.id;
  chip.title = `Download ${file.name}`;
  chip.addEventListener('click', downloadWithKey);
  lookUpFile(file.id).then((found) => {
    if (found.missing) {
      chip.dataset.missing = 'true';
      chip.title = `${file.name} is no longer on the server`;
    } else {
      size.textContent = formatBytes(found.bytes);
    }
  });
  return chip;
}

function lookUpFile(id) {
  if (!fileLookups.has(id)) {
    const found = fetchJson(filePath(id)).then(
      (file) => ({ bytes: file.bytes }),
      (error) => {
        if (error.status === 404) return { missing: true };
        // A server that could not be reached may answer the next time.
        fileLookups.delete(id);
        return {};
      },
    );
    fileLookups.set(id, found);
  }
  return fileLookups.get(id);
}

// The assistant's message, updated as frames arrive. Markdown is rendered
// at most once per animation frame: re-rendering on every delta of a fast
// model would do the same work many times between two paints.
function appendAssistantMessage() {
  const article = appendMessage('assistant');
  article.dataset.state = 'running';
  const reasoning = el('details', 'reasoning');
  reasoning.hidden = true;
  reasoning.append(el('summary', '', 'Reasoning'));
  const reasoningText = el('div', 'reasoning-text');
  reasoning.append(reasoningText);
  const body = el('div', 'body');
  const error = el('p', 'error-text');
  error.hidden = true;
  const artifacts = el('div', 'artifacts');
  artifacts.hidden = true;
  const meta = el('p', 'meta');
  article.append(reasoning, body, error, artifacts, meta);

  const seenArtifacts = new Set();
  let pending = null;
  let frameRequested = false;

  const flush = () => {
    frameRequested = false;
    if (pending === null) return;
    const follow = isNearBottom();
    body.replaceChildren(render(pending));
    pending = null;
    if (follow) window.scrollTo(0, document.documentElement.scrollHeight);
  };

  const end = (state, note) => {
    flush();
    article.dataset.state = state;
    if (note) meta.textContent = meta.textContent ? `${note} · ${meta.textContent}` : note;
  };

  return {
    setContent(text) {
      pending = text;
      if (!frameRequested) {
        frameRequested = true;
        requestAnimationFrame(flush);
      }
    },
    setReasoning(text) {
      reasoning.hidden = false;
      reasoningText.textContent = text;
    },
    addArtifacts(files) {
      for (const file of files ?? []) {
        if (!file?.url || seenArtifacts.has(file.url)) continue;
        // Only the server's own download routes, never a URL from elsewhere.
        const url = new URL(file.url, location.href);
        if (url.origin !== location.origin) continue;
        seenArtifacts.add(file.url);
        const chip = el('a', 'artifact');
        chip.href = url.pathname + url.search;
        const name = String(file.path ?? '').split('/').pop() || 'file';
        chip.download = name;
        chip.addEventListener('click', downloadWithKey);
        chip.textContent = file.path ?? name;
        if (Number.isFinite(file.bytes)) chip.append(el('span', 'artifact-size', formatBytes(file.bytes)));
        artifacts.append(chip);
        artifacts.hidden = false;
      }
    },
    finish(frame) {
      const parts = [];
      const usage = frame.usage ?? {};
      const timings = frame.timings ?? {};
      if (Number.isFinite(usage.completion_tokens)) parts.push(`${usage.completion_tokens} tokens`);
      let perSecond = timings.predicted_per_second;
      if (!Number.isFinite(perSecond) && timings.predicted_ms > 0) {
        perSecond = (timings.predicted_n * 1000) / timings.predicted_ms;
      }
      if (Number.isFinite(perSecond)) parts.push(`${perSecond.toFixed(1)} tokens/s`);
      if (frame.finish_reason === 'length') parts.push('cut off at the token limit');
      meta.textContent = parts.join(' · ');
      end('done');
    },
    stop() {
      end('stopped', 'Stopped');
    },
    fail(message) {
      error.textContent = message;
      error.hidden = false;
      end('error');
    },
  };
}

function requestBody() {
  const body = { messages: chat.history.map(({ role, content }) => ({ role, content })) };
  if (!$('model-picker').hidden) body.model = $('model-picker').value;
  if (chat.skillsEnabled) {
    const skills = selectedSkills();
    if (skills.length) body.skills = skills;
    body.skills_discovery = $('discovery').checked;
  }
  const maxTokens = Number.parseInt($('max-tokens').value, 10);
  if (Number.isFinite(maxTokens) && maxTokens > 0) body.maxTokens = maxTokens;
  const temperature = Number.parseFloat($('temperature').value);
  if (Number.isFinite(temperature)) body.temperature = temperature;
  if (chat.conversationId) body.conversationId = chat.conversationId;
  return body;
}

// Server-sent events over fetch (EventSource cannot POST). Frames are an
// "id:" line and "data:" lines ended by a blank line; lines starting with
// ":" are keep-alive comments. `seen.id` follows the last frame's id, from
// which a dropped connection reads on.
async function* readFrames(stream, seen) {
  const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  let data = [];
  const take = () => {
    const text = data.join('\n');
    data = [];
    if (text === '[DONE]') return null;
    try {
      return JSON.parse(text);
    } catch {
      return null;
    }
  };
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let newline = buffer.indexOf('\n');
      while (newline >= 0) {
        const line = buffer.slice(0, newline).replace(/\r$/, '');
        buffer = buffer.slice(newline + 1);
        newline = buffer.indexOf('\n');
        if (line === '') {
          const frame = data.length ? take() : null;
          if (frame) yield frame;
        } else if (line.startsWith('data:')) {
          data.push(line.slice(line[5] === ' ' ? 6 : 5));
        } else if (line.startsWith('id:')) {
          const id = Number.parseInt(line.slice(3), 10);
          if (Number.isFinite(id)) seen.id = id;
        }
      }
    }
    if (buffer.startsWith('data:')) data.push(buffer.slice(buffer[5] === ' ' ? 6 : 5));
    const last = data.length ? take() : null;
    if (last) yield last;
  } finally {
    reader.cancel().catch(() => {});
  }
}

// A model loading for this turn: `{model, progress, waited_ms}`.
function describeLoading(loading) {
  const percent = loading.progress > 0 ? ` ${Math.floor(loading.progress * 100)}%` : '';
  return `Loading ${loading.model}${percent}…`;
}

// Applies one frame; returns true when it ends the turn.
function applyFrame(frame, turn, view) {
  if (frame.loading) {
    showActivity(describeLoading(frame.loading));
    turn.loading = true;
    return false;
  }
  if (turn.loading) {
    turn.loading = false;
    showActivity('');
  }
  if (typeof frame.content === 'string') {
    turn.content += frame.content;
    view.setContent(turn.content);
  }
  if (typeof frame.reasoning === 'string') {
    turn.reasoning += frame.reasoning;
    view.setReasoning(turn.reasoning);
  }
  if (frame.skill_step) {
    showActivity(describeSkillStep(frame));
    noteAgent(frame.agent_id, 'working', [frame.skill_step, frame.skill].filter(Boolean).join(' '));
  }
  if (frame.agent) {
    showActivity(describeAgent(frame.agent));
    const state = frame.agent.phase === 'spawned' ? 'working' : frame.agent.phase;
    noteAgent(frame.agent.agent_id, state, frame.agent.detail);
  }
  if (frame.tool_progress) {
    showActivity(describeToolProgress(frame.tool_progress));
    const { agent_id: agentId, tool, detail } = frame.tool_progress;
    noteAgent(agentId, 'working', [tool, detail].filter(Boolean).join(' '));
    if (frame.tool_progress.phase === 'finished') view.addArtifacts(frame.tool_progress.files);
  }
  if (typeof frame.conversationId === 'string' && !frame.done) {
    turn.conversationId = frame.conversationId;
    if (turn.epoch === chat.epoch && chat.conversationId !== frame.conversationId) {
      setConversation(frame.conversationId);
      loadConversations();
    }
  }
  if (frame.error) {
    view.fail(sentence(typeof frame.error === 'string' ? frame.error : frame.error.message));
    turn.ended = true;
    return true;
  }
  if (frame.stopped) {
    if (frame.note && frame.note !== 'stopped') view.fail(sentence(frame.note));
    else view.stop();
    turn.ended = true;
    return true;
  }
  if (frame.done) {
    turn.ended = true;
    turn.answered = true;
    turn.conversationId = frame.conversationId ?? turn.conversationId;
    view.finish(frame);
    return true;
  }
  return false;
}

// Reads a turn's frames from `response`, and when the connection drops
// before the end (lost network, a server restart in between) reads on
// from the last frame seen. Returns the turn's state.
async function readTurn(response, turn, view, controller) {
  const seen = { id: turn.after ?? 0 };
  let tries = 0;
  for (;;) {
    try {
      for await (const frame of readFrames(response.body, seen)) {
        if (applyFrame(frame, turn, view)) return turn;
      }
    } catch (error) {
      if (controller.signal.aborted) throw error;
    }
    if (turn.ended || !turn.conversationId || tries >= REATTACH_TRIES) break;
    tries += 1;
    await new Promise((resolve) => setTimeout(resolve, 500 * tries));
    if (controller.signal.aborted) throw new DOMException('stopped', 'AbortError');
    try {
      response = await request(conversationPath(turn.conversationId, `/events?after=${seen.id}`), { signal: controller.signal });
    } catch (error) {
      if (controller.signal.aborted) throw error;
      if (error.status === 404) break;
    }
  }
  if (!turn.ended) view.fail('The connection closed before the answer was complete.');
  return turn;
}

// Runs one turn into `view`: `open(signal)` makes the response whose
// frames come first, and `settle()` puts the turn into the history once it
// ended, unless the page moved to another conversation meanwhile.
async function runTurn(turn, view, open, settle) {
  const controller = new AbortController();
  setRunning(controller);
  try {
    await readTurn(await open(controller.signal), turn, view, controller);
  } catch (error) {
    if (controller.signal.aborted && !controller.detached) view.stop();
    else if (!controller.signal.aborted) view.fail(error.message);
  } finally {
    if (chat.controller === controller) {
      clearActivity();
      setRunning(null);
    }
    if (turn.epoch === chat.epoch) {
      settle();
      loadConversations();
    }
  }
}

// Reads the running turn of a conversation the page opened (a reload, a
// second tab) from the frame after `after`.
function followTurn(epoch, view, after) {
  const turn = { content: '', reasoning: '', ended: false, conversationId: chat.conversationId, epoch, after };
  const open = (signal) => request(conversationPath(chat.conversationId, `/events?after=${after}`), { signal });
  return runTurn(turn, view, open, () => {
    const user = chat.pendingUser;
    chat.pendingUser = null;
    if (turn.content && user) chat.history.push(user, { role: 'assistant', content: turn.content });
  });
}

function sendPrompt() {
  const prompt = $('prompt');
  const text = prompt.value;
  if (chat.controller) return;
  if (uploading()) {
    setStatus($('attach-status'), STILL_UPLOADING);
    return;
  }
  const files = chat.attachments.filter((attachment) => attachment.state === 'ready');
  if (!text.trim() && files.length === 0) return;
  prompt.value = '';
  fitPrompt();
  // A failed upload was never sent; it leaves the tray with the rest.
  clearAttachments();
  const content = files.length === 0 ? text : [
    ...(text.trim() ? [{ type: 'text', text }] : []),
    ...files.map((file) => ({ type: 'file', file: { file_id: file.id, filename: file.name } })),
  ];
  chat.history.push({ role: 'user', content });
  appendUserMessage(content);
  const view = appendAssistantMessage();
  const turn = { content: '', reasoning: '', ended: false, conversationId: null, epoch: chat.epoch };
  const body = JSON.stringify(requestBody());
  const open = (signal) => request('/api/chat', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body, signal });
  return runTurn(turn, view, open, () => {
    // A turn that produced no text is dropped from the history, so the
    // next request does not carry two user messages in a row.
    if (turn.content) chat.history.push({ role: 'assistant', content: turn.content });
    else chat.history.pop();
    refreshModels();
  });
}

// After a (re)load: the list, and the conversation this tab had open.
function restoreConversations() {
  loadConversations();
  const open = sessionStorage.getItem(CONVERSATION_STORAGE);
  if (open && open !== chat.conversationId) openConversation(open);
}

async function deleteConversation() {
  const id = chat.conversationId;
  if (!id || !window.confirm('Delete this conversation, its messages and its files?')) return;
  try {
    await fetchJson(conversationPath(id), { method: 'DELETE' });
  } catch (error) {
    window.alert(error.message);
    return;
  }
  newConversation();
}

function fitPrompt() {
  const prompt = $('prompt');
  prompt.style.height = 'auto';
  prompt.style.height = `${Math.min(prompt.scrollHeight + 2, 240)}px`;
}

// ---------------------------------------------------------------------------
// Attachments: files for the next message, from the paperclip button, a
// drop on the chat view or a paste into the prompt, each uploaded to
// /v1/files as soon as it is attached.

const STILL_UPLOADING = 'The files are still uploading; send once they are done.';

function uploading() {
  return chat.attachments.some((attachment) => attachment.state === 'uploading');
}

function attachFiles(fileList) {
  const files = [...(fileList ?? [])];
  if (files.length === 0) return;
  const counted = chat.attachments.filter((attachment) => attachment.state !== 'failed').length;
  const taken = files.slice(0, Math.max(0, MAX_ATTACHMENTS - counted));
  const left = files.length - taken.length;
  if (left > 0) {
    const which = left === 1 ? '1 file was' : `${left} files were`;
    setStatus($('attach-status'), `A message carries at most ${MAX_ATTACHMENTS} files; ${which} not attached.`, 'error');
  } else {
    setStatus($('attach-status'), '');
  }
  for (const file of taken) uploadAttachment(file);
}

async function uploadAttachment(file) {
  chat.attachmentKeys += 1;
  const attachment = {
    key: String(chat.attachmentKeys),
    name: file.name || 'file',
    bytes: file.size,
    state: 'uploading',
    id: null,
    error: '',
    controller: new AbortController(),
    node: null,
  };
  chat.attachments.push(attachment);
  attachment.node = attachmentChip(attachment);
  $('attachments').append(attachment.node);
  showAttachment(attachment);
  const form = new FormData();
  form.append('purpose', 'user_data');
  form.append('file', file, attachment.name);
  const { signal } = attachment.controller;
  try {
    const uploaded = await fetchJson('/v1/files', { method: 'POST', body: form, signal });
    attachment.id = uploaded.id;
    // The server's name is the one the model sees (under attachments/).
    attachment.name = uploaded.filename || attachment.name;
    if (Number.isFinite(uploaded.bytes)) attachment.bytes = uploaded.bytes;
    attachment.state = 'ready';
  } catch (error) {
    attachment.state = 'failed';
    attachment.error = error.message;
  }
  attachment.controller = null;
  // Removed while it uploaded: its chip is gone, and so goes the file if
  // the upload got through anyway.
  if (signal.aborted) {
    if (attachment.id) request(filePath(attachment.id), { method: 'DELETE' }).catch(() => {});
    return;
  }
  if (attachment.id) fileLookups.set(attachment.id, Promise.resolve({ bytes: attachment.bytes }));
  showAttachment(attachment);
}

// A chip of the tray above the prompt; showAttachment fills it in.
function attachmentChip(attachment) {
  const item = el('li', 'attachment');
  item.dataset.key = attachment.key;
  const about = el('span', 'attachment-about');
  about.append(el('span', 'attachment-name'), el('span', 'attachment-size'));
  const remove = el('button', 'attachment-remove', '×');
  remove.type = 'button';
  remove.dataset.remove = attachment.key;
  item.append(about, el('span', 'attachment-error'), remove);
  return item;
}

function showAttachment(attachment) {
  const item = attachment.node;
  item.dataset.state = attachment.state;
  item.setAttribute('aria-busy', String(attachment.state === 'uploading'));
  item.title = attachment.name;
  item.querySelector('.attachment-name').textContent = attachment.name;
  const size = formatBytes(attachment.bytes);
  item.querySelector('.attachment-size').textContent = attachment.state === 'uploading' ? `${size} · uploading…` : size;
  const error = item.querySelector('.attachment-error');
  error.textContent = attachment.state === 'failed' ? `${attachment.error} It will not be sent.` : '';
  error.hidden = attachment.state !== 'failed';
  item.querySelector('.attachment-remove').setAttribute('aria-label', `Remove ${attachment.name}`);
  $('attachments').hidden = chat.attachments.length === 0;
  if (!uploading() && $('attach-status').textContent === STILL_UPLOADING) setStatus($('attach-status'), '');
  updateSend();
}

// Takes a file out of the tray: its upload stops, and a file already
// uploaded is deleted, since no message names it.
function removeAttachment(key) {
  const index = chat.attachments.findIndex((attachment) => attachment.key === key);
  if (index < 0) return;
  const [attachment] = chat.attachments.splice(index, 1);
  attachment.controller?.abort();
  if (attachment.id) {
    fileLookups.delete(attachment.id);
    request(filePath(attachment.id), { method: 'DELETE' }).catch(() => {});
  }
  attachment.node.remove();
  $('attachments').hidden = chat.attachments.length === 0;
  setStatus($('attach-status'), '');
  updateSend();
  // The next chip's button, or the prompt: focus stays where keys left it.
  const next = chat.attachments[index] ?? chat.attachments[index - 1];
  (next?.node.querySelector('.attachment-remove') ?? $('prompt')).focus();
}

// Empties the tray once its files went with a message.
function clearAttachments() {
  chat.attachments = [];
  $('attachments').replaceChildren();
  $('attachments').hidden = true;
  setStatus($('attach-status'), '');
  updateSend();
}

function draggingFiles(event) {
  return [...(event.dataTransfer?.types ?? [])].includes('Files');
}

function showDropTarget(shown) {
  $('drop-hint').hidden = !shown;
}

function wireAttachments() {
  $('attach').addEventListener('click', () => $('attach-input').click());
  $('attach-input').addEventListener('change', (event) => {
    attachFiles(event.target.files);
    // Choosing the same file again is a change too.
    event.target.value = '';
    $('prompt').focus();
  });
  $('attachments').addEventListener('click', (event) => {
    const button = event.target.closest('button[data-remove]');
    if (button) removeAttachment(button.dataset.remove);
  });
  const view = $('chat-view');
  view.addEventListener('dragenter', (event) => {
    if (!draggingFiles(event)) return;
    event.preventDefault();
    chat.dragDepth += 1;
    showDropTarget(true);
  });
  view.addEventListener('dragover', (event) => {
    if (!draggingFiles(event)) return;
    // Without this the browser would open the file in place of the page.
    event.preventDefault();
    event.dataTransfer.dropEffect = 'copy';
  });
  view.addEventListener('dragleave', (event) => {
    if (!draggingFiles(event)) return;
    chat.dragDepth = Math.max(0, chat.dragDepth - 1);
    if (chat.dragDepth === 0) showDropTarget(false);
  });
  view.addEventListener('drop', (event) => {
    if (!draggingFiles(event)) return;
    event.preventDefault();
    chat.dragDepth = 0;
    showDropTarget(false);
    attachFiles(event.dataTransfer.files);
    $('prompt').focus();
  });
  // Pasted files (a screenshot, a file copied in a file manager) are
  // attached; text that comes with them is pasted as usual.
  $('prompt').addEventListener('paste', (event) => {
    const files = [...(event.clipboardData?.files ?? [])];
    if (files.length === 0) return;
    if (!event.clipboardData.types.includes('text/plain')) event.preventDefault();
    attachFiles(files);
  });
}

// ---------------------------------------------------------------------------
// Skills view

async function loadSkills() {
  setStatus($('skills-status'), 'Loading the skills…');
  try {
    renderSkills(await fetchJson('/api/skills'));
    setStatus($('skills-status'), operator.listing.enabled ? '' : 'Skills are turned off on this server.');
  } catch (error) {
    setStatus($('skills-status'), error.message, 'error');
  }
}

function renderSkills(listing) {
  operator.listing = listing;
  const skills = listing.skills ?? [];
  operator.skills = new Map(skills.map((skill) => [skill.id, skill]));
  const uploadsOff = !listing.enabled || !listing.installable;
  for (const id of ['upload-file', 'upload-overwrite', 'upload-button']) $(id).disabled = uploadsOff;
  $('rescan').disabled = !listing.enabled;
  if (listing.enabled && !listing.installable) {
    setStatus($('upload-status'), 'This server has no install folder, so uploads are off.');
  }

  const list = $('skill-list');
  list.replaceChildren();
  if (listing.enabled && skills.length === 0) list.append(el('li', 'empty', 'No skills are registered.'));
  for (const skill of skills) list.append(skillRow(skill));

  const errors = listing.errors ?? [];
  $('skill-errors').hidden = errors.length === 0;
  $('skill-error-list').replaceChildren(...errors.map((error) => {
    const item = el('li');
    item.append(el('code', '', error.path), el('span', '', ` ${sentence(error.message)}`));
    return item;
  }));

  const open = $('skill-detail').dataset.skill;
  if (open && !operator.skills.has(open)) closeSkill();
  renderPicker(skills);
}

function skillRow(skill) {
  const row = el('li', 'skill-row');
  row.dataset.skill = skill.id;
  const head = el('div', 'skill-head');
  const name = el('button', 'skill-name', skill.id);
  name.type = 'button';
  name.dataset.open = skill.id;
  name.title = 'Show its files';
  const origin = el('span', `origin ${skill.origin === 'installed' ? 'installed' : 'discovered'}`, skill.origin);
  head.append(name, origin);
  const fileCount = (skill.files ?? []).length;
  head.append(el('span', 'skill-size', `${fileCount + 1} files · ${formatBytes(skill.bytes)}`));
  if (skill.origin === 'installed') {
    const remove = el('button', 'danger small admin-only', 'Delete');
    remove.type = 'button';
    remove.dataset.delete = skill.id;
    head.append(remove);
  }
  if (skill.risk) {
    const risk = el('span', `risk severity-${skill.risk}`, `risk: ${skill.risk}`);
    risk.title = 'The most severe finding of the scan';
    head.insertBefore(risk, head.querySelector('.danger'));
  }
  row.append(head, el('p', 'description', skill.description ?? ''));
  const marks = [];
  if (skill.explicit_only) marks.push('explicit use only: offered to the model only when selected');
  if (skill.user_invocable === false) marks.push('not in the picker');
  if (skill.selected_by_default) marks.push('selected for every request (--skill)');
  if (skill.argument_hint) marks.push(`arguments: ${skill.argument_hint}`);
  if ((skill.allowed_tools ?? []).length) marks.push(`allowed tools once loaded: ${skill.allowed_tools.join(' ')}`);
  if (marks.length) row.append(el('p', 'skill-marks', marks.join(' · ')));
  row.append(outcomesLine(skill.outcomes));
  const warnings = skill.warnings ?? [];
  if (warnings.length) {
    const list = el('ul', 'warnings');
    for (const warning of warnings) list.append(el('li', '', sentence(warning)));
    row.append(list);
  }
  const findings = skill.findings ?? [];
  if (findings.length) {
    // Folded unless one is serious enough that the strict policy would refuse it.
    const box = el('details', 'findings-box');
    box.open = SEVERITIES.indexOf(skill.risk) >= SEVERITIES.indexOf('high');
    box.append(el('summary', '', `${findings.length} ${findings.length === 1 ? 'finding' : 'findings'} of the scan`));
    box.append(findingsList(findings));
    row.append(box);
  }
  return row;
}

const SEVERITIES = ['info', 'low', 'medium', 'high', 'critical'];

// The scan's findings: severity, rule, where, why, and the matched text
// (the server spells invisible characters out).
function findingsList(findings) {
  const list = el('ul', 'findings');
  for (const finding of findings) {
    const item = el('li');
    item.dataset.rule = finding.rule;
    const place = finding.line ? `${finding.file}:${finding.line}` : finding.file;
    item.append(
      el('span', `severity severity-${finding.severity}`, finding.severity),
      el('code', 'rule', finding.rule),
      el('span', 'place', place),
      el('span', 'finding-message', finding.message),
    );
    if (finding.excerpt) item.append(el('code', 'excerpt', finding.excerpt));
    list.append(item);
  }
  return list;
}

// How the skill has fared since the server started: how often it was
// advertised, read and run, the MCP calls it led to, and how the turns
// that used it ended.
function outcomesLine(outcomes) {
  const line = el('p', 'skill-outcomes');
  const o = outcomes ?? {};
  const used = (o.answer ?? 0) + (o.error ?? 0) + (o.tool_call ?? 0) + (o.budget ?? 0) + (o.cancelled ?? 0);
  const parts = [`advertised ${o.advertised ?? 0}`, `read ${o.read ?? 0}`, `run ${o.run ?? 0}`];
  if (o.mcp_calls) parts.push(`MCP calls ${o.mcp_calls}`);
  if (used) {
    const ended = [['answer', 'answered'], ['error', 'failed'], ['tool_call', 'ended in a client tool call'], ['budget', 'cut by a limit'], ['cancelled', 'cancelled']]
      .filter(([key]) => o[key])
      .map(([key, words]) => `${o[key]} ${words}`);
    parts.push(`turns that used it: ${ended.join(', ')}`);
  }
  line.textContent = parts.join(' · ');
  line.dataset.outcomes = JSON.stringify({ advertised: o.advertised ?? 0, read: o.read ?? 0, answer: o.answer ?? 0 });
  return line;
}

// `said` is a sentence for the versions' status once they are listed.
function openSkill(id, said = '') {
  const skill = operator.skills.get(id);
  if (!skill) return;
  const detail = $('skill-detail');
  detail.dataset.skill = id;
  detail.hidden = false;
  $('skill-detail-title').textContent = skill.name && skill.name !== id ? `${id} (${skill.name})` : id;
  // The listing leaves SKILL.md out of `files`; the files route serves it.
  const files = [{ path: 'SKILL.md', text: true, kind: 'instructions' }, ...(skill.files ?? [])]
    .filter((file, index, all) => all.findIndex((other) => other.path === file.path) === index);
  const list = $('skill-files');
  list.replaceChildren();
  for (const file of files) {
    const item = el('li');
    if (file.text) {
      const button = el('button', 'file-button', file.path);
      button.type = 'button';
      button.dataset.file = file.path;
      item.append(button);
    } else {
      // Binary files are served as attachments: offer them as downloads.
      const link = el('a', 'file-button', file.path);
      link.href = skillPath(id, file.path);
      link.download = file.path.split('/').pop();
      link.addEventListener('click', downloadWithKey);
      item.append(link);
    }
    const about = [file.kind, formatBytes(file.bytes)].filter(Boolean).join(' · ');
    if (about) item.append(el('span', 'file-about', about));
    list.append(item);
  }
  showFile(id, 'SKILL.md');
  const versions = $('skill-versions');
  versions.hidden = skill.origin !== 'installed';
  if (skill.origin === 'installed') loadVersions(id, said);
  detail.scrollIntoView({ block: 'nearest' });
}

// An installed skill's versions, newest first; an admin may make an
// earlier one live again.
async function loadVersions(id, said) {
  const list = $('version-list');
  const status = $('versions-status');
  list.replaceChildren();
  setStatus(status, 'Loading the versions…');
  try {
    const history = await fetchJson(`/api/skills/${encodeURIComponent(id)}/versions`);
    if ($('skill-detail').dataset.skill !== id) return;
    for (const version of history.versions ?? []) {
      const item = el('li', version.current ? 'version current' : 'version');
      item.dataset.version = version.version;
      item.append(el('span', 'version-number', `version ${version.version}`));
      if (version.current) item.append(el('span', 'origin installed', 'live'));
      const digest = el('code', 'digest', (version.digest ?? '').replace(/^sha256:/, '').slice(0, 12));
      digest.title = version.digest ?? '';
      item.append(digest, el('span', 'file-about', `${formatDate(version.installed_at)} · ${formatBytes(version.bytes)}`));
      if (!version.current) {
        const back = el('button', 'secondary small admin-only', `Roll back to version ${version.version}`);
        back.type = 'button';
        back.dataset.rollback = version.version;
        item.append(back);
      }
      list.append(item);
    }
    setStatus(status, said, said ? 'ok' : undefined);
  } catch (error) {
    setStatus(status, error.message, 'error');
  }
}

function formatDate(iso) {
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? String(iso ?? '') : date.toLocaleString();
}

async function rollbackSkill(id, version) {
  const status = $('versions-status');
  setStatus(status, `Rolling ${id} back to version ${version}…`);
  try {
    await fetchJson(`/api/skills/${encodeURIComponent(id)}/rollback`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ version: Number(version) }),
    });
    await loadSkills();
    openSkill(id, `Version ${version} of ${id} is live.`);
  } catch (error) {
    setStatus(status, error.message, 'error');
  }
}

function closeSkill() {
  const detail = $('skill-detail');
  delete detail.dataset.skill;
  detail.hidden = true;
  operator.fileRequest += 1;
}

async function showFile(id, path) {
  const ticket = ++operator.fileRequest;
  for (const button of $('skill-files').querySelectorAll('.file-button')) {
    button.classList.toggle('selected', button.dataset.file === path);
  }
  const content = $('file-content');
  setStatus($('file-status'), `Loading ${path}…`);
  try {
    const text = await (await request(skillPath(id, path))).text();
    if (ticket !== operator.fileRequest) return;
    content.textContent = text;
    content.hidden = false;
    setStatus($('file-status'), path);
  } catch (error) {
    if (ticket !== operator.fileRequest) return;
    content.hidden = true;
    setStatus($('file-status'), error.message, 'error');
  }
}

async function uploadSkill(event) {
  event.preventDefault();
  const status = $('upload-status');
  const file = $('upload-file').files[0];
  if (!file) {
    setStatus(status, 'Choose a ZIP archive first.', 'error');
    return;
  }
  const form = new FormData();
  form.append('file', file, file.name);
  if ($('upload-overwrite').checked) form.append('overwrite', 'true');
  $('upload-button').disabled = true;
  $('upload-findings').replaceChildren();
  setStatus(status, `Uploading ${file.name}…`);
  try {
    const skill = await fetchJson('/api/skills', { method: 'POST', body: form });
    const found = (skill.findings ?? []).length;
    setStatus(status, found ? `Installed ${skill.id}, with ${found} ${found === 1 ? 'finding' : 'findings'} of the scan.` : `Installed ${skill.id}.`, 'ok');
    $('upload-file').value = '';
    await loadSkills();
  } catch (error) {
    setStatus(status, error.message, 'error');
    const findings = error.details?.findings ?? [];
    if (findings.length) $('upload-findings').replaceChildren(findingsList(findings));
  } finally {
    $('upload-button').disabled = false;
  }
}

async function deleteSkill(id) {
  if (!window.confirm(`Delete the installed skill ${id}?`)) return;
  const status = $('skills-message');
  try {
    await fetchJson(`/api/skills/${encodeURIComponent(id)}`, { method: 'DELETE' });
    setStatus(status, `Deleted ${id}.`, 'ok');
    await loadSkills();
  } catch (error) {
    setStatus(status, error.message, 'error');
  }
}

async function rescan() {
  const status = $('skills-message');
  $('rescan').disabled = true;
  setStatus(status, 'Rescanning…');
  try {
    const result = await fetchJson('/api/skills/rescan', { method: 'POST' });
    const changes = result.changes ?? {};
    const parts = [['added', 'added'], ['removed', 'removed'], ['changed', 'changed']]
      .filter(([key]) => (changes[key] ?? []).length > 0)
      .map(([key, label]) => `${label} ${changes[key].join(', ')}`);
    setStatus(status, parts.length ? sentence(`rescanned: ${parts.join('; ')}`) : 'Rescanned: nothing changed.', 'ok');
    renderSkills({ ...operator.listing, skills: result.skills ?? [], errors: result.errors ?? [] });
  } catch (error) {
    setStatus(status, error.message, 'error');
  } finally {
    $('rescan').disabled = !operator.listing.enabled;
  }
}

// ---------------------------------------------------------------------------
// Wiring

function start() {
  $('composer').addEventListener('submit', (event) => {
    event.preventDefault();
    sendPrompt();
  });
  $('prompt').addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      sendPrompt();
    }
  });
  $('prompt').addEventListener('input', fitPrompt);
  wireAttachments();
  $('stop').addEventListener('click', stopTurn);
  document.addEventListener('keydown', (event) => {
    if (event.key === 'Escape' && chat.controller) {
      event.preventDefault();
      stopTurn();
    }
  });
  $('new-chat').addEventListener('click', newConversation);
  $('conversation-list').addEventListener('change', (event) => openConversation(event.target.value));
  $('delete-chat').addEventListener('click', deleteConversation);
  // Another tab may have started a conversation meanwhile.
  window.addEventListener('focus', loadConversations);
  // Another selection is another conversation: the model's context differs.
  $('skill-options').addEventListener('change', newConversation);
  $('discovery').addEventListener('change', newConversation);
  // A turn after the switch runs on the model picked; the header says
  // which, and the next /api/models (after a turn) whether it is loaded.
  $('model-picker').addEventListener('change', showModel);

  $('upload-form').addEventListener('submit', uploadSkill);
  $('rescan').addEventListener('click', rescan);
  $('skill-list').addEventListener('click', (event) => {
    const target = event.target.closest('button');
    if (target?.dataset.delete) deleteSkill(target.dataset.delete);
    else if (target?.dataset.open) openSkill(target.dataset.open);
  });
  $('skill-files').addEventListener('click', (event) => {
    const target = event.target.closest('button.file-button');
    const id = $('skill-detail').dataset.skill;
    if (target && id) showFile(id, target.dataset.file);
  });
  $('skill-detail-close').addEventListener('click', closeSkill);
  $('version-list').addEventListener('click', (event) => {
    const target = event.target.closest('button');
    const id = $('skill-detail').dataset.skill;
    if (target?.dataset.rollback && id) rollbackSkill(id, target.dataset.rollback);
  });

  $('sign-in').addEventListener('submit', signIn);
  $('sign-out').addEventListener('click', signOut);
  $('admin-sign-in').addEventListener('click', () => showSignIn('Sign in with an admin key to install, delete or rescan skills.'));

  window.addEventListener('hashchange', showView);
  refreshAuth().then((role) => {
    if (auth.required && !role) {
      showSignIn(auth.key ? 'The saved key is no longer valid. Sign in again.' : 'This server needs a key. Sign in to continue.');
      return;
    }
    showView();
    loadModels().then(restoreConversations);
  });
}

start();

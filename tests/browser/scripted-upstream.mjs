// A scripted model behind an OpenAI-compatible chat API on 127.0.0.1, for
// the one browser step that must be deterministic: a turn in which the
// request's model starts two child agents. skillhost drives it as an
// upstream in chat mode (`--upstream URL,mode=chat`), so the real server,
// its loop, its agents and the real page all run; only the model's choices
// are fixed. The real model's delegation is tested in
// tests/python/test_multi_agent.py.
//
// The script: the request's own model starts two agents, waits until both
// reports are in, and answers. Each child (its first message names it)
// lists the skills, then reports. Every child answer comes after
// CHILD_DELAY_MS, so the page shows the children working.

import { createServer } from 'node:http';

const CHILD_DELAY_MS = 1500;
const MARK = '[You are agent ';

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

// What the agent says next: tool calls or a text answer.
function next(messages) {
  const { agent, round } = whoAndRound(messages);
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

async function answer(req, res) {
  let raw = '';
  for await (const piece of req) raw += piece;
  const request = JSON.parse(raw);
  const step = next(request.messages ?? []);
  if (step.delay) await sleep(step.delay);
  const base = { id: 'chatcmpl-scripted', object: 'chat.completion.chunk', created: 0, model: 'scripted-agents' };
  res.writeHead(200, { 'Content-Type': 'text/event-stream' });
  if (step.calls) {
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

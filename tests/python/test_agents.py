"""Codex (npm `@openai/codex`, Responses API) and Claude Code (npm
`@anthropic-ai/claude-code`, Messages API) run unchanged against skillhost,
each in a network namespace whose one way out is the test server (see
offline.py): the log shows every request they made.

A whole turn is checked against a scripted model behind skillhost
(scripted_upstream.py): the answer, the tool call and what follows are
certain, so the client's exit status, what it printed, the requests it made
and the tool result that came back are the same on every host. The real
model runs only where it cannot decide the outcome: a tool call the server
forces, checked up to the request that brings its result back, and no
further (what the model writes after that is free)."""

import json
import os
from pathlib import Path

import pytest

from agent_cache import SHORT_INSTRUCTIONS, codex_home
from conftest import DEFAULT_MODEL, ROOT, RunningServer
from offline import Bridge
import scripted_upstream
from scripted_upstream import ScriptedUpstream, call, say, text_of, tool_names

AGENTS = ROOT / "tests" / "agents" / "node_modules" / ".bin"
MODEL = "SmolLM2-135M-Instruct.Q4_1"
# Each agent run is bounded; a healthy one takes seconds to a few minutes.
AGENT_TIMEOUT_S = 420


def agent(name):
    path = AGENTS / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make test` (it installs tests/agents with npm ci)")
    return str(path)


def report(capsys, who, bridge, result):
    """What the agent asked for and what its namespace could reach, shown in
    the test log."""
    namespace = [line for line in result.stderr.splitlines() if line.startswith("offline:")]
    with capsys.disabled():
        print(f"\n{who}: {len(bridge.requests)} requests, all to the test server: {sorted(set(bridge.requests))}")
        for line in namespace:
            print(f"{who}: {line}")
    assert namespace and namespace[0].startswith("offline: interfaces lo; addresses 127.0.0.1/8, ::1/128;"), result.stderr
    assert namespace[0].endswith("routes, through lo"), namespace


def run_codex(server, tmp_path, prompt, headers=None, until=None):
    home = codex_home(tmp_path, server.url, server.model_id, headers)
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("A file for the agent to find.\n")
    bridge = Bridge(server.url, tmp_path)
    env = {**os.environ, "CODEX_HOME": str(home), "SKILLHOST_TEST_KEY": "unused", "HOME": str(tmp_path)}
    # Codex runs with its default read-only sandbox (its bundled bubblewrap).
    command = [agent("codex"), "exec", "--json", "--skip-git-repo-check", "--color", "never", prompt]
    try:
        result = bridge.run(command, cwd=work, env=env, timeout=AGENT_TIMEOUT_S, until=until)
    finally:
        bridge.close()
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return bridge, result, events


def items(events, kind):
    return [e["item"] for e in events if e.get("type") == "item.completed" and e["item"].get("type") == kind]


@pytest.fixture(scope="module")
def greedy_server():
    # Codex sends neither a temperature nor a budget: the server's defaults
    # keep the real model's rounds short.
    running = RunningServer(
        ["--model", str(DEFAULT_MODEL), "--ctx-size", "8192", "--temperature", "0", "--max-tokens", "256"]
    )
    running.model_id = MODEL
    yield running
    running.stop()


# What the scripted model is asked, and what it answers.
LIST_FILES = "List the files in this folder with your shell tool."
HELLO = "hello"
LISTED = "The folder holds notes.txt."
NOT_LISTED = "The listing did not show notes.txt."
# The shell tool of each client, and the arguments of a call that lists.
SHELLS = {"exec_command": {"cmd": "ls"}, "Bash": {"command": "ls", "description": "List the files"}}


def agent_script(body):
    """One turn of a coding agent: a prompt that asks for the files gets one
    call of the client's shell tool, its result gets an answer that says
    whether the listing came back, and anything else gets `hello`."""
    messages = body["messages"]
    results = [text_of(m) for m in messages if m["role"] == "tool"]
    if results:
        return say(LISTED if "notes.txt" in results[-1] else NOT_LISTED)
    asked = " ".join(text_of(m) for m in messages if m["role"] == "user")
    shells = [name for name in tool_names(body) if name in SHELLS]
    if LIST_FILES in asked and shells:
        return call(shells[0], SHELLS[shells[0]])
    return say(HELLO)


@pytest.fixture(scope="module")
def scripted():
    upstream = ScriptedUpstream(agent_script)
    running = RunningServer(["--upstream", f"{upstream.url},mode=chat"])
    running.upstream = upstream
    running.model_id = scripted_upstream.MODEL
    yield running
    running.stop()
    upstream.close()


@pytest.fixture
def fresh(scripted):
    scripted.upstream.requests.clear()
    return scripted


def assert_the_listing_came_back(upstream, shell):
    """What the scripted model saw in the server's last request: its one
    call of `shell`, and that call's result, which holds the listing."""
    messages = upstream.requests[-1]["messages"]
    made = [c for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    returned = [m for m in messages if m["role"] == "tool"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in made] == [
        (shell, SHELLS[shell])], made
    assert [m["tool_call_id"] for m in returned] == [made[0]["id"]], returned
    assert "notes.txt" in text_of(returned[0]), returned


def test_codex_exec_completes_a_turn(fresh, tmp_path, capsys):
    bridge, result, events = run_codex(fresh, tmp_path, "Say hello.")
    report(capsys, "codex", bridge, result)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [item["text"] for item in items(events, "agent_message")] == [HELLO], events
    assert any(e.get("type") == "turn.completed" for e in events), events
    assert bridge.requests == ["POST /v1/responses"]
    assert len(fresh.upstream.requests) == 1


def test_codex_runs_a_shell_call_and_sends_its_result_back(fresh, tmp_path, capsys):
    bridge, result, events = run_codex(fresh, tmp_path, LIST_FILES)
    report(capsys, "codex", bridge, result)
    assert result.returncode == 0, result.stdout + result.stderr
    commands = items(events, "command_execution")
    assert len(commands) == 1 and "ls" in commands[0]["command"], events
    assert commands[0]["exit_code"] == 0 and "notes.txt" in commands[0]["aggregated_output"], commands
    assert [item["text"] for item in items(events, "agent_message")] == [LISTED], events
    assert bridge.requests == ["POST /v1/responses"] * 2
    assert_the_listing_came_back(fresh.upstream, "exec_command")


def test_codex_executes_a_shell_call_the_server_forced(greedy_server, tmp_path, capsys):
    # The real model: the header holds the turn's first round to Codex's
    # shell tool, so a call is certain (its command is the model's). Codex
    # runs it in its read-only sandbox; the run stops once the next request,
    # which carries the output, has gone out.
    def sent_back(lines, requests):
        done = [json.loads(line) for line in lines if line.startswith("{")]
        return items(done, "command_execution") and len(requests) >= 2

    bridge, result, events = run_codex(
        greedy_server, tmp_path, 'Use exec_command with cmd "ls".',
        headers={"x-skillhost-tool-choice": "exec_command"}, until=sent_back,
    )
    report(capsys, "codex", bridge, result)
    assert items(events, "command_execution"), result.stdout + result.stderr
    assert bridge.requests[:2] == ["POST /v1/responses"] * 2, bridge.requests


def run_claude(server, tmp_path, prompt, *options, headers=None, until=None):
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("A file for the agent to find.\n")
    bridge = Bridge(server.url, tmp_path)
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "ANTHROPIC_BASE_URL": server.url,
        "ANTHROPIC_API_KEY": "unused",
        # Nothing but the model's requests: no telemetry, update checks or error reports.
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        # Claude Code asks for 32,000 output tokens by default.
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "256",
    }
    if headers:
        env["ANTHROPIC_CUSTOM_HEADERS"] = "\n".join(f"{k}: {v}" for k, v in headers.items())
    # Its default system prompt and tools are 12,000 tokens or more, past the
    # test server's context (they need a larger one and minutes of prefill on
    # two cores); a short prompt and one tool keep the round small.
    command = [agent("claude"), "-p", prompt, "--system-prompt", SHORT_INSTRUCTIONS, "--tools", "Bash", *options]
    try:
        result = bridge.run(command, cwd=work, env=env, timeout=AGENT_TIMEOUT_S, until=until)
    finally:
        bridge.close()
    return bridge, result


def stream_blocks(stdout):
    """The (role, block) pairs of a stream-json run, and its events."""
    events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    blocks = [(e["type"], block) for e in events if e.get("type") in ("assistant", "user")
              for block in e["message"]["content"] if isinstance(block, dict)]
    return blocks, events


def test_claude_code_completes_a_turn(fresh, tmp_path, capsys):
    bridge, result = run_claude(fresh, tmp_path, "Reply with one word: hello", "--output-format", "json",
                                "--max-turns", "3")
    report(capsys, "claude", bridge, result)
    assert result.returncode == 0, result.stdout + result.stderr
    outcome = json.loads(result.stdout)
    assert (outcome["is_error"], outcome["subtype"], outcome["result"], outcome["num_turns"]) == (
        False, "success", HELLO, 1), outcome
    assert bridge.requests == ["POST /v1/messages?beta=true"]
    assert len(fresh.upstream.requests) == 1


def test_claude_code_runs_a_bash_call_and_sends_its_result_back(fresh, tmp_path, capsys):
    bridge, result = run_claude(fresh, tmp_path, LIST_FILES, "--output-format", "stream-json", "--verbose",
                                "--max-turns", "3", "--allowedTools", "Bash")
    report(capsys, "claude", bridge, result)
    assert result.returncode == 0, result.stdout + result.stderr
    blocks, events = stream_blocks(result.stdout)
    uses = [block for kind, block in blocks if kind == "assistant" and block["type"] == "tool_use"]
    results = [block for kind, block in blocks if kind == "user" and block["type"] == "tool_result"]
    assert [(u["name"], u["input"]) for u in uses] == [("Bash", SHELLS["Bash"])], events
    assert [r["tool_use_id"] for r in results] == [uses[0]["id"]], events
    assert "notes.txt" in str(results[0]["content"]) and not results[0].get("is_error"), results
    outcome = events[-1]
    assert (outcome["type"], outcome["subtype"], outcome["result"]) == ("result", "success", LISTED), outcome
    assert bridge.requests == ["POST /v1/messages?beta=true"] * 2
    assert_the_listing_came_back(fresh.upstream, "Bash")


def test_claude_code_answers_a_tool_use_the_server_forced(greedy_server, tmp_path, capsys):
    # The real model: the header holds the first round to Bash, so a call is
    # certain; its command is the model's, so Claude Code is given no leave
    # to run it (it runs as this test's user, outside any sandbox) and sends
    # back its refusal as the result. The run stops once that has gone out.
    def sent_back(lines, requests):
        blocks, _ = stream_blocks("".join(lines))
        return any(kind == "user" and b["type"] == "tool_result" for kind, b in blocks) and len(requests) >= 2

    bridge, result = run_claude(
        greedy_server, tmp_path, 'Use Bash with command "ls".', "--output-format", "stream-json", "--verbose",
        "--max-turns", "2", headers={"x-skillhost-tool-choice": "Bash"}, until=sent_back,
    )
    report(capsys, "claude", bridge, result)
    blocks, events = stream_blocks(result.stdout)
    uses = [block for kind, block in blocks if kind == "assistant" and block["type"] == "tool_use"]
    results = [block for kind, block in blocks if kind == "user" and block["type"] == "tool_result"]
    # How many calls the round holds is the model's (it may repeat the
    # forced one); each is a Bash call, and each result answers one of them.
    assert uses and all(use["name"] == "Bash" for use in uses), events
    assert results and {r["tool_use_id"] for r in results} <= {use["id"] for use in uses}, events
    assert bridge.requests[:2] == ["POST /v1/messages?beta=true"] * 2, bridge.requests


# Claude Code with skillhost as its MCP server (POST /mcp): it lists the
# skills tools there, the scripted model calls one, and the skill's text comes
# back as the result, through the same path guard skills_read uses.
MCP_READ = "mcp__skillhost__skills_read"
READ_SKILL = "Read the skill-authoring skill from skillhost's MCP server."
SKILL_READ = "The skill came back."
SKILL_NOT_READ = "The skill did not come back."


def mcp_script(body):
    messages = body["messages"]
    results = [text_of(m) for m in messages if m["role"] == "tool"]
    if results:
        return say(SKILL_READ if "name: skill-authoring" in results[-1] else SKILL_NOT_READ)
    if MCP_READ in tool_names(body):
        return call(MCP_READ, {"skill": "skill-authoring"})
    return say(HELLO)


@pytest.fixture(scope="module")
def skills_server():
    upstream = ScriptedUpstream(mcp_script)
    running = RunningServer(["--upstream", f"{upstream.url},mode=chat", "--skills-dir", str(ROOT / "skills")])
    running.upstream = upstream
    yield running
    running.stop()
    upstream.close()


def test_claude_code_reads_a_skill_from_skillhost_as_its_mcp_server(skills_server, tmp_path, capsys):
    config = {"mcpServers": {"skillhost": {"type": "http", "url": skills_server.url + "/mcp"}}}
    bridge, result = run_claude(
        skills_server, tmp_path, READ_SKILL, "--mcp-config", json.dumps(config), "--strict-mcp-config",
        "--allowedTools", MCP_READ, "--output-format", "stream-json", "--verbose", "--max-turns", "3",
    )
    report(capsys, "claude", bridge, result)
    assert result.returncode == 0, result.stdout + result.stderr
    blocks, events = stream_blocks(result.stdout)
    uses = [block for kind, block in blocks if kind == "assistant" and block["type"] == "tool_use"]
    results = [block for kind, block in blocks if kind == "user" and block["type"] == "tool_result"]
    assert [(u["name"], u["input"]) for u in uses] == [(MCP_READ, {"skill": "skill-authoring"})], events
    assert [r["tool_use_id"] for r in results] == [uses[0]["id"]] and not results[0].get("is_error"), results
    skill_md = (ROOT / "skills" / "skill-authoring" / "SKILL.md").read_text()
    assert skill_md.splitlines()[1] in str(results[0]["content"]), results
    outcome = events[-1]
    assert (outcome["type"], outcome["subtype"], outcome["result"]) == ("result", "success", SKILL_READ), outcome
    # Claude Code spoke MCP to skillhost through the one way out it had.
    assert "POST /mcp" in bridge.requests, bridge.requests

"""Codex (npm `@openai/codex`, Responses API) and Claude Code (npm
`@anthropic-ai/claude-code`, Messages API) run unchanged against skillhost
and the real model, each in a network namespace whose one way out is the
test server (see offline.py): the log shows every request they made."""

import json
import os
from pathlib import Path

import pytest

from conftest import DEFAULT_MODEL, ROOT, RunningServer
from offline import Bridge

AGENTS = ROOT / "tests" / "agents" / "node_modules" / ".bin"
MODEL = "SmolLM2-135M-Instruct.Q4_1"
# Each agent run is bounded; a healthy one takes seconds to a few minutes.
AGENT_TIMEOUT_S = 420
# Codex's own instructions are about 4,000 tokens; a short text in their place
# keeps a round's prefill small on the default model (Claude Code's too).
CODEX_INSTRUCTIONS = "You are a coding agent in a terminal. Answer briefly."


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


def codex_home(folder, url, headers=None):
    home = folder / "codex-home"
    home.mkdir()
    (home / "instructions.md").write_text(CODEX_INSTRUCTIONS)
    provider_headers = ""
    if headers:
        pairs = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in headers.items())
        provider_headers = f"http_headers = {{ {pairs} }}\n"
    # web_search is off: this server refuses built-in tools it cannot run.
    # Codex's sub-agent tools stay on; they arrive as a tool namespace.
    (home / "config.toml").write_text(
        f'model = "{MODEL}"\n'
        'model_provider = "skillhost"\n'
        'web_search = "disabled"\n'
        f'model_instructions_file = "{home / "instructions.md"}"\n'
        "[features]\ngoals = false\n"
        "[model_providers.skillhost]\n"
        'name = "skillhost"\n'
        f'base_url = "{url}/v1"\n'
        'env_key = "SKILLHOST_TEST_KEY"\n'
        'wire_api = "responses"\n'
        "request_max_retries = 0\n"
        "stream_max_retries = 0\n" + provider_headers
    )
    return home


def run_codex(server, tmp_path, prompt, headers=None):
    home = codex_home(tmp_path, server.url, headers)
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("A file for the agent to find.\n")
    bridge = Bridge(server.url, tmp_path)
    env = {**os.environ, "CODEX_HOME": str(home), "SKILLHOST_TEST_KEY": "unused", "HOME": str(tmp_path)}
    # Codex runs with its default read-only sandbox (its bundled bubblewrap).
    command = [agent("codex"), "exec", "--json", "--skip-git-repo-check", "--color", "never", prompt]
    try:
        result = bridge.run(command, cwd=work, env=env, timeout=AGENT_TIMEOUT_S)
    finally:
        bridge.close()
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return bridge, result, events


def items(events, kind):
    return [e["item"] for e in events if e.get("type") == "item.completed" and e["item"].get("type") == kind]


@pytest.fixture(scope="module")
def greedy_server():
    # Codex sends neither a temperature nor a budget: the server's defaults
    # make the small model's answers the same from run to run, and short.
    running = RunningServer(
        ["--model", str(DEFAULT_MODEL), "--ctx-size", "8192", "--temperature", "0", "--max-tokens", "256"]
    )
    yield running
    running.stop()


def test_codex_exec_completes_a_turn(greedy_server, tmp_path, capsys):
    server = greedy_server
    bridge, result, events = run_codex(server, tmp_path, "Say hello.")
    report(capsys, "codex", bridge, result)
    assert result.returncode == 0, result.stdout + result.stderr
    answers = [item["text"] for item in items(events, "agent_message")]
    assert answers and answers[-1].strip(), events
    assert any(e.get("type") == "turn.completed" for e in events), events
    assert bridge.requests and set(bridge.requests) == {"POST /v1/responses"}, bridge.requests


def test_codex_executes_a_shell_call_the_server_forced(greedy_server, tmp_path, capsys):
    # Codex always sends tool_choice "auto"; the header holds the first round
    # of the turn to its shell tool.
    bridge, result, events = run_codex(
        greedy_server, tmp_path, 'Use exec_command with cmd "ls".', headers={"x-skillhost-tool-choice": "exec_command"}
    )
    report(capsys, "codex", bridge, result)
    assert result.returncode == 0, result.stdout + result.stderr
    commands = items(events, "command_execution")
    assert commands, events
    # Codex ran it (in its sandbox) and sent the output back for another round.
    assert commands[0]["exit_code"] is not None, commands[0]
    assert len(bridge.requests) >= 2, bridge.requests
    assert any(e.get("type") == "turn.completed" for e in events), events


def run_claude(server, tmp_path, prompt, *options, headers=None, max_output=256):
    work = tmp_path / "work"
    work.mkdir()
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
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(max_output),
    }
    if headers:
        env["ANTHROPIC_CUSTOM_HEADERS"] = "\n".join(f"{k}: {v}" for k, v in headers.items())
    # Its default system prompt and tools are 12,000 tokens or more, past the
    # test server's context (they need a larger one and minutes of prefill on
    # two cores); a short prompt and one tool keep the round small.
    command = [agent("claude"), "-p", prompt, "--system-prompt", CODEX_INSTRUCTIONS, "--tools", "Bash", *options]
    try:
        result = bridge.run(command, cwd=work, env=env, timeout=AGENT_TIMEOUT_S)
    finally:
        bridge.close()
    return bridge, result


def test_claude_code_completes_a_turn(greedy_server, tmp_path, capsys):
    # The small model tends to echo the environment block of Claude Code's
    # prompt, whose paths and kernel version differ from host to host: 210
    # tokens on one machine, more than 256 on CI, where Claude Code took the
    # cut for an error. 1,024 leaves room for the echo and still ends a ramble.
    bridge, result = run_claude(
        greedy_server, tmp_path, "Reply with one word: hello", "--output-format", "json", "--max-turns", "3",
        max_output=1024,
    )
    report(capsys, "claude", bridge, result)
    assert result.returncode == 0, result.stdout + result.stderr + "".join(greedy_server.log[-20:])
    outcome = json.loads(result.stdout)
    assert outcome["is_error"] is False and outcome["result"].strip(), outcome
    assert outcome["usage"]["input_tokens"] + outcome["usage"]["cache_read_input_tokens"] > 100, outcome
    assert bridge.requests and all(line.startswith("POST /v1/messages") for line in bridge.requests), bridge.requests


def test_claude_code_runs_a_tool_use_the_server_forced(greedy_server, tmp_path, capsys):
    bridge, result = run_claude(
        greedy_server, tmp_path, 'Use Bash with command "ls".', "--output-format", "stream-json", "--verbose",
        "--max-turns", "2", "--allowedTools", "Bash", headers={"x-skillhost-tool-choice": "Bash"},
    )
    report(capsys, "claude", bridge, result)
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    blocks = [(e["type"], block) for e in events if e.get("type") in ("assistant", "user")
              for block in e["message"]["content"] if isinstance(block, dict)]
    uses = [block for kind, block in blocks if kind == "assistant" and block["type"] == "tool_use"]
    results = [block for kind, block in blocks if kind == "user" and block["type"] == "tool_result"]
    assert uses and uses[0]["name"] == "Bash" and "command" in uses[0]["input"], events
    # Claude Code ran the command and sent its output back in the next request.
    assert {r["tool_use_id"] for r in results} >= {uses[0]["id"]}, events
    assert len(bridge.requests) >= 2, bridge.requests
    # The small model keeps calling Bash, so the run may end at --max-turns.
    outcome = events[-1]
    assert outcome["type"] == "result" and outcome["subtype"] in ("success", "error_max_turns"), outcome

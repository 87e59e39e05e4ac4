"""How much of each coding agent's request the KV cache serves.

Claude Code (`claude -p`, then `--continue`) and Codex (`codex exec`, then
`exec resume --last`) run multi-turn sessions, unchanged, against a real
server, each turn in a network namespace whose one way out is the server
(offline.py). The server logs every round's prompt and cached tokens
("round finished"); a turn's share is the cached part of the prompts of the
requests it made (a turn may make several: a tool call, a retry).

test_agent_cache.py checks the shares with a short system prompt; run as a
script (`make bench`), it measures the clients' own full prompts:

    python tests/python/agent_cache.py [--turns 5]
"""

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AGENTS = ROOT / "tests" / "agents" / "node_modules" / ".bin"
ROUND = re.compile(r"round finished .*?prompt=(\d+) cached=(\d+)")
# A short system prompt in place of each client's own (4,000 to 12,000
# tokens): a test's rounds stay small on the default model.
SHORT_INSTRUCTIONS = "You are a coding agent in a terminal. Answer briefly."
# Each turn is bounded; a healthy one takes seconds, or minutes for a
# first prefill of a client's full prompt on two cores.
TURN_TIMEOUT_S = 900


def rounds(log, start):
    """The (prompt, cached) tokens of every round logged from line `start`."""
    return [(int(m.group(1)), int(m.group(2))) for line in log[start:] if (m := ROUND.search(line))]


def share(turn):
    """The cached part of a turn's prompts."""
    prompt = sum(p for p, _ in turn)
    return sum(c for _, c in turn) / prompt if prompt else 0.0


def _claude(url, folder, prompt, first, short, max_output):
    env = {
        **os.environ,
        "HOME": str(folder),
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": "unused",
        # Nothing but the model's requests: no telemetry, update checks or error reports.
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(max_output),
    }
    command = [str(AGENTS / "claude"), "-p", prompt, "--output-format", "json", "--max-turns", "2"]
    if short:
        command += ["--system-prompt", SHORT_INSTRUCTIONS, "--tools", "Bash"]
    if not first:
        command.append("--continue")
    return command, env


def codex_home(folder, url, model, headers=None, instructions=SHORT_INSTRUCTIONS):
    """A CODEX_HOME whose one provider is the server at `url`; with
    `instructions`, they replace Codex's own (about 4,000 tokens)."""
    home = folder / "codex-home"
    home.mkdir()
    instructions_line = ""
    if instructions is not None:
        (home / "instructions.md").write_text(instructions)
        instructions_line = f'model_instructions_file = "{home / "instructions.md"}"\n'
    provider_headers = ""
    if headers:
        pairs = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in headers.items())
        provider_headers = f"http_headers = {{ {pairs} }}\n"
    # Codex's defaults otherwise: its web_search is left out by the server
    # (no MCP tool is mapped to it), and its sub-agent tools arrive as a
    # tool namespace.
    (home / "config.toml").write_text(
        f'model = "{model}"\n'
        'model_provider = "skillhost"\n' + instructions_line + "[features]\ngoals = false\n"
        "[model_providers.skillhost]\n"
        'name = "skillhost"\n'
        f'base_url = "{url}/v1"\n'
        'env_key = "SKILLHOST_TEST_KEY"\n'
        'wire_api = "responses"\n'
        "request_max_retries = 0\n"
        "stream_max_retries = 0\n" + provider_headers
    )
    return home


def _codex(url, folder, prompt, first, short, model):
    home = folder / "codex-home"
    if first and not home.exists():
        codex_home(folder, url, model, instructions=SHORT_INSTRUCTIONS if short else None)
    env = {**os.environ, "CODEX_HOME": str(home), "SKILLHOST_TEST_KEY": "unused", "HOME": str(folder)}
    command = [str(AGENTS / "codex"), "exec", "--json", "--skip-git-repo-check", "--color", "never"]
    command += [prompt] if first else ["resume", "--last", prompt]
    return command, env


def session(server_url, log, client, folder, prompts, short=True, model="", max_output=16):
    """Runs one session of `client` ("claude" or "codex"), a turn per
    prompt, in `folder`; returns each turn's rounds as the server logged
    them and the clients' exit statuses."""
    from offline import Bridge

    folder = Path(folder)
    work = folder / "work"
    # A folder used before is the same project: a new session there.
    work.mkdir(parents=True, exist_ok=True)
    (work / "notes.txt").write_text("A file for the agent to find.\n")
    turns, statuses = [], []
    for index, prompt in enumerate(prompts):
        first = index == 0
        if client == "claude":
            command, env = _claude(server_url, folder, prompt, first, short, max_output)
        else:
            command, env = _codex(server_url, folder, prompt, first, short, model)
        start = len(log)
        (folder / "bridge.sock").unlink(missing_ok=True)
        bridge = Bridge(server_url, folder)
        try:
            result = bridge.run(command, cwd=work, env=env, timeout=TURN_TIMEOUT_S)
        finally:
            bridge.close()
        # The last round's line is written as its answer goes out.
        deadline = time.monotonic() + 5
        while len(rounds(log, start)) < len(bridge.requests) and time.monotonic() < deadline:
            time.sleep(0.05)
        turns.append(rounds(log, start))
        statuses.append((result.returncode, result.stdout[-2000:] + result.stderr[-2000:]))
    return turns, statuses


def table(name, turns):
    lines = [f"| {name} | turn | requests | prompt tokens | cached | share |", "|---|---|---|---|---|---|"]
    for number, turn in enumerate(turns, 1):
        lines.append(
            f"| {name} | {number} | {len(turn)} | {sum(p for p, _ in turn)} | {sum(c for _, c in turn)} "
            f"| {share(turn):.1%} |"
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--short", action="store_true", help="the tests' short system prompt, not the clients' own")
    parser.add_argument("--only", choices=("claude", "codex"), help="one client")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    import tempfile

    import conftest

    prompts = [f"Turn {n}: reply with one short sentence." for n in range(1, args.turns + 1)]
    # Room for Claude Code's own ~12,000-token prompt and five turns.
    flags = ["--model", str(conftest.DEFAULT_MODEL), "--ctx-size", "32768", "--parallel", "2",
             "--temperature", "0", "--no-skills"]
    only = args.only
    for rules in ("all", "none"):
        server = conftest.RunningServer([*flags, "--normalize-client-prompts", rules])
        try:
            with tempfile.TemporaryDirectory(prefix="skillhost-agent-cache-") as folder:
                for client in ("claude", "codex"):
                    if (client == "codex" and rules == "none") or (only and client != only):
                        continue
                    first, _ = session(server.url, server.log, client, Path(folder) / f"{client}-1", prompts,
                                       short=args.short, model="SmolLM2-135M-Instruct.Q4_1")
                    print(f"\n{client}, --normalize-client-prompts {rules}\n" + table(client, first), flush=True)
                    if client == "claude":
                        # A new session in the same project with another
                        # first prompt: it shares the system prompt and
                        # tools (which name the project's folders), nothing
                        # after them.
                        second, _ = session(server.url, server.log, client, Path(folder) / f"{client}-1",
                                            ["What does this folder hold? One sentence."], short=args.short)
                        prompt, cached = second[0][0]
                        print(f"\na second session's first request: {prompt} prompt tokens, {cached} "
                              f"from the cache ({cached / prompt:.1%})", flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()

"""Coding agents hit the KV cache on every turn: Claude Code and Codex,
unchanged, run five-turn sessions against the real model (agent_cache.py),
and from the second turn on at least 95% of every turn's prompt comes from
the cache. A second Claude Code session reuses the first one's system
prompt and tools, which Claude Code's billing line at the front of its
system prompt prevents unless `--normalize-client-prompts` removes it.

What the model writes only adds a few tokens at the end of each prompt; the
shares are decided by what comes before, which is the same on every host.
The clients' own full prompts are measured by `make bench`."""

import pytest

from agent_cache import session, share
from conftest import DEFAULT_MODEL, RunningServer

MODEL = "SmolLM2-135M-Instruct.Q4_1"
TURNS = [f"Turn {n}: reply with one short sentence." for n in range(1, 6)]
# The goal for every turn after the first.
MIN_SHARE = 0.95


def server(rules):
    return RunningServer(["--model", str(DEFAULT_MODEL), "--ctx-size", "8192", "--parallel", "2",
                          "--temperature", "0", "--max-tokens", "16", "--normalize-client-prompts", rules])


@pytest.fixture(scope="module")
def normalized():
    running = server("all")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def as_sent():
    running = server("none")
    yield running
    running.stop()


def check_turns(name, turns, statuses):
    shares = [round(share(turn), 4) for turn in turns]
    print(f"\n{name}: rounds per turn {turns}; shares {shares}")
    assert all(turn for turn in turns), (turns, statuses)
    for number, turn in enumerate(turns[1:], 2):
        assert share(turn) >= MIN_SHARE, (number, turns, statuses)


def test_claude_code_turns_after_the_first_come_from_the_cache(normalized, tmp_path, capsys):
    turns, statuses = session(normalized.url, normalized.log, "claude", tmp_path / "s", TURNS, max_output=16)
    with capsys.disabled():
        check_turns("claude", turns, statuses)


def test_codex_turns_after_the_first_come_from_the_cache(normalized, tmp_path, capsys):
    turns, statuses = session(normalized.url, normalized.log, "codex", tmp_path / "s", TURNS, model=MODEL)
    with capsys.disabled():
        check_turns("codex", turns, statuses)


def second_session_share(running, tmp_path):
    """The cached share of a new Claude Code session's first request, after
    a first session on the same server with another first prompt."""
    session(running.url, running.log, "claude", tmp_path, ["Say hello."], max_output=16)
    # A new session in the same project.
    turns, statuses = session(running.url, running.log, "claude", tmp_path, ["What does this folder hold?"],
                              max_output=16)
    assert turns[0], statuses
    prompt, cached = turns[0][0]
    return prompt, cached


def test_a_second_claude_code_session_reuses_the_system_prompt_only_with_the_rule(
        normalized, as_sent, tmp_path, capsys):
    with_rule = second_session_share(normalized, tmp_path / "with")
    without = second_session_share(as_sent, tmp_path / "without")
    with capsys.disabled():
        print(f"\nclaude, a second session's first request (prompt, cached): with the rule {with_rule}, "
              f"without {without}")
    # The two sessions differ from the prompt on: before it come the system
    # prompt, the tool and Claude Code's opening reminder, most of the request.
    assert with_rule[1] >= with_rule[0] // 2, with_rule
    # As sent, the billing line's version suffix follows each session's
    # first prompt: only the tokens before it match.
    assert without[1] < 32, without
    # The engine saw the same requests but for that line.
    assert with_rule[0] < without[0], (with_rule, without)

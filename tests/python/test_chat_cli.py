"""`skillhost chat` driven through a pseudo-terminal as a person at a
terminal would drive it, and through pipes as a script would. One turn runs
on the real model (greedy, on a prompt that is the same on every host); the
turns whose checks read the answer's exact text, or must stop an answer
midway, run on a scripted model behind the chat (scripted_upstream.py), so
what the answer says is the test's, not the model's."""

import os
import re
import pty
import select
import signal
import subprocess
import time

import pytest

from conftest import BINARY, DEFAULT_MODEL, ROOT, child_env
from scripted_upstream import ScriptedUpstream, say, text_of

SKILLS = ROOT / "tests" / "scenarios" / "skills"
# Loading the model and one short answer on a loaded 2-core machine.
TURN_TIMEOUT_S = 240
QUESTION = "What is the capital of France?"
ANSWER = "The capital of France is Paris."
# An answer long enough to be stopped midway: at STORY_DELAY_S a word it
# streams for about half a minute.
STORY = " ".join(f"Chapter {n}: the dragon learns to cook dish number {n}." for n in range(1, 61))
STORY_DELAY_S = 0.05


@pytest.fixture
def chat_args(tmp_path):
    """The chat command line: the real model, or `upstream` in its place.
    The skills are this folder's fixtures only: an empty install folder of
    the test's own keeps the host's installed skills out of the prompt."""
    for path in (BINARY, DEFAULT_MODEL):
        if not path.exists():
            pytest.fail(f"{path} is missing: run `make test` (it builds and fetches everything)")
    installed = tmp_path / "installed"
    installed.mkdir()

    def args(*extra, upstream=None):
        model = ["--upstream", f"{upstream.url},mode=chat"] if upstream else ["--model", str(DEFAULT_MODEL)]
        return [str(BINARY), "chat", *model, "--skills-dir", str(SKILLS), "--skills-install-dir", str(installed),
                "--temperature", "0", "--parallel", "1", "--ctx-size", "4096", *extra]

    return args


@pytest.fixture
def scripted():
    """A scripted model that answers every turn with ANSWER."""
    upstream = ScriptedUpstream(lambda body: say(ANSWER))
    yield upstream
    upstream.close()


def last_user_text(body):
    return text_of([m for m in body["messages"] if m["role"] == "user"][-1])


class Terminal:
    """A child process on a pseudo-terminal: what it writes, and keys to send."""

    def __init__(self, args):
        env = child_env()
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execve(args[0], args, env)
        self.seen = ""

    def read_until(self, text, timeout=TURN_TIMEOUT_S, start=0):
        deadline = time.monotonic() + timeout
        while text not in self.seen[start:]:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"never saw {text!r}; the terminal shows:\n{self.seen}")
            ready, _, _ = select.select([self.fd], [], [], min(left, 1.0))
            if ready:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"the chat ended before {text!r}:\n{self.seen}")
                self.seen += chunk.decode(errors="replace")
        return self.seen.index(text, start) + len(text)

    def read_more(self, count, timeout=TURN_TIMEOUT_S):
        """Waits until `count` more characters have come."""
        goal = len(self.seen) + count
        deadline = time.monotonic() + timeout
        while len(self.seen) < goal:
            if time.monotonic() > deadline:
                raise AssertionError(f"the output stalled:\n{self.seen}")
            ready, _, _ = select.select([self.fd], [], [], 1.0)
            if ready:
                chunk = os.read(self.fd, 4096)
                if not chunk:
                    raise AssertionError(f"the chat ended:\n{self.seen}")
                self.seen += chunk.decode(errors="replace")

    def send(self, keys):
        os.write(self.fd, keys.encode())

    def wait(self, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            try:
                select.select([self.fd], [], [], 0.2)
                self.seen += os.read(self.fd, 4096).decode(errors="replace")
            except OSError:
                time.sleep(0.2)
        os.kill(self.pid, signal.SIGKILL)
        raise AssertionError(f"the chat did not exit:\n{self.seen}")


def test_a_one_shot_answer_in_a_terminal(chat_args):
    # The real model, greedy, with a budget: the same short answer on every
    # host. A failed turn exits non-zero, so the status says no error came.
    term = Terminal(chat_args("--max-tokens", "64", QUESTION))
    code = term.wait(TURN_TIMEOUT_S)
    assert code == 0, term.seen
    assert "Paris" in term.seen, term.seen


def test_input_prints_only_the_answer_on_stdout_for_a_pipeline(chat_args, scripted, tmp_path):
    question = tmp_path / "question.txt"
    question.write_text(QUESTION + "\n")
    done = subprocess.run(chat_args("--input", str(question), upstream=scripted), capture_output=True, text=True,
                          timeout=TURN_TIMEOUT_S, env=child_env())
    assert done.returncode == 0, done.stderr
    # Nothing but the answer, and a newline to end it: no prompt, no
    # indicator, no log line.
    assert done.stdout == ANSWER + "\n", (done.stdout, done.stderr)
    assert last_user_text(scripted.requests[-1]).strip() == QUESTION, scripted.requests[-1]
    # The same through stdin, as `cmd | skillhost chat --input -` runs it.
    piped = subprocess.run(chat_args("--input", "-", upstream=scripted), input=QUESTION, capture_output=True,
                           text=True, timeout=TURN_TIMEOUT_S, env=child_env())
    assert piped.returncode == 0 and piped.stdout == ANSWER + "\n", (piped.stdout, piped.stderr)
    assert last_user_text(scripted.requests[-1]) == QUESTION, scripted.requests[-1]


def test_errors_give_a_non_zero_status(chat_args):
    missing = subprocess.run(chat_args("--input", "/nonexistent/question.txt"), capture_output=True, text=True,
                             timeout=60, env=child_env())
    assert missing.returncode == 2 and "--input /nonexistent/question.txt" in missing.stderr, missing.stderr
    unknown = subprocess.run(chat_args("--skill", "no-such-skill", "hi"), capture_output=True, text=True,
                             timeout=120, env=child_env())
    assert unknown.returncode == 2, unknown.stderr
    assert "--skill no-such-skill: no such skill is registered; available: long-doc, notes, weather-codes" in unknown.stderr


def test_the_repl_lists_and_selects_skills_and_ctrl_c_stops_a_long_answer(chat_args):
    # The scripted model writes STORY a word at a time: the answer is still
    # coming when Ctrl-C is pressed, whatever the host's speed.
    upstream = ScriptedUpstream(lambda body: say(STORY), delay=STORY_DELAY_S)
    try:
        term = Terminal(chat_args(upstream=upstream))
        at = term.read_until("> ")
        term.send("/skills\r")
        at = term.read_until("[ ] notes", start=at)
        at = term.read_until("> ", start=at)
        term.send("/skill notes\r")
        at = term.read_until("'notes' selected; a new conversation", start=at)
        term.send("/skills\r")
        at = term.read_until("[x] notes", start=at)
        term.send("/skill no-such\r")
        at = term.read_until("no skill called 'no-such'", start=at)
        at = term.read_until("> ", start=at)
        term.send("/system You write very long stories.\r")
        at = term.read_until("system message set", start=at)
        at = term.read_until("> ", start=at)
        term.send("Tell me a very long story about a dragon who learns to cook, with many chapters.\r")
        # Some of the answer arrives, then Ctrl-C stops it and the prompt returns.
        at = term.read_until("chapters.\r\n", start=at)
        # The indicator redraws its line while the prompt is read; what counts
        # is answer text.
        indicator = re.compile(r"\r\x1b\[2K(… [^(\r]*\(\d+s\))?")
        while len(indicator.sub("", term.seen[at:]).strip()) < 80:
            term.read_more(1)
        term.send("\x03")
        stopped = term.read_until("[stopped]", start=at, timeout=60)
        answer = indicator.sub("", term.seen[at:stopped])
        assert STORY[:80] in answer and STORY not in answer, answer
        at = term.read_until("> ", start=stopped, timeout=60)
        # The conversation goes on after the stop.
        term.send("/reset\r")
        at = term.read_until("a new conversation", start=at)
        term.send("/exit\r")
        assert term.wait(60) == 0, term.seen
        # The turn reached the model with the system message the session set.
        asked = upstream.requests[-1]["messages"]
        assert "You write very long stories." in text_of(asked[0]), asked
        assert last_user_text(upstream.requests[-1]).startswith("Tell me a very long story"), asked
    finally:
        upstream.close()

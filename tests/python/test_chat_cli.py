"""`skillhost chat` on the real model, driven through a pseudo-terminal as a
person at a terminal would drive it, and through pipes as a script would."""

import os
import re
import pty
import select
import signal
import subprocess
import time

import pytest

from conftest import BINARY, DEFAULT_MODEL, ROOT

SKILLS = ROOT / "tests" / "scenarios" / "skills"
# Loading the model and one short answer on a loaded 2-core machine.
TURN_TIMEOUT_S = 240


def chat_args(*extra):
    for path in (BINARY, DEFAULT_MODEL):
        if not path.exists():
            pytest.fail(f"{path} is missing: run `make test` (it builds and fetches everything)")
    return [str(BINARY), "chat", "--model", str(DEFAULT_MODEL), "--skills-dir", str(SKILLS),
            "--temperature", "0", "--parallel", "1", "--ctx-size", "4096", *extra]


class Terminal:
    """A child process on a pseudo-terminal: what it writes, and keys to send."""

    def __init__(self, args):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execv(args[0], args)
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


def test_a_one_shot_answer_in_a_terminal():
    term = Terminal(chat_args("What is the capital of France?"))
    code = term.wait(TURN_TIMEOUT_S)
    assert code == 0, term.seen
    assert "Paris" in term.seen, term.seen
    assert "error" not in term.seen.lower(), term.seen


def test_input_prints_only_the_answer_on_stdout_for_a_pipeline(tmp_path):
    question = tmp_path / "question.txt"
    question.write_text("What is the capital of France?\n")
    done = subprocess.run(chat_args("--input", str(question)), capture_output=True, text=True,
                          timeout=TURN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    assert "Paris" in done.stdout
    # Nothing but the answer: no prompt, no indicator, no log line.
    assert "> " not in done.stdout and "…" not in done.stdout and "INFO" not in done.stdout, done.stdout
    # The same through stdin, as `cmd | skillhost chat --input -` runs it.
    piped = subprocess.run(chat_args("--input", "-"), input="What is the capital of France?",
                           capture_output=True, text=True, timeout=TURN_TIMEOUT_S)
    assert piped.returncode == 0 and piped.stdout == done.stdout, (piped.stdout, done.stdout)


def test_errors_give_a_non_zero_status():
    missing = subprocess.run(chat_args("--input", "/nonexistent/question.txt"), capture_output=True, text=True,
                             timeout=60)
    assert missing.returncode == 2 and "--input /nonexistent/question.txt" in missing.stderr, missing.stderr
    unknown = subprocess.run(chat_args("--skill", "no-such-skill", "hi"), capture_output=True, text=True,
                             timeout=120)
    assert unknown.returncode == 2, unknown.stderr
    assert "--skill no-such-skill: no such skill is registered; available: long-doc, notes, weather-codes" in unknown.stderr


def test_the_repl_lists_and_selects_skills_and_ctrl_c_stops_a_long_answer():
    term = Terminal(chat_args("--max-tokens", "2000"))
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
    at = term.read_until("[stopped]", start=at, timeout=60)
    at = term.read_until("> ", start=at, timeout=60)
    # The conversation goes on after the stop.
    term.send("/reset\r")
    at = term.read_until("a new conversation", start=at)
    term.send("/exit\r")
    assert term.wait(60) == 0, term.seen

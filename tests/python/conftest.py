"""Starts the real skillhost binary on a free port for the Python client tests."""

import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# CI may keep cargo's output outside the clone.
BINARY = ROOT / os.environ.get("CARGO_TARGET_DIR", "target") / "release" / "skillhost"
DEFAULT_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA_MODEL = ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"
# Start-up includes loading the model; on a loaded 2-core CI machine that can be slow.
START_TIMEOUT_S = 180


def child_env():
    """This process's environment without any SKILLHOST_* variable: each one
    sets a flag (a temperature, a config file, a skills folder, a system
    message), so one left in the caller's shell would change what a test's
    model is asked, and so what it answers, on that host only."""
    return {name: value for name, value in os.environ.items() if not name.startswith("SKILLHOST_")}


def names_flag(args, flag):
    return any(arg == flag or arg.startswith(flag + "=") for arg in args)


class RunningServer:
    def __init__(self, args):
        for path in (BINARY, DEFAULT_MODEL):
            if not path.exists():
                pytest.fail(f"{path} is missing: run `make test` (it builds and fetches everything)")
        self.log = []
        # Without a folder named, the registry would also read the host's
        # install folder ($XDG_DATA_HOME/skillhost/skills, or
        # /var/lib/skillhost/skills as root) and every .agents/skills from
        # the working directory up to its Git root, and whatever skills a
        # host has installed would enter every prompt. Each server gets an
        # empty install folder and runs in a folder of its own that holds a
        # `.git` marker, so discovery stops there (even where the temp
        # folder sits inside a repository) and finds nothing. Every path the
        # tests pass is absolute, so the working directory changes nothing else.
        self.home = Path(tempfile.mkdtemp(prefix="skillhost-test-server-"))
        (self.home / ".git").mkdir()
        if not names_flag(args, "--skills-install-dir"):
            (self.home / "installed").mkdir()
            args = [*args, "--skills-install-dir", str(self.home / "installed")]
        # Stored responses go to a folder of the server's own, not the
        # host's state folder, unless the test names one (to restart on it).
        if not names_flag(args, "--state-dir"):
            args = [*args, "--state-dir", str(self.home / "state")]
        self.process = subprocess.Popen(
            [str(BINARY), "serve", "--host", "127.0.0.1", "--port", "0", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=self.home,
            env={**child_env(), "RUST_LOG": "info,llama-cpp-2=warn"},
        )
        self._listening = threading.Event()
        self.url = None
        threading.Thread(target=self._read_log, daemon=True).start()
        if not self._listening.wait(START_TIMEOUT_S):
            self.stop()
            pytest.fail("the server did not start listening:\n" + "".join(self.log))
        self._wait_healthy()

    def _read_log(self):
        for line in self.process.stderr:
            self.log.append(line)
            match = re.search(r"listening on (http://\S+)", line)
            if match and self.url is None:
                self.url = match.group(1)
                self._listening.set()

    def _wait_healthy(self):
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail("the server exited:\n" + "".join(self.log))
            try:
                with urllib.request.urlopen(self.url + "/health") as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        pytest.fail("the server never became healthy:\n" + "".join(self.log))

    def metric(self, name):
        with urllib.request.urlopen(self.url + "/metrics") as response:
            for line in response.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        raise AssertionError(f"no metric {name}")

    def kill(self):
        """SIGKILL, as a crash: nothing gets to clean up or flush."""
        self.process.kill()
        self.process.wait()

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.home, ignore_errors=True)


@pytest.fixture(scope="session")
def server():
    running = RunningServer(["--model", str(DEFAULT_MODEL), "--parallel", "8", "--ctx-size", "8192"])
    yield running
    running.stop()


@pytest.fixture(scope="session")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused")


@pytest.fixture
def start_server():
    started = []

    def start(*args):
        running = RunningServer(list(args))
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()

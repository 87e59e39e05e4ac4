"""Starts the real skillhost binary on a free port for the Python client tests."""

import os
import re
import subprocess
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


class RunningServer:
    def __init__(self, args):
        for path in (BINARY, DEFAULT_MODEL):
            if not path.exists():
                pytest.fail(f"{path} is missing: run `make test` (it builds and fetches everything)")
        self.log = []
        self.process = subprocess.Popen(
            [str(BINARY), "serve", "--host", "127.0.0.1", "--port", "0", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "RUST_LOG": "info,llama-cpp-2=warn"},
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

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()


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

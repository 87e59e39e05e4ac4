"""Code execution on the real model and the real sandbox: a shell call the
model writes runs confined, its result feeds the next round, and the
request's folder is gone when the response ends."""

import os
import subprocess
import tempfile
from pathlib import Path

import httpx
import pytest

from conftest import BINARY, DEFAULT_MODEL


def open_temp_dir():
    """A folder the sandbox user can reach (pytest's own tmp_path sits under a
    root-only folder)."""
    folder = tempfile.TemporaryDirectory(prefix="skillhost-test-")
    Path(folder.name).chmod(0o755)
    return folder


def test_a_forced_shell_call_runs_and_its_folder_is_deleted(start_server):
    folder = open_temp_dir()
    tmp_path = Path(folder.name)
    server = start_server(
        "--model", str(DEFAULT_MODEL),
        "--no-skills", "--code-exec", "--workspace-dir", str(tmp_path), "--ctx-size", "4096",
    )
    log = "".join(server.log)
    assert "sandbox: commands start inside the sandbox" in log, log
    body = {
        "messages": [{"role": "user", "content": "Use the shell tool to run: echo hello"}],
        # Round 1 must call shell; later rounds are free to answer.
        "tool_choice": {"type": "function", "function": {"name": "shell"}},
        "parallel_tool_calls": False,
        "temperature": 0,
        # The budget is the turn's, all rounds together. The forced call's
        # command is the model's to write, and a call cut by the budget never
        # runs: this one leaves room for a long command and a round after it,
        # while still bounding what the free rounds write.
        "max_tokens": 256,
    }
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=600)
    assert response.status_code == 200, response.text
    reply = response.json()
    rounds = reply["rounds"]
    assert len(rounds) >= 2, reply
    # Round 2 reuses round 1 from the cache and adds the call's result.
    assert rounds[1]["cached_tokens"] > 0, rounds
    assert rounds[1]["prompt_tokens"] > rounds[0]["prompt_tokens"] + rounds[0]["generated_tokens"], rounds
    # No tool-call markup reaches the client.
    assert "<tool_call>" not in (reply["choices"][0]["message"]["content"] or "")
    workspaces = list(tmp_path.glob("skillhost-*/workspaces/*"))
    # The start-up probe's scratch folder is gone too; nothing is left.
    assert workspaces == [], workspaces


def test_forcing_shell_without_code_exec_is_a_400(start_server):
    server = start_server("--model", str(DEFAULT_MODEL), "--no-skills", "--ctx-size", "4096")
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "tool_choice": {"type": "function", "function": {"name": "shell"}},
        "max_tokens": 8,
    }
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=600)
    # Without --code-exec there is no shell tool to force.
    assert response.status_code == 400, response.text
    assert "shell" in response.json()["error"]["message"]


def test_a_workspace_dir_the_sandbox_user_cannot_reach_stops_start_up(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("only a root server hands commands to the sandbox user")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    result = subprocess.run(
        [str(BINARY), "serve", "--model", str(DEFAULT_MODEL), "--port", "0", "--code-exec",
         "--workspace-dir", str(private / "work"), "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode != 0
    assert "--workspace-dir" in result.stderr and "cannot reach" in result.stderr, result.stderr


def test_the_server_removes_its_own_folders_when_it_stops(start_server):
    folder = open_temp_dir()
    server = start_server(
        "--model", str(DEFAULT_MODEL), "--no-skills", "--code-exec", "--workspace-dir", folder.name,
        "--ctx-size", "2048",
    )
    # Random names, never the pid: a local user cannot make them first.
    made = [p for p in Path(folder.name).iterdir() if p.name.startswith("skillhost-")]
    assert len(made) == 1 and made[0].is_dir(), made
    assert str(server.process.pid) not in made[0].name
    assert oct(made[0].stat().st_mode & 0o777) == "0o711"
    # A Web UI conversation keeps its workspace (a size-capped tmpfs when
    # the server is root) after its request ends...
    body = {
        "messages": [{"role": "user", "content": "Use the shell tool to run: echo hello"}],
        "tool_choice": {"type": "function", "function": {"name": "shell"}},
        "maxTokens": 32,
    }
    response = httpx.post(server.url + "/api/chat", json=body, timeout=600)
    assert response.status_code == 200, response.text
    assert '"done":true' in response.text, response.text
    kept = list(made[0].glob("workspaces/ws-*"))
    assert len(kept) == 1, kept
    if os.geteuid() == 0:
        assert str(kept[0]) in mounts(), "the conversation's workspace is not a tmpfs"
    # ...and the server removes it, mount and all, when it stops.
    server.stop()
    assert server.process.returncode == 0, "".join(server.log)
    assert not made[0].exists()
    assert not [m for m in mounts() if m.startswith(str(made[0]))]


def mounts():
    with open("/proc/self/mountinfo") as table:
        return [line.split()[4] for line in table]

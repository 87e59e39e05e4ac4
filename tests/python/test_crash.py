"""A crash test of the state folder: 20 turns (background responses,
detached Web UI turns with a command in their folder, and Web UI turns
read to their end), each cut by `kill -9` at a random point, with a
restart on the same folders after each. After every restart the store
opens and passes SQLite's check, nothing the server had acknowledged is
lost (an accepted background response and a conversation whose first frame
went out are there, and a turn whose `done` frame went out has its answer
and its files), nothing is lost silently (a cut turn says the server
stopped), and the killed server left no folder, mount, temp folder or uid
lease behind.

The model is scripted (`scripted_upstream.py`), and the random points come
from a fixed seed, so every host runs the same 20 cuts."""

import fcntl
import json
import random
import sqlite3
import tempfile
import time
from pathlib import Path

import httpx

from scripted_upstream import ScriptedUpstream, call, say

TURNS = 20
ANSWER = " ".join(f"part{n}" for n in range(40))
UID_LOCKS = Path("/run/skillhost/uids")


def script(body):
    """A Web UI turn runs one command in its folder, then answers; a
    Responses turn answers at once."""
    messages = body.get("messages", [])
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    ran = any(m["role"] == "tool" for m in messages[last_user:])
    if "shell" in [t["function"]["name"] for t in body.get("tools", [])] and not ran:
        return call("shell", {"command": "echo kept > note.txt && echo done"})
    return say(ANSWER)


def held_leases():
    """How many sandbox uid leases some process holds now."""
    held = 0
    for lock in UID_LOCKS.glob("*") if UID_LOCKS.is_dir() else []:
        with open(lock, "rb") as file:
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(file, fcntl.LOCK_UN)
            except BlockingIOError:
                held += 1
    return held


def mounts_under(folder):
    with open("/proc/self/mountinfo") as table:
        return [line.split()[4] for line in table if line.split()[4].startswith(str(folder))]


def first_frame(url, body):
    """Starts a Web UI turn and leaves after its first frame, as a closed
    page does; returns the conversation id."""
    with httpx.stream("POST", url + "/api/chat", json=body, timeout=60) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: "):
                return json.loads(line[6:])["conversationId"]
    raise AssertionError("the turn sent no frame")


def whole_turn(url, body):
    """Reads a Web UI turn to its `done` frame; returns the conversation id."""
    with httpx.stream("POST", url + "/api/chat", json=body, timeout=60) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: "):
                frame = json.loads(line[6:])
                if frame.get("done"):
                    return frame["conversationId"]
    raise AssertionError("the turn did not finish")


def test_twenty_turns_cut_by_kill_9_lose_nothing_acknowledged_and_leave_nothing(start_server, tmp_path, monkeypatch):
    # The sandbox user must pass through to the workspaces (pytest's own
    # tmp_path sits under a root-only folder); the servers' temp folder is
    # a fresh one, so what a killed server left there can be counted.
    reachable = tempfile.TemporaryDirectory(prefix="skillhost-crash-", dir=tempfile.gettempdir())
    base = Path(reachable.name)
    base.chmod(0o755)
    temp = base / "tmp"
    temp.mkdir()
    workspaces = base / "workspaces"
    workspaces.mkdir()
    workspaces.chmod(0o755)
    monkeypatch.setenv("TMPDIR", str(temp))
    state = tmp_path / "state"
    upstream = ScriptedUpstream(script, delay=0.02)
    args = ["--upstream", f"{upstream.url},mode=chat", "--state-dir", str(state), "--code-exec",
            "--workspace-dir", str(workspaces)]
    rng = random.Random(29)
    background = {}   # response id -> acknowledged
    conversations = {}  # conversation id -> whether its done frame went out
    try:
        server = start_server(*args)
        baseline = held_leases()
        for turn in range(TURNS):
            kind = ("background", "detached", "read")[turn % 3]
            if kind == "background":
                made = httpx.post(server.url + "/v1/responses", timeout=60,
                                  json={"model": "scripted", "input": f"Turn {turn}.", "background": True})
                assert made.status_code == 200, made.text
                background[made.json()["id"]] = True
            else:
                body = {"messages": [{"role": "user", "content": f"Turn {turn}: write a note."}]}
                if kind == "detached":
                    conversations[first_frame(server.url, body)] = False
                else:
                    conversations[whole_turn(server.url, body)] = True
            time.sleep(rng.uniform(0.0, 1.2))
            server.kill()

            # The server is down: the store file passes SQLite's own check,
            # and a turn whose `done` frame went out kept its note.txt.
            with sqlite3.connect(f"file:{state / 'state.db'}?mode=ro", uri=True) as db:
                assert db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
                for conversation, done in conversations.items():
                    if done:
                        kept = db.execute("SELECT path, content FROM webui_files WHERE conversation_id = ?",
                                          (conversation,)).fetchall()
                        assert ("note.txt", b"kept\n") in kept, (conversation, kept)

            server = start_server(*args)
            # Nothing acknowledged is lost, and nothing is lost silently.
            for response_id in background:
                got = httpx.get(f"{server.url}/v1/responses/{response_id}", timeout=30).json()
                if got["status"] == "completed":
                    assert got["output"][0]["content"][0]["text"] == ANSWER, got
                else:
                    assert got["status"] == "failed" and "the server stopped" in got["error"]["message"], got
            listed = {c["id"] for c in httpx.get(server.url + "/api/conversations", timeout=30).json()["data"]}
            for conversation, done in conversations.items():
                assert conversation in listed, conversation
                stored = httpx.get(f"{server.url}/api/conversations/{conversation}", timeout=30).json()
                assert not stored["running"]
                last = stored["messages"][-1]
                assert last["role"] == "assistant", stored
                if done or "note" not in last:
                    assert last["content"] == ANSWER and last["finish_reason"] == "stop", stored
                else:
                    assert "the server stopped" in last["note"], stored
            # The killed server left no folder, mount or temp folder, and
            # holds no lease.
            folders = [p.name for p in workspaces.iterdir() if p.name.startswith("skillhost-")]
            assert len(folders) == 1, folders
            assert all(m.startswith(str(workspaces / folders[0])) for m in mounts_under(workspaces)), mounts_under(workspaces)
            profiles = [p.name for p in temp.iterdir() if p.name.startswith("skillhost-profiles-")]
            assert len(profiles) <= 1, profiles
            assert held_leases() <= baseline, (held_leases(), baseline)
        assert len(background) + len(conversations) == TURNS
    finally:
        upstream.close()
        reachable.cleanup()

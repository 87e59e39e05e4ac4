"""Two skillhost replicas (`--replica-id`), straight and behind HAProxy with
the configuration in deploy/haproxy.cfg: a conversation stays on the
replica that issued it, and one that lands elsewhere gets a 409 naming it."""

import json
import re
import shutil
import socket
import subprocess
import time

import httpx
import pytest

from conftest import DEFAULT_MODEL, ROOT, RunningServer


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def replicas():
    started = [
        RunningServer(["--model", str(DEFAULT_MODEL), "--no-skills", "--replica-id", name, "--ctx-size", "2048"])
        for name in ("r1", "r2")
    ]
    yield started
    for server in started:
        server.stop()


def chat(url, conversation=None, cookies=None):
    body = {"messages": [{"role": "user", "content": "Say hi."}], "maxTokens": 4}
    if conversation:
        body["conversationId"] = conversation
    return httpx.post(url + "/api/chat", json=body, cookies=cookies, timeout=300)


def conversation_of(response):
    frames = [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")]
    done = [f for f in frames if f.get("done")]
    assert done, response.text
    return done[-1]["conversationId"]


def test_a_conversation_named_on_the_wrong_replica_is_a_409_naming_its_owner(replicas):
    r1, r2 = replicas
    first = chat(r1.url)
    assert first.status_code == 200, first.text
    assert first.headers["x-skillhost-replica"] == "r1"
    assert first.cookies.get("skillhost_replica") == "r1"
    conversation = conversation_of(first)
    assert conversation.endswith("__r1"), conversation
    # The owner continues it.
    again = chat(r1.url, conversation)
    assert again.status_code == 200 and conversation_of(again) == conversation
    # Another replica refuses it, naming the conversation and its owner,
    # instead of starting an empty one.
    wrong = chat(r2.url, conversation)
    assert wrong.status_code == 409, wrong.text
    message = wrong.json()["error"]
    assert conversation in message and "replica r1" in message and "this is replica r2" in message, message
    closed = httpx.delete(f"{r2.url}/api/conversations/{conversation}", timeout=30)
    assert closed.status_code == 409
    # So is a download of another replica's produced files.
    files = httpx.get(f"{r2.url}/api/code/artifacts/run-abc__r1/out.txt", timeout=30)
    assert files.status_code == 409 and "run run-abc__r1 lives on replica r1" in files.json()["error"], files.text


def test_a_stored_response_named_on_the_wrong_replica_is_a_409(replicas):
    r1, r2 = replicas
    made = httpx.post(r1.url + "/v1/responses", json={"input": "Say hi.", "max_output_tokens": 4}, timeout=300)
    assert made.status_code == 200, made.text
    response_id = made.json()["id"]
    assert response_id.endswith("__r1")
    follow = {"input": "Again.", "previous_response_id": response_id, "max_output_tokens": 4}
    assert httpx.post(r1.url + "/v1/responses", json=follow, timeout=300).status_code == 200
    wrong = httpx.post(r2.url + "/v1/responses", json=follow, timeout=300)
    assert wrong.status_code == 409, wrong.text
    assert response_id in wrong.json()["error"]["message"]


def test_haproxy_with_the_deploy_config_keeps_each_conversation_on_its_replica(replicas, tmp_path):
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        pytest.fail("haproxy is missing: `make test` installs it (apt-get install haproxy)")
    r1, r2 = replicas
    port = free_port()
    config = (ROOT / "deploy" / "haproxy.cfg").read_text()
    # The shipped file, pointed at this test's ports.
    config = config.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
    config = config.replace("127.0.0.1:5001", r1.url.removeprefix("http://"))
    config = config.replace("127.0.0.1:5002", r2.url.removeprefix("http://"))
    assert re.search(r"^\s*cookie skillhost_replica\s*$", config, re.M), "the deploy config lost its cookie rule"
    path = tmp_path / "haproxy.cfg"
    path.write_text(config)
    checked = subprocess.run([haproxy, "-c", "-f", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    process = subprocess.Popen([haproxy, "-db", "-f", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    front = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(front + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "haproxy never answered"
            time.sleep(0.2)
        # Several clients: each is balanced once, then stays put.
        owners = set()
        for _ in range(4):
            first = chat(front)
            assert first.status_code == 200, first.text
            owner = first.cookies.get("skillhost_replica")
            owners.add(owner)
            conversation = conversation_of(first)
            assert conversation.endswith("__" + owner)
            for _ in range(3):
                turn = chat(front, conversation, cookies={"skillhost_replica": owner})
                assert turn.status_code == 200, turn.text
                assert turn.headers["x-skillhost-replica"] == owner
                assert conversation_of(turn) == conversation
        assert owners == {"r1", "r2"}, owners
    finally:
        process.terminate()
        process.wait(10)

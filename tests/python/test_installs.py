"""Host-run installs: a shell call with a pip install in it, and the host
reads the install out of the line and performs it from a package index this
test serves on 127.0.0.1 (a wheel built from tests/packages/), through the
install proxy. The call comes from a scripted model (scripted_upstream.py):
what is tested is the host's installer, so the command it reads is the
test's, never what the small real model chose to write."""

import json
import time

import httpx

from local_index import PACKAGES, Index, build_wheel
from scripted_upstream import ScriptedUpstream, call, say, text_of, tool_names
from test_code_exec import open_temp_dir

INSTALL = "pip install skillhost-probe"
INSTALLED = "The package is installed."


def install_script(body):
    """One shell call that installs the probe, then an answer once the
    call's result is back."""
    if any(m["role"] == "tool" for m in body["messages"]):
        return say(INSTALLED)
    return call("shell", {"command": INSTALL})


def logged(server, text, timeout=10):
    """The log lines that hold `text`, waiting a little for them: the log is
    read on a thread of its own, so a line can come after the response."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [line for line in server.log if text in line]
        if lines or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def test_the_host_performs_a_pip_install_the_model_asked_for(start_server, tmp_path):
    wheel = build_wheel(PACKAGES / "skillhost-probe", "skillhost-probe", tmp_path)
    index = Index(tmp_path)
    upstream = ScriptedUpstream(install_script)
    folder = open_temp_dir()
    try:
        server = start_server(
            "--upstream", f"{upstream.url},mode=chat", "--no-skills", "--code-exec", "--code-exec-allow-install",
            "--code-exec-install-index", index.url + "/simple", "--workspace-dir", folder.name,
        )
        log = "".join(server.log)
        assert "capability: the host installs packages for shell commands" in log, log
        body = {"messages": [{"role": "user", "content": "Install skillhost-probe with pip."}]}
        response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=600)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"] == INSTALLED, response.text
        assert "shell" in tool_names(upstream.requests[0]), upstream.requests[0]
        answered = logged(server, 'tool answered tool="shell"')
        assert len(answered) == 1, "".join(server.log)
        assert f'detail=Some("{INSTALL}")' in answered[0] and "ok=true" in answered[0], answered
        # The installer fetched the wheel from this test's index, through the
        # install proxy it is given (which forwards only to the install hosts).
        assert f"/simple/skillhost-probe/{wheel.name}" in index.fetched, index.fetched
        # The command's result went back to the model as the call's answer.
        messages = upstream.requests[-1]["messages"]
        made = [c for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
        results = [m for m in messages if m["role"] == "tool"]
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in made] == [
            ("shell", {"command": INSTALL})], made
        assert [m["tool_call_id"] for m in results] == [made[0]["id"]], results
        assert text_of(results[0]), results
    finally:
        upstream.close()
        index.close()
        folder.cleanup()

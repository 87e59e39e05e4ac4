"""Host-run installs on the real model: the model is made to call the shell
with a pip install, and the host reads the install out of the line and
performs it from a package index this test serves on 127.0.0.1 (a wheel
built from tests/packages/), through the install proxy."""

import httpx

from conftest import DEFAULT_MODEL
from local_index import PACKAGES, Index, build_wheel
from test_code_exec import open_temp_dir


def test_the_host_performs_a_pip_install_the_model_was_made_to_run(start_server, tmp_path):
    wheel = build_wheel(PACKAGES / "skillhost-probe", "skillhost-probe", tmp_path)
    index = Index(tmp_path)
    folder = open_temp_dir()
    try:
        server = start_server(
            "--model", str(DEFAULT_MODEL), "--no-skills", "--code-exec", "--code-exec-allow-install",
            "--code-exec-install-index", index.url + "/simple", "--workspace-dir", folder.name, "--ctx-size", "4096",
        )
        log = "".join(server.log)
        assert "capability: the host installs packages for shell commands" in log, log
        body = {
            "messages": [{"role": "user", "content": "Use the shell tool to run: pip install skillhost-probe"}],
            "tool_choice": {"type": "function", "function": {"name": "shell"}},
            "parallel_tool_calls": False,
            "temperature": 0,
            "max_tokens": 64,
        }
        response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=600)
        assert response.status_code == 200, response.text
        answered = [line for line in server.log if 'tool answered tool="shell"' in line]
        assert answered, "".join(server.log)
        # What the model wrote is its own; this prompt makes the small model
        # write the install it names.
        assert 'detail=Some("pip install skillhost-probe")' in answered[0], answered
        assert "ok=true" in answered[0], answered
        # The installer fetched the wheel from this test's index, through the
        # install proxy it is given (which forwards only to the install hosts).
        assert f"/simple/skillhost-probe/{wheel.name}" in index.fetched, index.fetched
    finally:
        index.close()
        folder.cleanup()

"""Host-run installs on the real model: the model is made to call the shell
with a pip install, and the host reads the install out of the line and
performs it from a package index this test serves on 127.0.0.1 (a wheel
built from tests/packages/), through the install proxy."""

import base64
import hashlib
import http.server
import threading
import zipfile
from pathlib import Path

import httpx

from conftest import DEFAULT_MODEL, ROOT
from test_code_exec import open_temp_dir

PACKAGES = ROOT / "tests" / "packages"


def build_wheel(folder: Path, name: str, out: Path) -> Path:
    """Zips tests/packages/<name>'s module into a py3-none-any wheel."""
    module = name.replace("-", "_")
    dist_info = f"{module}-1.0.dist-info"
    files = {f"{module}/{p.name}": p.read_bytes() for p in (folder / module).iterdir() if p.is_file()}
    files[f"{dist_info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode()
    files[f"{dist_info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: skillhost-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = out / "simple" / name / f"{module}-1.0-py3-none-any.whl"
    wheel.parent.mkdir(parents=True)
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    (wheel.parent / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    return wheel


class Index:
    """A static package index on 127.0.0.1 that records what was fetched."""

    def __init__(self, root: Path):
        fetched = self.fetched = []

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(root), **kwargs)

            def do_GET(self):
                fetched.append(self.path)
                super().do_GET()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


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

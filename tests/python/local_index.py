"""A package index on 127.0.0.1 serving wheels built from tests/packages/,
for the install tests and the code arm of `make eval`: the host's installer
runs for real and nothing reaches the internet."""

import base64
import hashlib
import http.server
import threading
import zipfile
from pathlib import Path

PACKAGES = Path(__file__).resolve().parents[1] / "packages"


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


def publish(root: Path, *names: str) -> Index:
    """Builds a wheel of each tests/packages/<name> under root and serves root."""
    for name in names:
        build_wheel(PACKAGES / name, name, root)
    return Index(root)

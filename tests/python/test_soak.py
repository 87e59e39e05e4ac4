"""A short soak of the real server (`make soak` runs the long one)."""

import os
import tempfile

from conftest import DEFAULT_MODEL
from soak import run

SOAK_SECONDS = float(os.environ.get("SOAK_SECONDS", "45"))


def test_short_soak_leaves_nothing_behind(start_server):
    # Sandbox uids must pass through the workspace folder (pytest's own
    # temp folders are closed to other users).
    with tempfile.TemporaryDirectory(prefix="skillhost-soak-") as workspace_dir:
        os.chmod(workspace_dir, 0o755)
        server = start_server(
            "--model", str(DEFAULT_MODEL), "--parallel", "4", "--max-queued", "8",
            "--code-exec", "--workspace-dir", workspace_dir,
        )
        figures = run(server.url, server.process.pid, server.log, workspace_dir, SOAK_SECONDS, clients=6)
        server.stop()
    print(figures)
    assert figures["requests"] > 0 and figures.get("disconnected", 0) > 0

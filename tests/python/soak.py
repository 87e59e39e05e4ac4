"""A soak of the real server: concurrent streaming clients on every surface
that disconnect at random points, for a while. Afterwards nothing may be
left behind: no 5xx, no panic in the log, no busy slot or admission place,
no workspace, working helper process (helpers started ahead of
commands may wait) or temp folder, and resident memory back near
its level after warm-up.

`make soak` runs it for ten minutes (SOAK_MINUTES to change) and prints the
figures; `make test` runs a short one through test_soak.py.
"""

import argparse
import json
import os
import random
import sys
import threading
import time
from pathlib import Path

import httpx

SURFACES = ("openai", "webui", "ollama")
PROMPTS = [
    "Say hello.",
    "Count from one to twenty.",
    "Write a short poem about the sea.",
    "List three colours.",
    "Explain what a lighthouse does.",
]


def vm_kib(pid, field):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field}")


def children(pid):
    """Every process whose parent chain leads to `pid`."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


# Helpers the launcher starts ahead of their commands (launch.rs,
# WARM_HELPERS); they wait on stdin with nothing of their own.
WARM_HELPERS = 2


def waiting_helpers(pid, found):
    """The processes in `found` that are helpers started ahead and still
    waiting for a command: `sandbox-warm`, a child of the server, with no
    children of their own."""
    waiting = set()
    for child in found:
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            parent = int(Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent != pid or argv[1:2] != [b"sandbox-warm"]:
            continue
        if not children(child):
            waiting.add(child)
    return waiting


def working_children(pid):
    """Every descendant of `pid` but helpers waiting for a command, and how
    many of those wait."""
    found = children(pid)
    waiting = waiting_helpers(pid, found)
    return found - waiting, len(waiting)


def metric(url, name):
    text = httpx.get(url + "/metrics").text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def one_request(url, rng, stats):
    surface = rng.choice(SURFACES)
    prompt = rng.choice(PROMPTS)
    tokens = rng.randint(4, 48)
    messages = [{"role": "user", "content": prompt}]
    if surface == "openai":
        path, body = "/v1/chat/completions", {"messages": messages, "max_tokens": tokens, "stream": True}
    elif surface == "webui":
        path, body = "/api/chat", {"messages": messages, "maxTokens": tokens}
    else:
        path, body = "/ollama/api/chat", {"messages": messages, "options": {"num_predict": tokens}, "stream": True}
    # Read this many lines, then hang up; -1 reads to the end.
    cut = rng.choice([-1, -1, 0, 1, 2, 5, 10])
    with httpx.stream("POST", url + path, json=body, timeout=300) as response:
        stats.count(f"status {response.status_code}")
        if response.status_code >= 500:
            stats.count("5xx")
            return
        read, last = 0, ""
        for line in response.iter_lines():
            read += 1
            if line.strip():
                last = line
            if cut >= 0 and read >= cut:
                stats.count("disconnected")
                break
        else:
            stats.count("completed")
    # A Web UI turn whose final frame arrived named its conversation (even
    # if the client hung up right after); closing it is what the page's
    # "New chat" does. One whose client left before learning the id is
    # closed by the server.
    if surface == "webui" and last.startswith("data: "):
        conversation = json.loads(last[len("data: "):]).get("conversationId")
        if conversation:
            httpx.delete(f"{url}/api/conversations/{conversation}", timeout=60)


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}

    def count(self, key):
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1


def run(url, pid, log, workspace_dir, seconds, clients, seed=7):
    """Soaks a running server; returns the figures, raising AssertionError
    when something was left behind."""
    rng = random.Random(seed)
    stats = Stats()
    # Warm up: every surface once, to the end.
    for surface_seed in range(len(SURFACES) * 2):
        one_request(url, random.Random(surface_seed), Stats())
    time.sleep(1)
    rss_warm = vm_kib(pid, "VmRSS")
    temp_before = sorted(os.listdir(workspace_dir))
    deadline = time.monotonic() + seconds
    errors = []

    def client(index):
        local = random.Random(rng.random() + index)
        while time.monotonic() < deadline:
            try:
                one_request(url, local, stats)
            except httpx.HTTPError as err:
                errors.append(repr(err))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    # The engine notices a closed stream at its next step; give it a moment.
    settle_deadline = time.monotonic() + 30
    while time.monotonic() < settle_deadline:
        busy = metric(url, "skillhost_active_slots") + metric(url, "skillhost_admitted_requests")
        if busy == 0 and not working_children(pid)[0]:
            break
        time.sleep(0.5)
    time.sleep(1)
    figures = {
        "seconds": round(elapsed, 1),
        "clients": clients,
        "requests": sum(v for k, v in stats.counts.items() if k.startswith("status ")),
        **stats.counts,
        "client errors": len(errors),
        "rss after warm-up (MiB)": round(rss_warm / 1024, 1),
        "rss after soak (MiB)": round(vm_kib(pid, "VmRSS") / 1024, 1),
        "active slots after": metric(url, "skillhost_active_slots"),
        "admitted after": metric(url, "skillhost_admitted_requests"),
        "queued after": metric(url, "skillhost_queued_requests"),
    }
    working, waiting = working_children(pid)
    figures["helper processes after"] = len(working)
    figures["helpers waiting ahead"] = waiting
    text = "".join(log)
    figures["panics in log"] = text.count("panicked")
    workspaces = [p for p in Path(workspace_dir).glob("skillhost-*/workspaces/*")]
    figures["workspaces after"] = len(workspaces)
    # A Web UI client that hangs up just as the final frame (naming the
    # conversation) is written cannot be told apart from one that read it:
    # that conversation stays open (at most 16 for one caller, for 30 idle minutes), with
    # its workspace. Every workspace left must belong to one.
    figures["open conversations"] = metric(url, "skillhost_open_conversations")
    figures["workspaces not held by a conversation"] = max(0, len(workspaces) - int(figures["open conversations"]))
    figures["temp entries changed"] = sorted(os.listdir(workspace_dir)) != temp_before
    problems = []
    if stats.counts.get("5xx"):
        problems.append("5xx answers")
    if errors:
        problems.append(f"client errors: {errors[:3]}")
    for key in ("active slots after", "admitted after", "queued after", "helper processes after",
                "panics in log", "workspaces not held by a conversation"):
        if figures[key]:
            problems.append(f"{key}: {figures[key]}")
    if waiting > WARM_HELPERS:
        problems.append(f"{waiting} helpers wait ahead of commands; the launcher keeps {WARM_HELPERS}")
    if figures["temp entries changed"]:
        problems.append("the workspace folder's entries changed")
    # Allocators keep some memory; growth past this means a leak.
    if rss_warm and vm_kib(pid, "VmRSS") > rss_warm + 48 * 1024:
        problems.append("resident memory did not come back near its level after warm-up")
    if problems:
        raise AssertionError(json.dumps(figures, indent=2) + "\n" + "\n".join(problems))
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES", "10")))
    parser.add_argument("--clients", type=int, default=6)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    import conftest

    import tempfile

    with tempfile.TemporaryDirectory(prefix="skillhost-soak-") as workspace_dir:
        os.chmod(workspace_dir, 0o755)
        server = conftest.RunningServer([
            "--model", str(conftest.DEFAULT_MODEL), "--parallel", "4", "--max-queued", "8",
            "--code-exec", "--workspace-dir", workspace_dir,
        ])
        try:
            figures = run(server.url, server.process.pid, server.log, workspace_dir, args.minutes * 60, args.clients)
        finally:
            server.stop()
    for key, value in figures.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()

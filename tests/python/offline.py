"""Runs a client in a network namespace of its own whose one way out is a
bridge to the test server, so nothing it sends can leave the machine.

The namespace has only a loopback interface and no routes. Inside it, a
relay listens on the test server's port on 127.0.0.1 and passes each
connection through a Unix socket (a file, which every namespace can reach)
to the bridge in the test process, which connects to the real server. The
bridge notes the first line of every request it carries, so a test can show
what the client asked for.

As a module it is the part that runs inside the namespace:
    python offline.py PORT SOCKET -- COMMAND...
"""

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REQUEST_LINE = re.compile(rb"^(GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS) (\S+) HTTP/1\.[01]\r\n")
BUFFER = 65536


def _pipe(source, sink, seen=None):
    try:
        while data := source.recv(BUFFER):
            if seen is not None and (match := REQUEST_LINE.match(data)):
                seen.append(f"{match.group(1).decode()} {match.group(2).decode()}")
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _join(a, b, seen=None):
    threading.Thread(target=_pipe, args=(a, b, seen), daemon=True).start()
    threading.Thread(target=_pipe, args=(b, a), daemon=True).start()


class Bridge:
    """The test process's end: a Unix socket that leads to the server."""

    def __init__(self, server_url, folder):
        address = re.match(r"http://([\d.]+):(\d+)", server_url)
        self.host, self.port = address.group(1), int(address.group(2))
        self.path = Path(folder) / "bridge.sock"
        self.requests = []
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self.path))
        self._listener.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection((self.host, self.port))
            _join(client, server, self.requests)

    def run(self, command, until=None, timeout=None, **kwargs):
        """Runs `command` in a new network namespace that reaches only the
        server; returns the CompletedProcess and what the namespace had.

        With `until`, a function of the lines printed so far and the requests
        carried so far, the command is killed (its whole process group) as
        soon as that holds: a test of what the model cannot decide stops
        before the rounds that the model does decide."""
        unshare = ["unshare", "--net"]
        if os.geteuid() != 0:
            unshare.append("--map-root-user")
        relay = [sys.executable, __file__, str(self.port), str(self.path), "--"]
        full = [*unshare, "--", *relay, *command]
        if until is None:
            return subprocess.run(full, capture_output=True, text=True, timeout=timeout, **kwargs)
        process = subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True, **kwargs)
        out, err = [], []
        readers = [threading.Thread(target=lambda s=s, into=into: into.extend(s), daemon=True)
                   for s, into in ((process.stdout, out), (process.stderr, err))]
        for reader in readers:
            reader.start()
        deadline = time.monotonic() + (timeout or 600)
        while process.poll() is None and not until(list(out), list(self.requests)):
            if time.monotonic() > deadline:
                os.killpg(process.pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(full, timeout, "".join(out), "".join(err))
            time.sleep(0.1)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        for reader in readers:
            reader.join(5)
        return subprocess.CompletedProcess(full, process.returncode, "".join(out), "".join(err))

    def close(self):
        self._listener.close()


def _inside(port, path, command):
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    # What the namespace holds, for the test's log: one interface, and
    # routes only through it.
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines()
    addresses = subprocess.run(["ip", "-o", "address"], capture_output=True, text=True).stdout.splitlines()
    routes = subprocess.run(["ip", "route", "show", "table", "all"], capture_output=True, text=True).stdout.splitlines()
    interfaces = sorted({line.split(":")[1].strip() for line in links})
    devices = sorted({word for line in routes for prev, word in zip(line.split(), line.split()[1:]) if prev == "dev"})
    print(f"offline: interfaces {', '.join(interfaces)}; addresses {', '.join(a.split()[3] for a in addresses)}; "
          f"{len(routes)} routes, through {', '.join(devices)}", file=sys.stderr, flush=True)
    listener = socket.create_server(("127.0.0.1", port))

    def accept():
        while True:
            client, _ = listener.accept()
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(path)
            _join(client, upstream)

    threading.Thread(target=accept, daemon=True).start()
    return subprocess.run(command).returncode


if __name__ == "__main__":
    split = sys.argv.index("--")
    sys.exit(_inside(int(sys.argv[1]), sys.argv[2], sys.argv[split + 1:]))

"""MCP both ways, with the official Python SDK (`mcp` on PyPI).

skillhost as an MCP server: the SDK's client lists and reads the bundled
skills from POST /mcp, byte for byte as they are on disk, and a key is
required when keys are set.

skillhost as an MCP client: `skillhost mcp list` starts real servers from
the registries confined over stdio (server-everything and
server-filesystem from npm, mcp-server-time from PyPI, installed by
`make mcp-deps`) and lists what they offer; the real model's forced call to
mcp__time__get_current_time reaches mcp-server-time over stdio, and a
streamable HTTP server built with the same SDK (mcp_time_server.py) on
127.0.0.1. Each call is counted in /metrics. What the model writes after a
call is free, so nothing else is checked of it."""

import asyncio
import hashlib
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

from conftest import BINARY, DEFAULT_MODEL, ROOT, RunningServer, child_env

SKILLS = ROOT / "skills"
KEY = "mcp-test-key"


@pytest.fixture(scope="module")
def server():
    running = RunningServer(["--model", str(DEFAULT_MODEL), "--skills-dir", str(SKILLS)])
    yield running
    running.stop()


async def session_calls(url, headers=None):
    """Lists tools and resources, reads every resource of skill-authoring,
    and calls skills_read, through the SDK's client."""
    client = create_mcp_http_client(headers=headers)
    async with client, streamable_http_client(url, http_client=client) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            tools = [tool.name for tool in (await session.list_tools()).tools]
            resources = [str(r.uri) for r in (await session.list_resources()).resources]
            read = {}
            for uri in resources:
                if uri.startswith("skill://skill-authoring/"):
                    contents = (await session.read_resource(uri)).contents[0]
                    read[uri] = contents.text if hasattr(contents, "text") else contents.blob
            called = await session.call_tool("skills_read", {"skill": "skill-authoring"})
            return tools, resources, read, called


def test_the_sdk_client_lists_and_reads_bundled_skills_as_they_are_on_disk(server):
    tools, resources, read, called = asyncio.run(session_calls(server.url + "/mcp"))
    assert tools == ["skills_list", "skills_read"]
    assert "skill://skill-authoring/SKILL.md" in resources and "skill://skillhost-api/SKILL.md" in resources
    skill_md = (SKILLS / "skill-authoring" / "SKILL.md").read_text()
    assert read["skill://skill-authoring/SKILL.md"] == skill_md
    for uri, text in read.items():
        path = SKILLS / "skill-authoring" / uri.removeprefix("skill://skill-authoring/")
        assert text == path.read_text(), uri
    assert not called.is_error and "skill-authoring" in called.content[0].text
    # The Skills extension: every file with its digest and size.
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "skills/list"}
    listed = httpx.post(server.url + "/mcp", json=rpc).json()["result"]["skills"]
    authoring = next(s for s in listed if s["uri"] == "skill://skill-authoring/SKILL.md")
    assert authoring["frontmatter"]["name"] == "skill-authoring"
    for entry in authoring["resources"]:
        data = (SKILLS / "skill-authoring" / entry["uri"].removeprefix("skill://skill-authoring/")).read_bytes()
        assert entry == {"uri": entry["uri"], "digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": len(data)}


def test_a_path_outside_the_skill_and_bad_messages_are_refused(server):
    url = server.url + "/mcp"
    for uri in ["skill://skill-authoring/../skillhost-api/SKILL.md", "skill://skill-authoring//etc/passwd", "file:///etc/passwd"]:
        rpc = {"jsonrpc": "2.0", "id": 2, "method": "resources/read", "params": {"uri": uri}}
        error = httpx.post(url, json=rpc).json()["error"]
        assert error["code"] == -32602, (uri, error)
    json_type = {"Content-Type": "application/json"}
    assert httpx.post(url, content=b"{not json", headers=json_type).status_code == 400
    # Only JSON: a form on another site's page cannot reach it.
    assert httpx.post(url, content=b"{}", headers={"Content-Type": "text/plain"}).status_code == 415
    unknown = httpx.post(url, json={"jsonrpc": "2.0", "id": 3, "method": "sampling/createMessage"}).json()
    assert unknown["error"]["code"] == -32601
    assert httpx.get(url).status_code == 405


def test_a_key_is_required_when_keys_are_set():
    running = RunningServer(["--model", str(DEFAULT_MODEL), "--skills-dir", str(SKILLS), "--api-key", KEY])
    try:
        rpc = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        assert httpx.post(running.url + "/mcp", json=rpc).status_code == 401
        tools, _, _, _ = asyncio.run(session_calls(running.url + "/mcp", {"Authorization": f"Bearer {KEY}"}))
        assert tools == ["skills_list", "skills_read"]
    finally:
        running.stop()


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def time_server():
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "mcp_time_server.py"), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp"
    process.kill()
    process.wait()


def mcp_calls(server):
    """skillhost_mcp_calls_total rows of /metrics, as {(server, tool, outcome): n}."""
    rows = {}
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line.startswith("skillhost_mcp_calls_total{"):
            labels, value = line[len("skillhost_mcp_calls_total{"):].split("} ")
            fields = dict(part.split("=", 1) for part in labels.split(","))
            key = tuple(fields[k].strip('"') for k in ("server", "tool", "outcome"))
            rows[key] = int(float(value))
    return rows


def assert_the_forced_time_call_ran(running):
    """Forces the real model's call of mcp__time__get_current_time and checks
    it ran on the time server: its answer (a time, or the tool's own error for
    a timezone it does not know) went back to the model."""
    body = {
        "messages": [{"role": "user", "content": "What time is it in Paris?"}],
        "tool_choice": {"type": "function", "function": {"name": "mcp__time__get_current_time"}},
        "max_tokens": 48,
        "temperature": 0,
    }
    reply = httpx.post(running.url + "/v1/chat/completions", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    calls = mcp_calls(running)
    answered = sum(n for (srv, tool, outcome), n in calls.items() if srv == "time" and tool == "get_current_time" and outcome in ("ok", "error"))
    assert answered >= 1, calls


def test_the_real_models_forced_call_reaches_a_streamable_http_server(time_server):
    servers = json.dumps({"time": {"url": time_server}})
    running = RunningServer(["--model", str(DEFAULT_MODEL), "--no-skills", "--mcp-servers", servers])
    try:
        listed = httpx.get(running.url + "/api/mcp", params={"start": "true"}, timeout=120).json()["servers"]
        assert listed[0]["state"] == "up" and listed[0]["tools"] == ["mcp__time__get_current_time"], listed
        assert_the_forced_time_call_ran(running)
    finally:
        running.stop()


MCP_SERVERS = ROOT / "tests" / "mcp-servers"


@pytest.fixture(scope="module")
def registry_servers():
    """The registry servers, copied where the sandbox user can read them (a
    checkout under /root is closed to it, and so is pytest's own temporary
    folder), as an mcpServers map."""
    for installed in ("node_modules/.installed", "python/.installed"):
        if not (MCP_SERVERS / installed).exists():
            pytest.fail(f"{MCP_SERVERS / installed} is missing: run `make test` (or make mcp-deps)")
    base = Path(tempfile.mkdtemp(prefix="skillhost-mcp-servers-"))
    for name in ("node_modules", "python"):
        shutil.copytree(MCP_SERVERS / name, base / name, symlinks=True)
    (base / "docs").mkdir()
    (base / "docs" / "notes.txt").write_text("read through server-filesystem\n")
    for path in [base, *base.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644 | (path.stat().st_mode & 0o111))
    packages = base / "node_modules" / "@modelcontextprotocol"
    yield {
        "time": {
            "command": "/usr/bin/python3",
            "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
            "env": {"PYTHONPATH": str(base / "python")},
            "read": [str(base)],
        },
        "files": {
            "command": "node",
            "args": [str(packages / "server-filesystem" / "dist" / "index.js"), str(base / "docs")],
            "read": [str(base)],
        },
        "everything": {
            "command": "node",
            "args": [str(packages / "server-everything" / "dist" / "index.js"), "stdio"],
            "read": [str(base)],
        },
    }
    shutil.rmtree(base)


def test_mcp_list_starts_the_registry_servers_confined_and_names_a_broken_one(registry_servers, tmp_path):
    servers = dict(registry_servers, gone={"url": f"http://127.0.0.1:{free_port()}/mcp"})
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": servers}))
    listed = subprocess.run(
        [str(BINARY), "mcp", "list", "--json", "--no-skills", "--mcp-config", str(config)],
        capture_output=True, text=True, timeout=300, env=child_env(),
    )
    # One server is down, so the exit status says so.
    assert listed.returncode == 1, listed.stderr
    reports = {report["name"]: report for report in json.loads(listed.stdout)["servers"]}
    for name in ("time", "files", "everything"):
        assert reports[name]["state"] == "up", reports[name].get("error")
    assert reports["time"]["tools"] == ["mcp__time__get_current_time", "mcp__time__convert_time"]
    assert "mcp__files__read_text_file" in reports["files"]["tools"]
    assert "mcp__everything__echo" in reports["everything"]["tools"] and reports["everything"]["prompts"]
    assert any(r["uri"].startswith("demo://") for r in reports["everything"]["resources"])
    assert reports["gone"]["state"] == "down" and "Connection refused" in reports["gone"]["error"], reports["gone"]
    # The text form names the same, for a person.
    text = subprocess.run(
        [str(BINARY), "mcp", "list", "--no-skills", "--mcp-config", str(config)],
        capture_output=True, text=True, timeout=300, env=child_env(),
    ).stdout
    assert "time  (stdio, /usr/bin/python3 -m mcp_server_time --local-timezone UTC)\n  up\n" in text, text


def test_the_real_models_forced_call_reaches_mcp_server_time_over_stdio(registry_servers):
    servers = json.dumps({"time": registry_servers["time"]})
    running = RunningServer(["--model", str(DEFAULT_MODEL), "--no-skills", "--mcp-servers", servers])
    try:
        assert_the_forced_time_call_ran(running)
        listed = httpx.get(running.url + "/api/mcp").json()["servers"]
        assert listed[0]["state"] == "up", listed
    finally:
        running.stop()

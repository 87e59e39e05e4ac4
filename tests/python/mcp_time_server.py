"""A streamable HTTP MCP server the MCP tests run on 127.0.0.1, built with
the official Python SDK (`mcp` on PyPI): one tool, get_current_time, the
tool of the reference mcp-server-time.

    python mcp_time_server.py PORT
"""

import sys
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from mcp.server.mcpserver import MCPServer

server = MCPServer("time")


@server.tool()
def get_current_time(timezone: str) -> str:
    """Get the current time in an IANA timezone, such as Europe/Paris."""
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown timezone {timezone!r}")
    return datetime.now(zone).isoformat(timespec="seconds")


if __name__ == "__main__":
    server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))

"""AWM's agent client side of an episode: mcp-agent 0.2.6 given only a URL (no headers), a fresh
MCP session per operation. Run by test_capability.py with the Python of a separate venv that
has ``mcp-agent==0.2.6`` and ``mcp<2`` (mcp-agent imports ``mcp.server.fastmcp``, gone in mcp 2):

    python -m venv /tmp/awm && /tmp/awm/bin/pip install mcp-agent==0.2.6 'mcp<2'
    ENVFARM_MCP_AGENT_PYTHON=/tmp/awm/bin/python pytest tests/envfarm/farm/test_capability.py

argv: the lease's mcp_url, then a JSON list of {tool, arguments}; prints one line per operation.
"""

import asyncio
import json
import sys

from mcp_agent.app import MCPApp
from mcp_agent.config import LoggerSettings, MCPServerSettings, MCPSettings, Settings
from mcp_agent.mcp.gen_client import gen_client


async def main(url: str, steps: list[dict]) -> None:
    settings = Settings(execution_engine="asyncio", logger=LoggerSettings(transports=["none"]),
                        mcp=MCPSettings(servers={"env": MCPServerSettings(
                            transport="streamable_http", url=url)}))
    async with MCPApp(name="awm-like", settings=settings).run() as app:
        registry = app.context.server_registry
        async with gen_client("env", registry) as session:
            tools = await session.list_tools()
        print("tools", len(tools.tools), flush=True)
        for step in steps:
            async with gen_client("env", registry) as session:
                res = await session.call_tool(step["tool"], step["arguments"])
            print("call", step["tool"], "error" if res.isError else "ok", flush=True)
        print("done", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], json.loads(sys.argv[2])))

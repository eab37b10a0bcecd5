"""The MCP face (official ``mcp`` SDK): tools ``deep_research``, ``search`` and ``visit``.

Served over Streamable HTTP at ``/mcp`` by ``drvenus serve`` and over stdio by ``drvenus mcp``.
``deep_research`` runs through the run registry (the same run limit, a stored trace);
``search`` and ``visit`` call the default tools preset directly and answer exactly what the
agent would read inside ``<tool_response>``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from drvenus.protocol import ToolCallError, normalize_tool_call
from drvenus.serve.runs import Busy, RunRegistry
from drvenus.serve.view import final_text

if TYPE_CHECKING:
    from mcp.server import MCPServer

log = logging.getLogger(__name__)

MCP_EXTRA_HINT = "the MCP server needs the mcp package: pip install 'drvenus[serve]'"
INSTRUCTIONS = (
    "drvenus is a deep research agent. deep_research(question) searches, reads pages and "
    "answers with the sources it read (it can take minutes). search(query) and visit(url, goal) "
    "are its two tools, for doing the research yourself."
)


def require_mcp() -> None:
    try:
        import mcp.server  # noqa: F401
    except ImportError as exc:
        raise ImportError(MCP_EXTRA_HINT) from exc


async def _call_tool(registry: RunRegistry, name: str, arguments: dict[str, Any]) -> str:
    try:
        call = normalize_tool_call({"name": name, "arguments": arguments})
    except ToolCallError as exc:
        return f"Error: {exc}"
    toolbox = await registry.pool.toolbox()
    return await toolbox.call(call)


def build_mcp(registry: RunRegistry) -> MCPServer:
    """An MCP server whose tools run on ``registry`` (and its agent pool)."""
    require_mcp()
    from mcp.server import MCPServer

    server = MCPServer("drvenus", instructions=INSTRUCTIONS, log_level="WARNING")

    @server.tool()
    async def deep_research(question: str) -> str:
        """Research a question on the web (or the offline corpus) and answer it, listing the
        pages read. Takes from seconds to minutes."""
        try:
            run = registry.start(question)
        except (ValueError, Busy) as exc:
            return f"Error: {exc}"
        return final_text(await run.wait() or {})

    @server.tool()
    async def search(query: str) -> str:
        """Search for a query; returns JSON: the results (title, url, snippet) per query."""
        return await _call_tool(registry, "search", {"query": [query]})

    @server.tool()
    async def visit(url: str, goal: str) -> str:
        """Read a web page and extract the evidence and a summary for a goal."""
        return await _call_tool(registry, "visit", {"url": [url], "goal": goal})

    return server


async def serve_stdio(registry: RunRegistry) -> None:
    """Serve the MCP tools on stdin/stdout until the client closes them."""
    server = build_mcp(registry)
    await server.run_stdio_async()


__all__ = ["build_mcp", "require_mcp", "serve_stdio"]

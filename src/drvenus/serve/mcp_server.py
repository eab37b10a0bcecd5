"""The MCP face (official ``mcp`` SDK): tools ``deep_research``, ``start_research``,
``research_status``, ``search`` and ``visit``.

Served over Streamable HTTP at ``/mcp`` by ``drvenus serve`` and over stdio by ``drvenus mcp``.
``deep_research`` runs through the run registry (the same run limit, a stored trace) and sends
a progress notification per step (and a heartbeat), for clients that reset their timeout on
progress; ``start_research`` + ``research_status`` (long-polling) serve clients with a fixed
request timeout, so research of many minutes completes. Failures are tool errors (isError).
``search`` and ``visit`` call the default tools preset directly and answer exactly what the
agent would read inside ``<tool_response>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, ValidationError

from drvenus.protocol import ToolCallError, normalize_tool_call
from drvenus.serve.runs import Busy, Run, RunRegistry
from drvenus.serve.view import final_text, progress_line
from drvenus.text import one_line

if TYPE_CHECKING:
    from mcp.server import MCPServer

try:  # at module level: the SDK reads the tools' annotations from this module
    from mcp.server.mcpserver import Context
except ImportError:  # no serve extra: build_mcp says what to install
    Context = Any  # type: ignore[misc,assignment]

log = logging.getLogger(__name__)

MCP_EXTRA_HINT = "the MCP server needs the mcp package: pip install 'drvenus[serve]'"
INSTRUCTIONS = (
    "drvenus is a deep research agent. deep_research(question) searches, reads pages and "
    "answers with the sources it read (it can take minutes). For long research, "
    "start_research(question) returns a run_id at once and research_status(run_id) reports "
    "progress, then the answer. search(query) and visit(url, goal) are its two tools, for "
    "doing the research yourself."
)


def require_mcp() -> None:
    try:
        import mcp.server  # noqa: F401
    except ImportError as exc:
        raise ImportError(MCP_EXTRA_HINT) from exc


async def _call_tool(registry: RunRegistry, name: str, arguments: dict[str, Any]) -> str:
    from mcp.server.mcpserver.exceptions import ToolError

    try:
        call = normalize_tool_call({"name": name, "arguments": arguments})
    except ToolCallError as exc:
        raise ToolError(str(exc)) from None
    toolbox = await registry.pool.toolbox()
    return await toolbox.call(call)


def _start(registry: RunRegistry, question: str) -> Run:
    from mcp.server.mcpserver.exceptions import ToolError

    try:
        return registry.start(question)
    except (ValueError, Busy) as exc:  # an empty question, a full server: the call failed
        raise ToolError(str(exc)) from None


def _status(run: Run) -> dict[str, Any]:
    """A run as ``research_status`` reports it: progress while it runs, the answer at the end."""
    lines = [line for e in run.events if (line := progress_line(e))]
    status: dict[str, Any] = {
        "run_id": run.id, "status": run.status, "steps": _steps(run),
        "last": one_line(lines[-1], 300) if lines else "queued",
    }
    if run.finished:
        status["answer"] = final_text(run.record or {})
    return status


def _steps(run: Run) -> int:
    return sum(1 for e in run.events if e.get("type") == "step_started")


def argument_problem(tool: str, exc: ValidationError) -> str:
    """``invalid arguments for TOOL: question is required; wait_seconds: ...`` from the SDK's
    argument check."""
    parts = []
    for error in exc.errors():
        where = ".".join(str(x) for x in error.get("loc", ())) or "arguments"
        if error.get("type") == "missing":
            parts.append(f"{where} is required")
        else:
            parts.append(f"{where}: {str(error.get('msg', 'invalid')).lower()}")
    return f"invalid arguments for {tool}: " + "; ".join(parts)


QUESTION = Field(description="The question to research, in natural language.")
RUN_ID = Field(description="The run_id that start_research returned.")
WAIT = Field(ge=0, le=50, description="Seconds to wait for the run to end before "
             "answering with its progress (keep it under the client's request timeout).")


def build_mcp(registry: RunRegistry) -> MCPServer:
    """An MCP server whose tools run on ``registry`` (and its agent pool)."""
    require_mcp()
    from mcp.server import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    from drvenus import __version__

    class _Server(MCPServer):
        async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None
                            ) -> Any:
            try:
                return await super().call_tool(name, arguments, context)
            except ToolError as exc:  # the SDK's argument check: one plain line, no pydantic dump
                if isinstance(exc.__cause__, ValidationError):
                    raise ToolError(argument_problem(name, exc.__cause__)) from None
                raise

    server = _Server("drvenus", version=__version__, instructions=INSTRUCTIONS,
                     log_level="WARNING")

    @server.tool()
    async def deep_research(question: Annotated[str, QUESTION], ctx: Context) -> str:
        """Research a question on the web (or the offline corpus) and answer it, listing the
        pages read. Takes from seconds to minutes and reports progress as it goes; a client
        whose requests time out sooner should use start_research and research_status."""
        run = _start(registry, question)
        async for item in run.follow():  # a progress notification per step, and a heartbeat
            line = progress_line(item[1]) if item is not None else "still working"
            if line:
                await ctx.report_progress(_steps(run), None, one_line(line, 300))
        return final_text(run.record or {})

    @server.tool()
    async def start_research(question: Annotated[str, QUESTION]) -> dict[str, Any]:
        """Start researching a question and return at once with its run_id; follow it with
        research_status (for long research with clients whose requests time out)."""
        return _status(_start(registry, question))

    @server.tool()
    async def research_status(
        run_id: Annotated[str, RUN_ID], wait_seconds: Annotated[float, WAIT] = 20.0
    ) -> dict[str, Any]:
        """The progress of a run started by start_research: status, steps, the latest step;
        once it is done, the answer with its sources. Waits up to wait_seconds for the end."""
        run = registry.get(run_id)
        if run is None:
            raise ToolError(f"no run {run_id!r} (unknown, or forgotten since)")
        if not run.finished:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run.wait(), wait_seconds)
        return _status(run)

    @server.tool()
    async def search(
        query: Annotated[str, Field(description="What to search for.")],
    ) -> str:
        """Search for a query; returns JSON: the results (title, url, snippet) per query."""
        return await _call_tool(registry, "search", {"query": [query]})

    @server.tool()
    async def visit(
        url: Annotated[str, Field(description="The http(s) URL of the page to read.")],
        goal: Annotated[str, Field(description="What to look for on the page.")],
    ) -> str:
        """Read a web page and extract the evidence and a summary for a goal."""
        return await _call_tool(registry, "visit", {"url": [url], "goal": goal})

    return server


async def serve_stdio(registry: RunRegistry) -> None:
    """Serve the MCP tools on stdin/stdout until the client closes them."""
    server = build_mcp(registry)
    await server.run_stdio_async()


__all__ = ["build_mcp", "require_mcp", "serve_stdio"]

"""The MCP face (official ``mcp`` SDK): tools ``deep_research``, ``start_research``,
``research_status``, ``search``, ``fetch`` and ``visit``.

Served over Streamable HTTP at ``/mcp`` by ``drvenus serve`` and over stdio by ``drvenus mcp``.
``deep_research`` runs through the run registry (the same run limit, a stored trace). A client
that sent a progress token gets a notification per event (and a heartbeat), progress counting
up, and the answer at the end, however long the run takes; one that sent none (the MCP
Inspector CLI, many desktop clients: a fixed request timeout, often 60 s) gets the answer if
the run ends within :data:`QUICK_ANSWER_SECONDS`, else the run id and how to follow it with
``research_status``. ``start_research`` + ``research_status`` (long-polling) do the same
explicitly. Both take ``heavy`` (Heavy mode: N parallel runs, then one answer; up to the
server's cap, which the tools' schema states); the progress then counts over all runs, each
line marked ``[run i]``. Failures are tool errors (isError).

``search(query)`` and ``fetch(id)`` follow the connector contract of ChatGPT's deep research
and company knowledge (structured ``{"results": [{"id", "title", "url"}]}``, and ``{"id",
"title", "text", "url", "metadata"}`` for the URL ``id``: the page as ``visit`` reads it, before
extraction); ``visit(url, goal)`` answers exactly what the agent reads inside
``<tool_response>``. All tools use the default tools preset.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, Field, ValidationError

from drvenus import protocol
from drvenus.protocol import ToolCallError, normalize_tool_call
from drvenus.serve.agents import Choice
from drvenus.serve.runs import Busy, Run, RunRegistry, unknown_run
from drvenus.serve.view import final_text, finished_view, progress_line
from drvenus.text import counted, one_line

if TYPE_CHECKING:
    from mcp.server import MCPServer

try:  # at module level: the SDK reads the tools' annotations from this module
    from mcp.server.mcpserver import Context
    from mcp.types import CallToolResult, TextContent
except ImportError:  # no serve extra: build_mcp says what to install
    Context = CallToolResult = TextContent = Any  # type: ignore[misc,assignment]

log = logging.getLogger(__name__)

MCP_EXTRA_HINT = "the MCP server needs the mcp package: pip install 'drvenus[serve]'"
QUICK_ANSWER_SECONDS = 45.0  # deep_research without a progress token answers by then
FETCH_GOAL = "The main content of the page."  # fetch through a toolbox that only has visit
INSTRUCTIONS = (
    "drvenus is a deep research agent. deep_research(question) searches, reads pages and "
    "answers with the sources it read (it can take minutes; without progress notifications it "
    "answers within a minute with a run_id to follow with research_status). "
    "start_research(question) returns a run_id at once and research_status(run_id) reports "
    "progress, then the answer. search(query) lists pages, fetch(id) reads one whole, and "
    "visit(url, goal) extracts what a page says about a goal, for doing the research yourself."
)


def require_mcp() -> None:
    try:
        import mcp.server  # noqa: F401
    except ImportError as exc:
        raise ImportError(MCP_EXTRA_HINT) from exc


class RunStatus(BaseModel):
    """A run as start_research and research_status report it."""

    run_id: str = Field(description="Pass it to research_status.")
    status: str = Field(description="queued, running, done or lost.")
    steps: int = Field(description="Steps (model turns) so far.")
    last: str = Field(description="The latest thing the run did, in one line.")
    answer: str | None = Field(
        default=None, description="Once done: the answer and the pages it read.")


class ResearchResult(BaseModel):
    """deep_research's result: the answer once the run is over, else how to follow it."""

    run_id: str = Field(description="The run's id: pass it to research_status.")
    status: str = Field(description="done, or queued / running: follow it with research_status.")
    answered: bool = Field(description="Whether the run found an answer (done only).")
    answer: str | None = Field(
        default=None, description="Once done: the answer with the pages it read (or why there "
        "is none).")
    sources: list[str] = Field(default_factory=list, description="The URLs of the pages read.")


class SearchResult(BaseModel):
    id: str = Field(description="The page's URL: pass it to fetch.")
    title: str
    url: str
    snippet: str = Field(default="", description="What the search engine shows of the page.")


class SearchResults(BaseModel):
    results: list[SearchResult]


class FetchedPage(BaseModel):
    id: str
    title: str
    text: str = Field(description="The page's readable text (cut to the page budget).")
    url: str
    metadata: dict[str, Any] | None = None


async def _tool_text(registry: RunRegistry, name: str, arguments: dict[str, Any]) -> str:
    """What the agent's tool ``name`` answers (the body inside ``<tool_response>``)."""
    from mcp.server.mcpserver.exceptions import ToolError

    try:
        call = normalize_tool_call({"name": name, "arguments": arguments})
    except ToolCallError as exc:
        raise ToolError(str(exc)) from None
    toolbox = await registry.pool.toolbox()
    return await toolbox.call(call)


async def _search(registry: RunRegistry, query: str) -> SearchResults:
    from mcp.server.mcpserver.exceptions import ToolError

    body = await _tool_text(registry, protocol.SEARCH, {"query": [query]})
    entries = protocol.parse_search_body(body)
    if entries is None:  # the tool's error text
        raise ToolError(one_line(body, 500))
    hits = [hit for entry in entries for hit in entry["web_page_info_list"]]
    return SearchResults(results=[
        SearchResult(id=str(h.get("url", "")), title=str(h.get("title") or h.get("url", "")),
                     url=str(h.get("url", "")), snippet=str(h.get("snippet") or ""))
        for h in hits if h.get("url")
    ])


async def _fetch(registry: RunRegistry, url: str) -> FetchedPage:
    """The page at ``url`` as visit reads it before extracting (a local toolbox's visit); a
    toolbox without that (a tool server) answers with a visit for the page's main content."""
    from mcp.server.mcpserver.exceptions import ToolError

    url = url.strip()
    toolbox = await registry.pool.toolbox()
    tools = getattr(toolbox, "tools", None)
    visit = tools.get(protocol.VISIT) if isinstance(tools, dict) else None
    read_text = getattr(visit, "read_text", None)
    if read_text is not None:
        page = await read_text(url)
        if page is None:
            raise ToolError(f"could not read {_shown(url)}")
        return FetchedPage(id=url, title=page.title or url, text=page.text, url=url,
                           metadata={"whole_page": True})
    body = await _tool_text(registry, protocol.VISIT, {"url": [url], "goal": FETCH_GOAL})
    frames = protocol.parse_visit_body(body) or []
    read = [f for f in frames if not protocol.is_visit_failure(f["summary"], registry.pool.texts)]
    if not read:
        raise ToolError(f"could not read {_shown(url)}")
    text = "\n\n".join(part for f in read for part in (f["evidence"], f["summary"]) if part)
    return FetchedPage(id=url, title=url, text=text, url=url, metadata={"whole_page": False})


def _shown(value: str) -> str:
    """A client's value as an error echoes it: one line, at most 200 characters (an id of a
    megabyte is not sent back whole)."""
    return one_line(value, 200)


def _start(registry: RunRegistry, question: str, heavy: int | None = None) -> Run:
    from mcp.server.mcpserver.exceptions import ToolError

    try:
        return registry.start(question, Choice(heavy=heavy), origin="mcp")
    except (ValueError, Busy) as exc:  # an empty question, a full server: the call failed
        raise ToolError(str(exc)) from None


def _last_line(run: Run) -> str:
    """What the run did last, in one line (a step's start says nothing of what it does)."""
    lines = [line for e in run.events
             if e.get("type") != "step_started" and (line := progress_line(e, run.texts))]
    return one_line(lines[-1], 300) if lines else run.status


def _status(run: Run) -> RunStatus:
    """A run as ``research_status`` reports it: progress while it runs, the answer at the end."""
    answer = final_text(run.record or {}, run.texts) if run.finished else None
    return RunStatus(run_id=run.id, status=run.status, steps=_steps(run), last=_last_line(run),
                     answer=answer)


def _result(run: Run, text: str) -> CallToolResult:
    """deep_research's reply: ``text`` for people and models, the structured result for
    applications (the run id in a field, not in a sentence)."""
    record = run.record or {}
    view = finished_view(record, run.texts) if run.finished else None
    result = ResearchResult(
        run_id=run.id, status=run.status, answered=bool(view and view["answered"]),
        answer=text if run.finished else None, sources=view["sources"] if view else [])
    return CallToolResult(content=[TextContent(type="text", text=text)],
                          structured_content=result.model_dump(mode="json"))


def _steps(run: Run) -> int:
    return sum(1 for e in run.events if e.get("type") == "step_started")


def still_running(run: Run, waited: float) -> str:
    """deep_research's reply when the run outlasts a client without progress notifications."""
    return (
        f"Still researching after {waited:.0f} s (run_id {run.id}, status {run.status}, "
        f"{counted(_steps(run), 'step')} so far; latest: {_last_line(run)}).\n"
        f'Call research_status with run_id "{run.id}" (and wait_seconds up to 50) until its '
        "status is done: it then holds the answer with its sources."
    )


def _progress_token(ctx: Any) -> Any:
    """The progress token the client sent with this call, or None."""
    try:
        meta = ctx.request_context.meta
    except (AttributeError, ValueError):  # no request context (called directly)
        return None
    if not meta:
        return None
    return meta.get("progress_token", meta.get("progressToken"))


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
RUN_ID = Field(description="The run_id that start_research (or deep_research) returned.")
WAIT = Field(ge=0, le=50, description="Seconds to wait for the run to end before "
             "answering with its progress (keep it under the client's request timeout).")


def build_mcp(registry: RunRegistry, *, quick_answer_seconds: float = QUICK_ANSWER_SECONDS
              ) -> MCPServer:
    """An MCP server whose tools run on ``registry`` (and its agent pool);
    ``quick_answer_seconds``: how long ``deep_research`` waits for the answer when the client
    sent no progress token."""
    require_mcp()
    from drvenus import __version__

    server = _server_class()("drvenus", version=__version__, instructions=INSTRUCTIONS,
                             log_level="WARNING")
    tool = _tool_registrar(server)
    _research_tools(tool, registry, quick_answer_seconds)
    _web_tools(tool, registry)
    return server


def _server_class() -> type[MCPServer]:
    """The SDK's server, its argument check answered on one plain line (no pydantic dump)."""
    from mcp.server import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    class _Server(MCPServer):
        async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None
                            ) -> Any:
            try:
                return await super().call_tool(name, arguments, context)
            except ToolError as exc:
                if isinstance(exc.__cause__, ValidationError):
                    raise ToolError(argument_problem(name, exc.__cause__)) from None
                raise

    return _Server


def _tool_registrar(server: MCPServer) -> Callable[..., Callable[[Any], Any]]:
    """``tool(title, ...)``: registers a tool with its docstring, on one line, as the
    description, and its hints."""
    from mcp.types import ToolAnnotations

    def tool(title: str, *, read_only: bool = True, open_world: bool = True,
             structured: bool = True) -> Callable[[Any], Any]:
        hints = ToolAnnotations(title=title, read_only_hint=read_only, destructive_hint=False,
                                open_world_hint=open_world)

        def register(fn: Any) -> Any:
            return server.tool(title=title, description=" ".join((fn.__doc__ or "").split()),
                               annotations=hints, structured_output=structured)(fn)
        return register

    return tool


def _research_tools(tool: Callable[..., Callable[[Any], Any]], registry: RunRegistry,
                    quick_answer_seconds: float) -> None:
    """deep_research, start_research, research_status."""
    from mcp.server.mcpserver.exceptions import ToolError

    cap = registry.pool.heavy_cap
    heavy_field = Field(default=None, ge=1, le=cap, description=(
        f"Heavy mode: research it this many times in parallel (1 to {cap}), then write one "
        "answer from the runs' answers and evidence; slower, often better. Default: the "
        "server's setting."))

    def with_cap(fn: Any) -> Any:
        """``fn`` with its ``heavy`` argument bounded by this server's cap (the annotation is
        built here, as an object: the module's string annotations cannot name a local)."""
        fn.__annotations__["heavy"] = Annotated[int | None, heavy_field]
        return fn

    @tool("Deep research")
    @with_cap
    async def deep_research(question: Annotated[str, QUESTION], ctx: Context,
                            heavy: int | None = None
                            ) -> Annotated[CallToolResult, ResearchResult]:
        """Research a question on the web (or the offline corpus) and answer it, listing the
        pages read. Takes from seconds to minutes. With a progress token, it reports progress
        as it goes and answers at the end; without one it answers within a minute: the answer
        if the run is over by then, else the run_id to follow with research_status."""
        run = _start(registry, question, heavy)
        if _progress_token(ctx) is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run.wait(), quick_answer_seconds)
            if not run.finished:
                return _result(run, still_running(run, quick_answer_seconds))
            return _result(run, final_text(run.record or {}, run.texts))
        sent = 0  # the progress value: one more per notification, as the spec requires
        async for item in run.follow():
            line = progress_line(item[1], run.texts) if item is not None else "still working"
            if line:
                sent += 1
                await ctx.report_progress(sent, None, one_line(f"step {_steps(run)}: {line}", 300))
        return _result(run, final_text(run.record or {}, run.texts))

    @tool("Start research", read_only=False)
    @with_cap
    async def start_research(question: Annotated[str, QUESTION],
                             heavy: int | None = None) -> RunStatus:
        """Start researching a question and return at once with its run_id; follow it with
        research_status (for long research with clients whose requests time out)."""
        return _status(_start(registry, question, heavy))

    @tool("Research status", open_world=False)
    async def research_status(
        run_id: Annotated[str, RUN_ID], wait_seconds: Annotated[float, WAIT] = 20.0
    ) -> RunStatus:
        """The progress of a run started by start_research or deep_research: status, steps,
        the latest step; once it is done, the answer with its sources. Waits up to
        wait_seconds for the end."""
        run = registry.get(run_id)
        if run is None:
            raise ToolError(unknown_run(run_id))
        if not run.finished:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run.wait(), wait_seconds)
        return _status(run)


def _web_tools(tool: Callable[..., Callable[[Any], Any]], registry: RunRegistry) -> None:
    """search, fetch (the connector pair) and visit (what the agent reads)."""
    @tool("Search")
    async def search(
        query: Annotated[str, Field(description="What to search for.")],
    ) -> SearchResults:
        """Search the web (or the offline corpus) for a query: the pages found, each with its
        URL as id (pass it to fetch), title and snippet."""
        return await _search(registry, query)

    @tool("Fetch")
    async def fetch(
        id: Annotated[str, Field(description="The URL of the page: an id from search.")],
    ) -> FetchedPage:
        """Read a whole page by its id (its URL, as search returns it): the title and the
        readable text."""
        return await _fetch(registry, id)

    @tool("Visit", structured=False)
    async def visit(
        url: Annotated[str, Field(description="The http(s) URL of the page to read.")],
        goal: Annotated[str, Field(description="What to look for on the page.")],
    ) -> str:
        """Read a web page and extract the evidence and a summary for a goal: exactly what
        the research agent reads."""
        return await _tool_text(registry, protocol.VISIT, {"url": [url], "goal": goal})


async def serve_stdio(registry: RunRegistry) -> None:
    """Serve the MCP tools on stdin/stdout until the client closes them."""
    server = build_mcp(registry)
    await server.run_stdio_async()


__all__ = ["build_mcp", "require_mcp", "serve_stdio"]

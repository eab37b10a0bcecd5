"""The toolbox the agent loop calls: tool name -> tool, with a timeout and no exceptions."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

from drvenus.corpus import CorpusIndex, CorpusSource, open_index
from drvenus.net.secrets import redact
from drvenus.protocol import ToolCall, tool_error_message, unknown_tool_message
from drvenus.tools.base import Tool
from drvenus.tools.extract import Extractor
from drvenus.tools.search import LocalSearch
from drvenus.tools.visit import LocalVisit

log = logging.getLogger(__name__)

DEFAULT_TOOL_TIMEOUT = 300.0


class Toolbox:
    """Runs protocol tool calls. ``call`` always returns a response body, never raises."""

    def __init__(
        self, tools: Iterable[Tool] | Mapping[str, Tool], *, timeout: float | None = None
    ) -> None:
        items = tools.items() if isinstance(tools, Mapping) else ((t.name, t) for t in tools)
        self.tools: dict[str, Tool] = dict(items)
        self.timeout = DEFAULT_TOOL_TIMEOUT if timeout is None else timeout

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.tools)

    def __contains__(self, name: object) -> bool:
        return name in self.tools

    def __getitem__(self, name: str) -> Tool:
        return self.tools[name]

    async def call(self, tool_call: ToolCall) -> str:
        tool = self.tools.get(tool_call.name)
        if tool is None:
            return unknown_tool_message(tool_call.name)
        try:
            return await asyncio.wait_for(tool(tool_call.arguments), timeout=self.timeout)
        except TimeoutError:
            log.warning("tool %s timed out after %.0fs", tool_call.name, self.timeout)
            return tool_error_message(tool_call.name, f"timed out after {self.timeout:g}s")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the agent gets the error as text
            log.exception("tool %s failed", tool_call.name)
            reason = redact(str(exc) or type(exc).__name__)
            return tool_error_message(tool_call.name, reason)

    async def aclose(self) -> None:
        """Close tools that hold resources (an ``aclose`` coroutine method)."""
        for tool in self.tools.values():
            close = getattr(tool, "aclose", None)
            if close is not None:
                try:
                    await close()
                except Exception:  # closing is best effort
                    log.exception("closing tool %s failed", getattr(tool, "name", tool))


def close_quietly(toolbox: object) -> None:
    """Close ``toolbox`` (its ``aclose`` coroutine, if any) from sync code, logging a failure
    instead of raising: for callers that are already failing or shutting down."""
    close = getattr(toolbox, "aclose", None)
    if close is not None:
        try:
            asyncio.run(close())
        except Exception:  # closing is best effort
            log.debug("closing the toolbox failed", exc_info=True)


def offline_toolbox(
    corpus: CorpusSource | CorpusIndex = None,
    *,
    top_k: int = 10,
    extractor: Extractor | None = None,
    cache_dir: str | Path | None = None,
    progress: bool = False,
    timeout: float | None = None,
    max_page_tokens: int | None = None,
) -> Toolbox:
    """``search`` + ``visit`` over a local corpus (the built-in Wikipedia summaries when
    ``corpus`` is None); the index is built on first use and shared in the process.
    ``extractor`` defaults to the offline :class:`ExtractiveExtractor`."""
    if isinstance(corpus, CorpusIndex):
        index = corpus
    else:
        index = open_index(corpus, cache_dir=cache_dir, progress=progress)
    visit = LocalVisit(index, extractor)
    if max_page_tokens is not None:
        visit.max_page_tokens = max_page_tokens
    tools: list[Tool] = [LocalSearch(index, top_k=top_k), visit]
    return Toolbox(tools, timeout=timeout)

"""The ``search`` tool over a local corpus index."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from drvenus.corpus import Hit
from drvenus.protocol import MISSING_ARGUMENT, SEARCH, render_search, tool_error_message


class SearchIndex(Protocol):
    def search(self, query: str, k: int = 10) -> list[Hit]: ...


class LocalSearch:
    """``search(query=[...])``: the top ``top_k`` corpus hits per query, as the protocol's JSON."""

    name = SEARCH

    def __init__(self, index: SearchIndex, top_k: int = 10) -> None:
        self.index = index
        self.top_k = top_k

    async def search_one(self, query: str) -> list[dict[str, Any]]:
        hits = await asyncio.to_thread(self.index.search, query, self.top_k)
        return [hit.to_result() for hit in hits]

    async def __call__(self, arguments: Mapping[str, Any]) -> str:
        queries: Sequence[str] = arguments.get("query") or []
        if isinstance(queries, str):
            queries = [queries]
        if not queries:
            return tool_error_message(SEARCH, MISSING_ARGUMENT[SEARCH])
        results = await asyncio.gather(*(self.search_one(str(q)) for q in queries))
        return render_search(list(zip(queries, results, strict=True)))

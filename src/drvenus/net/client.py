"""One ``httpx.AsyncClient`` per running event loop.

A pooled connection belongs to the event loop that opened it, and drvenus objects (a model
client, a search provider, a remote toolbox) outlive loops: ``asyncio.run`` per CLI command,
one loop per test, a thread with its own loop. :class:`LoopClient` hands out the client of the
running loop and makes a new one when the loop has changed; the old client is dropped, not
closed (its sockets belong to a loop that is gone or busy elsewhere and close with it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx


class LoopClient:
    """``get()``: the client of the running event loop, made by ``factory`` on first use in
    each loop; ``on_new()`` is called after each new client (for per-loop state that goes with
    it, such as a limiter). ``aclose()``: close the current client (again: a no-op)."""

    def __init__(
        self,
        factory: Callable[[], httpx.AsyncClient],
        *,
        on_new: Callable[[], None] | None = None,
    ) -> None:
        self.factory = factory
        self.on_new = on_new
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def current(self) -> httpx.AsyncClient | None:
        """The client made last (None before the first ``get`` and after ``aclose``)."""
        return self._client

    def get(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = self.factory()
            self._loop = loop
            if self.on_new is not None:
                self.on_new()
        return self._client

    async def aclose(self) -> None:
        """Close the client. One made in another event loop is only dropped when that loop is
        still running (its connections are that loop's to close); when the loop is closed,
        closing finds nothing left to release."""
        client, loop = self._client, self._loop
        self._client, self._loop = None, None
        if client is None:
            return
        if loop is not asyncio.get_running_loop() and loop is not None and not loop.is_closed():
            return
        try:
            await client.aclose()
        except RuntimeError:  # its event loop is already closed: nothing left to release
            pass


__all__ = ["LoopClient"]

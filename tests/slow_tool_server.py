"""A tool server whose search takes 30 s (for the shutdown test): ``python slow_tool_server.py
PORT``, run like ``drvenus tools serve`` runs it (Ctrl-C ends it quietly)."""

from __future__ import annotations

import asyncio
import sys

from drvenus.tools.server import serve
from drvenus.tools.toolbox import Toolbox


class Slow:
    name = "search"

    async def __call__(self, arguments) -> str:
        await asyncio.sleep(30)
        return "late"


if __name__ == "__main__":
    try:
        serve(Toolbox([Slow()]), "127.0.0.1", int(sys.argv[1]), None, max_concurrency=4,
              on_ready=lambda url: print("ready", url, flush=True))
    except KeyboardInterrupt:
        pass

"""Running the app: uvicorn on a socket bound first (port 0: a free one), lifespan on (it runs
the MCP session manager and closes the agents), in the foreground or in a thread for tests."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from drvenus.net.server import (
    DEFAULT_HOST,
    ServerThread,
    bind_socket,
    socket_url,
    uvicorn_server,
)

log = logging.getLogger(__name__)

DEFAULT_PORT = 8000
DEFAULT_MAX_RUNNING = 2  # research runs going on at once
DEFAULT_MAX_WAITING = 8  # runs that may wait for a free slot
HEAVY_CAP = 4  # the most Heavy-mode runs a request may ask for unless the operator says
# otherwise (``drvenus serve --max-heavy``); never below the preset's own ``--heavy``


def serve_app(
    app: Any, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve ``app`` until interrupted (OSError when the port is taken)."""
    sock = bind_socket(host, port)
    try:
        server = uvicorn_server(app, sock, lifespan="on", graceful_seconds=5)
        url = socket_url(sock)
        if on_ready is not None:
            on_ready(url)
        log.info("drvenus serve listening on %s", url)
        asyncio.run(server.serve(sockets=[sock]))
    finally:
        sock.close()


class ServeThread(ServerThread):
    """The app served in a daemon thread, lifespan on: ``with ServeThread(app) as s: s.url``."""

    lifespan = "on"
    label = "server"


__all__ = [
    "DEFAULT_MAX_RUNNING",
    "DEFAULT_MAX_WAITING",
    "DEFAULT_PORT",
    "ServeThread",
    "serve_app",
    "socket_url",
]

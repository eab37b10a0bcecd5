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
        _stop_runs_on_exit(server, app)
        url = socket_url(sock)
        if on_ready is not None:
            on_ready(url)
        log.info("drvenus serve listening on %s", url)
        asyncio.run(server.serve(sockets=[sock]))
    finally:
        sock.close()


def _stop_runs_on_exit(server: Any, app: Any) -> None:
    """On Ctrl-C (or SIGTERM), stop the runs at once: the streams that follow them (a browser's
    page, a /v1 client) end with the runs' last event, ``interrupted``, and the server exits
    without waiting out its graceful shutdown for them (and cancelling them mid-stream)."""
    registry = getattr(app.state, "registry", None)
    if registry is None:
        return
    handle_exit = server.handle_exit
    stopping: list[asyncio.Future[Any]] = []  # held, so the task is not collected early

    def on_exit(sig: int, frame: Any) -> None:
        handle_exit(sig, frame)
        if stopping:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not serving yet (or any more): the lifespan stops the runs
            return
        def stop() -> None:
            stopping.append(asyncio.ensure_future(registry.aclose()))
        loop.call_soon_threadsafe(stop)

    server.handle_exit = on_exit


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

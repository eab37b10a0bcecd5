"""Running the app: uvicorn on a socket bound first (port 0: a free one), lifespan on (it runs
the MCP session manager and closes the agents), in the foreground or in a thread for tests."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Self

from drvenus.tools.server import bind_socket

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_RUNNING = 2  # research runs going on at once
DEFAULT_MAX_WAITING = 8  # runs that may wait for a free slot


def socket_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _server(app: Any, sock: socket.socket) -> Any:
    import uvicorn

    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(
        app, host=host, port=port, log_config=None, access_log=False, lifespan="on",
        timeout_keep_alive=30, timeout_graceful_shutdown=5,
    )
    return uvicorn.Server(config)


def serve_app(
    app: Any, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve ``app`` until interrupted (OSError when the port is taken)."""
    sock = bind_socket(host, port)
    try:
        server = _server(app, sock)
        url = socket_url(sock)
        if on_ready is not None:
            on_ready(url)
        log.info("drvenus serve listening on %s", url)
        asyncio.run(server.serve(sockets=[sock]))
    finally:
        sock.close()


class ServeThread:
    """The app served in a daemon thread: ``with ServeThread(app) as s: s.url``."""

    def __init__(self, app: Any, host: str = DEFAULT_HOST, port: int = 0) -> None:
        self.app, self.host, self.port = app, host, port
        self.url = ""
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self, timeout: float = 60.0) -> Self:
        sock = bind_socket(self.host, self.port)
        self.url = socket_url(sock)
        self._server = _server(self.app, sock)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, daemon=True,
            name="drvenus-serve",
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server at {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_MAX_RUNNING",
    "DEFAULT_MAX_WAITING",
    "DEFAULT_PORT",
    "ServeThread",
    "serve_app",
    "socket_url",
]

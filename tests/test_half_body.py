"""A client that sends half a body and disconnects (issue 43): the server logs one line, no
ERROR traceback (the tool server here; the web server reads bodies through the same
``read_json_body``)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from urllib.parse import urlsplit

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from drvenus.net.server import Reject, ServerThread, read_json_body  # noqa: E402
from drvenus.tools.server import create_app  # noqa: E402
from drvenus.tools.toolbox import offline_toolbox  # noqa: E402


class Disconnecting:
    """A request whose client goes after ``sent`` bytes of the ``length`` it announced."""

    method, url = "POST", type("U", (), {"path": "/search"})()

    def __init__(self, sent: int, length: int) -> None:
        self.headers = {"content-length": str(length)}
        self.sent = sent

    async def stream(self):
        from starlette.requests import ClientDisconnect

        yield b"x" * self.sent
        raise ClientDisconnect()


@pytest.mark.parametrize("sent", [0, 1, 50])
def test_a_disconnect_mid_body_is_a_400_and_one_warning_line(sent, caplog):
    with caplog.at_level(logging.DEBUG, logger="drvenus"), pytest.raises(Reject) as info:
        asyncio.run(read_json_body(Disconnecting(sent, 100)))
    assert info.value.status == 400 and "disconnected" in info.value.body["error"]
    records = [r for r in caplog.records if r.name.startswith("drvenus")]
    assert len(records) == 1 and records[0].levelno == logging.WARNING
    assert records[0].exc_info is None and "\n" not in records[0].getMessage()
    assert f"{sent} of 100" in records[0].getMessage()


def test_the_tool_server_logs_no_traceback_for_a_half_body(tmp_path, caplog):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "1", "title": "Dracula", "url": "https://x.org/d",
                                  "text": "Dracula is a novel by Bram Stoker."}) + "\n")
    app = create_app(offline_toolbox(corpus, cache_dir=tmp_path / "cache"))
    with caplog.at_level(logging.INFO), ServerThread(app) as server:
        where = urlsplit(server.url)
        with socket.create_connection((where.hostname, where.port)) as conn:
            conn.sendall(b"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                         b'{"query": ["Drac')
        deadline = time.monotonic() + 10
        while not any("disconnected" in r.getMessage() for r in caplog.records) \
                and time.monotonic() < deadline:
            time.sleep(0.02)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
    said = [r for r in caplog.records if "disconnected" in r.getMessage()]
    assert len(said) == 1 and said[0].exc_info is None


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/runs", "/api/replay", "/mcp"])
def test_the_web_server_logs_no_traceback_for_a_half_body(tmp_path, caplog, path):
    from drvenus.serve.app import create_app as create_serve_app
    from drvenus.serve.server import ServeThread
    from helpers.serve import make_registry

    with caplog.at_level(logging.INFO), \
            ServeThread(create_serve_app(make_registry(tmp_path))) as server:
        where = urlsplit(server.url)
        with socket.create_connection((where.hostname, where.port)) as conn:
            conn.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
                         + b"Content-Type: application/json\r\n"
                         b"Accept: application/json, text/event-stream\r\n"
                         b"Content-Length: 1000\r\n\r\n" + b'{"messages": [{"ro')
        deadline = time.monotonic() + 5
        while not any("disconnected" in r.getMessage() for r in caplog.records) \
                and time.monotonic() < deadline:
            time.sleep(0.02)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
    said = [r for r in caplog.records if "disconnected" in r.getMessage()]
    assert len(said) == 1 and said[0].exc_info is None and said[0].levelno == logging.WARNING


def test_the_filter_finds_a_disconnect_inside_groups_and_chains():
    from starlette.requests import ClientDisconnect

    from drvenus.net.server import ClientDisconnectFilter

    def record(exc: BaseException) -> logging.LogRecord:
        try:
            raise exc
        except BaseException as caught:
            return logging.LogRecord("mcp", logging.ERROR, __file__, 1, "Error %s", ("x",),
                                     (type(caught), caught, caught.__traceback__))

    try:
        try:
            raise ClientDisconnect()
        except ClientDisconnect as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as chained:
        wrapped = chained
    for exc in (ClientDisconnect(), ExceptionGroup("g", [ValueError(), ClientDisconnect()]),
                wrapped):
        r = record(exc)
        assert ClientDisconnectFilter().filter(r)
        assert r.levelno == logging.WARNING and r.exc_info is None
        assert r.getMessage() == "Error x: the client disconnected mid-request"
    other = record(ValueError("a real bug"))
    ClientDisconnectFilter().filter(other)
    assert other.levelno == logging.ERROR and other.exc_info is not None

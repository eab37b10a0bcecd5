"""drvenus.net, the one HTTP layer: the retry rule, the context-overflow detector, URL redaction,
the client per event loop, and the guard both servers share (real servers on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from types import SimpleNamespace

import httpx
import pytest

from drvenus.llm.base import LLMError
from drvenus.llm.openai_compat import error_detail, status_error
from drvenus.net import (
    LoopClient,
    RetryPolicy,
    is_context_overflow,
    is_retryable_status,
    redact_url,
)
from drvenus.protocol import ToolCall

# ------------------------------------------------------------------------- the retry rule


@pytest.mark.parametrize("status", [408, 425, 429, 500, 502, 503, 504, 507, 520, 522, 524, 599])
def test_transient_statuses_are_retried(status):
    assert is_retryable_status(status)


@pytest.mark.parametrize(
    "status", [200, 301, 304, 400, 401, 403, 404, 405, 409, 413, 415, 421, 422, 451,
               501, 505, 506, 508, 510, 511, 600],
)
def test_other_statuses_are_not(status):
    assert not is_retryable_status(status)


def test_the_model_client_follows_the_rule():
    for status in (408, 425, 429, 500, 503, 520):
        assert status_error("m", status, "x").retryable, status
    for status in (400, 401, 404, 422, 501):
        assert not status_error("m", status, "x").retryable, status


@pytest.mark.parametrize("status, tries", [(425, 3), (500, 3), (503, 3), (400, 1), (501, 1)])
def test_the_remote_toolbox_follows_the_rule(status, tries):
    from drvenus.tools.remote import RemoteToolbox

    seen: list[int] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(1)
        return httpx.Response(status, json={"error": "nope"})

    async def go() -> str:
        remote = RemoteToolbox("http://127.0.0.1:9", retry=RetryPolicy(attempts=3, base=0),
                               transport=httpx.MockTransport(answer))
        try:
            return await remote.call(ToolCall("search", {"query": ["x"]}))
        finally:
            await remote.aclose()

    text = asyncio.run(go())
    assert text.startswith("ERROR") or "nope" in text
    assert len(seen) == tries


# ---------------------------------------------------------------- the overflow detector

VLLM = {"object": "error", "message": "This model's maximum context length is 32768 tokens. "
        "However, you requested 40012 tokens (25012 in the messages, 15000 in the completion). "
        "Please reduce the length of the messages or completion.",
        "type": "BadRequestError", "param": None, "code": 400}
VLLM_V1 = {"object": "error", "message": "The decoder prompt (length 40012) is longer than the "
           "maximum model length of 32768. Make sure that `max_model_len` is no smaller than the "
           "number of text tokens.", "type": "BadRequestError", "param": None, "code": 400}
SGLANG = {"object": "error", "message": "The input (40012 tokens) is longer than the model's "
          "context length (32768 tokens).", "type": "BadRequestError", "param": None, "code": 400}
SGLANG_TOTAL = {"object": "error", "message": "Requested token count exceeds the model's maximum "
                "context length of 32768 tokens. You requested a total of 47012 tokens: 32012 "
                "tokens from the input messages and 15000 tokens for the completion.",
                "type": "BadRequestError", "param": None, "code": 400}
LLAMA_SERVER = {"error": {"code": 400, "message": "the request exceeds the available context "
                "size, try increasing it", "type": "exceed_context_size_error",
                "n_prompt_tokens": 40012, "n_ctx": 32768}}
OPENAI = {"error": {"message": "This model's maximum context length is 128000 tokens. However, "
          "your messages resulted in 130412 tokens. Please reduce the length of the messages.",
          "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}
OPENAI_NEW = {"error": {"message": "Your input exceeds the context window of this model. Please "
              "adjust your input and try again.", "type": "invalid_request_error",
              "param": "input", "code": "context_length_exceeded"}}
OVERFLOWS = {"vllm": VLLM, "vllm-v1": VLLM_V1, "sglang": SGLANG, "sglang-total": SGLANG_TOTAL,
             "llama-server": LLAMA_SERVER, "openai": OPENAI, "openai-new": OPENAI_NEW}

NOT_OVERFLOWS = [
    (400, {"object": "error", "message": "temperature must be non-negative, got -1.0.",
           "type": "BadRequestError", "param": None, "code": 400}),
    (400, {"error": {"message": "Invalid 'messages': empty array.",
                     "type": "invalid_request_error", "param": "messages", "code": None}}),
    (404, {"object": "error", "message": "The model `qwen` does not exist.",
           "type": "NotFoundError", "param": None, "code": 404}),
    (429, {"error": {"message": "Rate limit reached for requests", "type": "requests",
                     "code": "rate_limit_exceeded"}}),
    # a server that failed is not a prompt that does not fit, whatever it says
    (500, {"error": {"message": "CUDA out of memory while extending the context length"}}),
    (503, "Service Unavailable"),
]


@pytest.mark.parametrize("server", sorted(OVERFLOWS))
def test_overflow_replies_of_every_server_are_recognised(server):
    body = OVERFLOWS[server]
    assert is_context_overflow(400, body)  # decoded JSON
    assert is_context_overflow(400, json.dumps(body))  # raw text (the RL engines)
    assert is_context_overflow(400, json.dumps(body).encode())  # raw bytes
    assert is_context_overflow(400, error_detail(body))  # the message alone
    error = status_error("model server", 400, error_detail(body), None, body)
    assert isinstance(error, LLMError) and error.context_overflow and not error.retryable


def test_an_overflow_said_only_in_the_code_is_recognised():
    body = {"error": {"message": "Bad request.", "code": "context_length_exceeded"}}
    assert not is_context_overflow(400, error_detail(body))
    assert is_context_overflow(400, body)
    assert status_error("m", 400, error_detail(body), None, body).context_overflow


def test_gateways_and_in_process_backends():
    assert is_context_overflow(413, "prompt is too long: 210000 tokens > 200000 maximum")
    assert is_context_overflow(None, "the request exceeds the available context size")


@pytest.mark.parametrize("status, body", NOT_OVERFLOWS)
def test_other_errors_are_not_overflows(status, body):
    assert not is_context_overflow(status, body)
    assert not is_context_overflow(status, json.dumps(body))


def test_the_rl_server_engine_uses_the_one_transport():
    """Its errors (retryable statuses, context overflow) are every model client's."""
    from drvenus.llm.openai_compat import HttpTransport
    from drvenus.train.rl import engine

    tokenizer = SimpleNamespace(convert_tokens_to_ids=lambda token: 0, eos_token_id=0,
                                unk_token_id=None)
    server = engine.ServerEngine("http://127.0.0.1:9/v1", tokenizer)
    assert isinstance(server.transport, HttpTransport)
    assert server.transport.base_url == "http://127.0.0.1:9/v1" and server.base == \
        "http://127.0.0.1:9"


# ------------------------------------------------------------------------- redaction


@pytest.mark.parametrize("url, redacted", [
    ("http://user:pa55@host:8000/v1", "http://***@host:8000/v1"),
    ("https://token@api.example.com/search?q=1", "https://***@api.example.com/search?q=1"),
    ("http://:secret@10.0.0.1/", "http://***@10.0.0.1/"),
    ("http://u:p@[::1]:8765/x#frag", "http://***@[::1]:8765/x#frag"),
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
    ("https://google.serper.dev", "https://google.serper.dev"),
    ("", ""),
])
def test_redact_url(url, redacted):
    assert redact_url(url) == redacted


def test_unparseable_urls_are_hidden():
    assert redact_url("http://[::1") == "<unparseable URL>"
    assert redact_url("http://u:p@host:99999/") == "<unparseable URL>"


def test_clients_never_show_url_credentials():
    from drvenus.llm.openai_compat import HttpTransport
    from drvenus.tools.remote import RemoteToolbox
    from drvenus.tools.web_search import SearxngSearch

    for thing in (HttpTransport("http://bob:hunter2@127.0.0.1:8000"),
                  RemoteToolbox("http://bob:hunter2@127.0.0.1:8765"),
                  SearxngSearch("http://bob:hunter2@127.0.0.1:8888")):
        assert "hunter2" not in repr(thing) and "***@127.0.0.1" in repr(thing)


def test_remote_toolbox_errors_never_show_url_credentials():
    from drvenus.tools.remote import RemoteToolbox

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async def go() -> str:
        remote = RemoteToolbox("http://bob:hunter2@127.0.0.1:9", retry=RetryPolicy(1),
                               transport=httpx.MockTransport(refuse))
        try:
            return await remote.call(ToolCall("search", {"query": ["x"]}))
        finally:
            await remote.aclose()

    text = asyncio.run(go())
    assert "unreachable" in text and "hunter2" not in text


# ------------------------------------------------------------------ client per event loop


def test_one_client_per_event_loop():
    made: list[httpx.AsyncClient] = []
    news: list[int] = []

    def factory() -> httpx.AsyncClient:
        made.append(httpx.AsyncClient())
        return made[-1]

    clients = LoopClient(factory, on_new=lambda: news.append(1))
    assert clients.current is None

    async def use() -> httpx.AsyncClient:
        first = clients.get()
        assert clients.get() is first  # the same loop: the same client
        other = await asyncio.gather(*(asyncio.to_thread(lambda: 0) for _ in range(2)))
        assert other and clients.get() is first
        return first

    a = asyncio.run(use())
    b = asyncio.run(use())  # a new loop: a new client (the old one is dropped)
    assert a is not b and made == [a, b] and len(news) == 2
    assert clients.current is b and not b.is_closed

    async def close() -> None:
        await clients.aclose()
        await clients.aclose()  # again: nothing to do

    asyncio.run(close())  # b's loop is closed: closing it finds nothing to release
    assert b.is_closed and clients.current is None


def test_closing_in_the_loop_of_the_client():
    clients = LoopClient(httpx.AsyncClient)

    async def go() -> httpx.AsyncClient:
        client = clients.get()
        await clients.aclose()
        assert clients.current is None
        again = clients.get()  # usable again after closing: a fresh client
        assert again is not client and not again.is_closed
        await clients.aclose()
        return client

    assert asyncio.run(go()).is_closed


def test_a_client_of_another_running_loop_is_only_dropped():
    clients = LoopClient(httpx.AsyncClient)
    other = asyncio.new_event_loop()
    try:
        async def make() -> httpx.AsyncClient:
            return clients.get()

        theirs = other.run_until_complete(make())
        asyncio.run(clients.aclose())  # another loop, still open: not ours to close
        assert clients.current is None and not theirs.is_closed
        other.run_until_complete(theirs.aclose())
    finally:
        other.close()


# ----------------------------------------------------------------------- the layering


def test_net_imports_no_higher_layer_and_no_optional_extra():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('fastapi', 'starlette', 'uvicorn', 'mcp', 'torch'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import drvenus.net, drvenus.net.guard, drvenus.net.server, drvenus.net.client\n"
        "import drvenus.net.overflow, drvenus.net.retry, drvenus.net.urls\n"
        "bad = sorted(m for m in sys.modules if m.startswith('drvenus.')\n"
        "             and not m.startswith('drvenus.net'))\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_one_definition_of_each_server_default():
    import drvenus.serve.app
    import drvenus.serve.runs
    import drvenus.serve.server
    import drvenus.tools.server
    from drvenus.net import server

    assert drvenus.tools.server.DEFAULT_HOST is server.DEFAULT_HOST
    assert drvenus.serve.server.DEFAULT_HOST is server.DEFAULT_HOST
    assert drvenus.serve.app.MAX_BODY_BYTES is server.MAX_BODY_BYTES
    assert drvenus.tools.server.MAX_BODY_BYTES is server.MAX_BODY_BYTES
    assert drvenus.serve.runs.Busy is server.Busy is drvenus.tools.server.Busy
    assert issubclass(drvenus.serve.server.ServeThread, server.ServerThread)


# ------------------------------------------------------------------ the guard, both servers


class CountingTools:
    """A toolbox that only counts the calls that reach it."""

    names = ("search", "visit")

    def __init__(self) -> None:
        self.calls: list[ToolCall] = []

    async def call(self, tool_call: ToolCall) -> str:
        self.calls.append(tool_call)
        return f"ok {tool_call.name}"


FOREIGN = {"Host": "attacker.example"}
TEXT = {"Content-Type": "text/plain"}
BODY = json.dumps({"query": ["Bram Stoker"]})


@pytest.fixture
def tool_server():
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from drvenus.net.server import ServerThread
    from drvenus.tools.server import create_app

    tools = CountingTools()
    with ServerThread(create_app(tools, cache_size=0)) as running:
        yield running, tools


def test_tool_server_without_a_token_refuses_a_foreign_host(tool_server):
    running, tools = tool_server
    with httpx.Client(base_url=running.url, timeout=30) as c:
        # what a page the user opened can send (DNS rebinding: the name now points at us)
        r = c.post("/search", content=BODY, headers={**FOREIGN, **TEXT})
        assert r.status_code == 421
        assert c.post("/search", json={"query": ["x"]}, headers=FOREIGN).status_code == 421
        assert c.post("/visit", json={"url": ["http://127.0.0.1/"], "goal": "g"},
                      headers=FOREIGN).status_code == 421
        assert c.get("/metrics", headers=FOREIGN).status_code == 421
        assert c.get("/health", headers={"Host": "localhost:1"}).status_code == 200
        assert "error" in r.json()  # the tool server's refusals are JSON
        assert tools.calls == []
        metrics = c.get("/metrics").text
        assert 'route="/search",status="421"' in metrics  # refusals are counted


def test_tool_server_refuses_a_post_that_is_not_json(tool_server):
    running, tools = tool_server
    with httpx.Client(base_url=running.url, timeout=30) as c:
        for headers in (TEXT, {"Content-Type": "application/x-www-form-urlencoded"},
                        {"Content-Type": "multipart/form-data; boundary=x"}, {}):
            r = c.post("/search", content=BODY, headers=headers)
            assert r.status_code == 415, headers
        assert tools.calls == []
        ok = c.post("/search", content=BODY,
                    headers={"Content-Type": "application/json; charset=utf-8"})
        assert ok.status_code == 200 and ok.json() == {"content": "ok search"}
        assert len(tools.calls) == 1


def test_tool_server_with_a_token_refuses_non_json_too():
    pytest.importorskip("fastapi")
    from drvenus.net.server import ServerThread
    from drvenus.tools.server import create_app

    tools = CountingTools()
    auth = {"Authorization": "Bearer t0ken-for-tests"}
    with ServerThread(create_app(tools, token="t0ken-for-tests")) as running, \
            httpx.Client(base_url=running.url, timeout=30) as c:
        assert c.post("/search", content=BODY, headers=TEXT).status_code == 401
        assert c.post("/search", content=BODY, headers={**auth, **TEXT}).status_code == 415
        # with a token the Host is free (a public bind behind a proxy), the token is not
        r = c.post("/search", json={"query": ["x"]}, headers={**auth, **FOREIGN})
        assert r.status_code == 200
        assert c.get("/health", headers=FOREIGN).status_code == 200
        assert len(tools.calls) == 1


def test_serve_refuses_a_foreign_host_and_non_json(tmp_path):
    pytest.importorskip("fastapi")
    from drvenus.serve.app import create_app
    from drvenus.serve.server import ServeThread
    from helpers.serve import make_registry

    app = create_app(make_registry(tmp_path), mcp=False)
    question = json.dumps({"question": "direct question"})
    with ServeThread(app) as running, httpx.Client(base_url=running.url, timeout=30) as c:
        assert c.post("/api/runs", content=question,
                      headers={**FOREIGN, **TEXT}).status_code == 421
        assert c.post("/v1/chat/completions", json={}, headers=FOREIGN).status_code == 421
        assert c.post("/api/runs", content=question, headers=TEXT).status_code == 415
        assert c.post("/v1/chat/completions", content="{}", headers=TEXT).status_code == 415
        assert c.get("/api/runs").status_code == 200


def test_registered_secrets_and_url_credentials_are_redacted():
    import logging

    from drvenus.net.secrets import RedactingFilter, redact, register_secret, register_url_secrets

    register_secret("tok-EXAMPLE-0042")
    register_secret("abc")  # too short to redact safely: ordinary words would go too
    register_url_secrets("https://user:p%40ss-long-one@gw.example/v1")
    text = "401 for tok-EXAMPLE-0042 at https://x:y@host/v1 (p@ss-long-one) abc"
    assert redact(text) == "401 for *** at https://***@host/v1 (***) abc"
    record = logging.LogRecord("httpx", logging.INFO, __file__, 1, "HTTP Request: %s %s",
                               ("POST", "https://u:tok-EXAMPLE-0042@h/v1"), None)
    assert RedactingFilter().filter(record)
    assert record.getMessage() == "HTTP Request: POST https://***@h/v1"

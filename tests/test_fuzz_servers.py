"""Property-based fuzzing of every HTTP route of ``drvenus serve`` (``/api/*``, ``/v1/*``,
``/mcp``) and ``drvenus tools serve`` (``/search``, ``/visit``, ``/health``, ``/metrics``): never a
5xx, never a poisoned server (a normal request still works afterwards).

- schemathesis generates requests from an OpenAPI description of each server's routes (both
  servers keep their own schema endpoints off, so the description is written here, as the
  routes' contract, and checked against each app's routes: a new route must be added here),
  valid and invalid ones (wrong types, missing fields, odd strings);
- hypothesis strategies throw what a schema cannot describe: bodies that are not JSON,
  nesting far past any limit, lone surrogates (``"\\ud800"``), huge strings, JSON of the wrong
  kind, and MCP JSON-RPC messages (initialize, then tool calls with hostile arguments).

Real uvicorn servers on 127.0.0.1 with the scripted model and tools (no model loading). The
examples are bounded and derandomized (the same inputs every run, no example database), so the
file runs in a few tens of seconds on 2 cores and fails the same way each time.
``DRVENUS_FUZZ_SCALE=10`` multiplies every example count, for a longer hunt by hand.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("hypothesis")
schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from drvenus.net.server import ServerThread  # noqa: E402
from drvenus.serve.app import create_app  # noqa: E402
from drvenus.serve.server import ServeThread  # noqa: E402
from drvenus.tools.server import create_app as create_tool_app  # noqa: E402
from helpers.serve import make_registry, tool_body  # noqa: E402
from scripted import ScriptedTools  # noqa: E402

JSON = {"content-type": "application/json"}
MCP_HEADERS = {**JSON, "accept": "application/json, text/event-stream"}
SCALE = float(os.environ.get("DRVENUS_FUZZ_SCALE", "1"))


def bounded(examples: int) -> settings:
    """Few, fixed examples: fast, and the same ones on every run."""
    return settings(
        max_examples=max(1, round(examples * SCALE)), deadline=None, derandomize=True, database=None,
        suppress_health_check=list(HealthCheck), print_blob=False,
    )


# ------------------------------------------------------------------------------ the servers


@pytest.fixture(scope="module")
def serve_url(tmp_path_factory) -> Iterator[str]:
    registry = make_registry(tmp_path_factory.mktemp("fuzz-runs"), max_running=4,
                             max_waiting=10_000)
    with ServeThread(create_app(registry)) as running:
        yield running.url


@pytest.fixture(scope="module")
def tools_url() -> Iterator[str]:
    with ServerThread(create_tool_app(ScriptedTools(tool_body))) as running:
        yield running.url


@pytest.fixture(scope="module")
def serve(serve_url) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=serve_url, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def tools(tools_url) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=tools_url, timeout=30) as client:
        yield client


def assert_no_5xx(response: Any, what: str) -> None:
    status = response.status_code
    assert status < 500, f"{what} -> {status}: {response.text[:300]}"


def serve_still_works(client: httpx.Client) -> None:
    listing = client.get("/api/runs")
    assert listing.status_code == 200, listing.text[:300]
    for run in listing.json()["runs"][:3]:
        assert client.get(f"/api/runs/{run['id']}").status_code == 200
    assert client.get("/api/config").status_code == 200
    started = client.post("/api/runs", json={"question": "direct: still there?"})
    assert started.status_code == 201, started.text[:300]
    chat = client.post("/v1/chat/completions",
                       json={"messages": [{"role": "user", "content": "direct: and /v1?"}]})
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"] == "42"


def tools_still_work(client: httpx.Client) -> None:
    r = client.post("/search", json={"query": ["Dracula"]})
    assert r.status_code == 200 and "Dracula" in r.json()["content"]
    assert client.get("/health").json()["status"] == "ok"


# ---------------------------------------------------------------- schemathesis: the contracts


def _op(body: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    op: dict[str, Any] = {"responses": {"default": {"description": "any"}}, **extra}
    if body is not None:
        op["requestBody"] = {"required": True,
                             "content": {"application/json": {"schema": body}}}
    return op


RUN_ID = {"name": "run_id", "in": "path", "required": True, "schema": {"type": "string"}}
REST = {"name": "rest", "in": "path", "required": True, "schema": {"type": "string"}}
MESSAGE = {
    "type": "object",
    "properties": {
        "role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]},
        "content": {"anyOf": [
            {"type": "string"},
            {"type": "array", "items": {"type": "object", "properties": {
                "type": {"type": "string"}, "text": {"type": "string"}}}},
        ]},
    },
    "required": ["role", "content"],
}
MCP_ACCEPT = {"name": "accept", "in": "header", "required": True, "schema": {
    "type": "string", "enum": ["application/json, text/event-stream", "text/event-stream"]}}
MCP_SESSION = {"name": "mcp-session-id", "in": "header", "schema": {"type": "string"}}
SERVE_API = {
    "openapi": "3.0.3",
    "info": {"title": "drvenus serve", "version": "1"},
    "paths": {
        "/": {"get": _op(parameters=[
            {"name": "token", "in": "query", "schema": {"type": "string"}}])},
        "/favicon.ico": {"get": _op()},
        "/static/{name}": {"get": _op(parameters=[
            {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}])},
        "/health": {"get": _op()},
        "/api/config": {"get": _op()},
        "/api/runs": {
            "get": _op(),
            "post": _op({"type": "object", "required": ["question"], "properties": {
                "question": {"type": "string", "maxLength": 9000},
                "model": {"type": "string"}, "tools": {"type": "string"},
                "max_steps": {"type": "integer"}}}),
        },
        "/api/runs/{run_id}": {"get": _op(parameters=[RUN_ID])},
        "/api/runs/{run_id}/events": {"get": _op(parameters=[
            RUN_ID, {"name": "after", "in": "query", "schema": {"type": "string"}}])},
        "/api/runs/{run_id}/cancel": {"post": _op({"type": "object"}, parameters=[RUN_ID])},
        "/api/runs/{run_id}/report": {"get": _op(parameters=[RUN_ID])},
        "/api/runs/{run_id}/trace": {"get": _op(parameters=[RUN_ID])},
        # what the routes above do not take: an unknown run (its id holding a "/"), or a
        # known run asked for a page it does not have
        "/api/runs/{rest}": {"get": _op(parameters=[REST]), "post": _op(parameters=[REST])},
        "/api/replay": {"post": _op({"type": "object", "required": ["text"],
                                     "properties": {"text": {"type": "string"}}})},
        "/v1/models": {"get": _op()},
        "/v1/models/{model}": {"get": _op(parameters=[
            {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}])},
        "/v1/chat/completions": {"post": _op({
            "type": "object", "required": ["messages"], "properties": {
                "model": {"type": "string"},
                "messages": {"type": "array", "items": MESSAGE},
                "stream": {"type": "boolean"},
                "stream_options": {"type": "object", "properties": {
                    "include_usage": {"type": "boolean"}}}}})},
        "/mcp": {"post": _op({"type": "object", "required": ["jsonrpc", "method"], "properties": {
            "jsonrpc": {"type": "string", "enum": ["2.0"]}, "id": {"type": "integer"},
            "method": {"type": "string"}, "params": {"type": "object"}}},
            parameters=[MCP_ACCEPT]),
            "get": _op(parameters=[MCP_ACCEPT, MCP_SESSION]),
            "delete": _op(parameters=[MCP_SESSION])},
    },
}
TOOLS_API = {
    "openapi": "3.0.3",
    "info": {"title": "drvenus tools serve", "version": "1"},
    "paths": {
        "/health": {"get": _op()},
        "/metrics": {"get": _op()},
        "/search": {"post": _op({"type": "object", "properties": {
            "query": {"anyOf": [{"type": "string"},
                                {"type": "array", "items": {"type": "string"}}]}}})},
        "/visit": {"post": _op({"type": "object", "properties": {
            "url": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
            "goal": {"type": "string"}}})},
    },
}



def app_routes(app: Any) -> set[tuple[str, str]]:
    """``(method, path)`` of every route an app serves, as an OpenAPI description writes them
    (``{model:path}`` as ``{model}``, a mounted folder as ``/static/{name}``; HEAD and OPTIONS
    left out: they come with GET)."""
    import re

    from starlette.routing import Mount

    found = set()
    for route in app.routes:
        path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)
        if isinstance(route, Mount):
            found.add(("get", path + "/{name}"))
            continue
        found |= {(m.lower(), path) for m in route.methods or () if m not in ("HEAD", "OPTIONS")}
    return found


def described(api: dict[str, Any]) -> set[tuple[str, str]]:
    return {(method, path) for path, ops in api["paths"].items() for method in ops}


def test_the_descriptions_list_every_route_of_both_apps(tmp_path):
    """A route missing here would go unfuzzed: each app's routes are exactly its
    description's."""
    registry = make_registry(tmp_path)
    assert app_routes(create_app(registry)) == described(SERVE_API)
    assert app_routes(create_tool_app(ScriptedTools(tool_body))) == described(TOOLS_API)


serve_schema = schemathesis.openapi.from_dict(SERVE_API)
tools_schema = schemathesis.openapi.from_dict(TOOLS_API)


@serve_schema.parametrize()
@bounded(25)
def test_serve_routes_never_answer_5xx(case, serve_url):
    response = case.call(base_url=serve_url, timeout=30)
    assert_no_5xx(response, f"{case.method} {case.formatted_path}")


@tools_schema.parametrize()
@bounded(40)
def test_tool_server_routes_never_answer_5xx(case, tools_url):
    response = case.call(base_url=tools_url, timeout=30)
    assert_no_5xx(response, f"{case.method} {case.formatted_path}")


# ------------------------------------------------------- hypothesis: what schemas cannot say

SURROGATE = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
HOSTILE_TEXT = st.one_of(
    st.text(max_size=40),
    st.text(SURROGATE, min_size=1, max_size=3),
    st.builds(lambda a, s, b: a + s + b, st.text(max_size=10), SURROGATE, st.text(max_size=10)),
    st.sampled_from(["", " ", "\x00", "\u202e", "\ufeff", "x" * 20_000, "\U0001f600" * 3000]),
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | HOSTILE_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(HOSTILE_TEXT, inner, max_size=4),
    max_leaves=12,
)


def deep(levels: int, open_: str, close: str, inner: str = "1") -> str:
    return open_ * levels + inner + close * levels


RAW_BODIES = st.one_of(
    st.binary(max_size=200),
    st.sampled_from([
        b"", b"null", b"[]", b"42", b'"q"', b"{", b'{"question": }', b"\xff\xfe{}",
        b'{"question": "\\ud800"}', b'{"question": "\\udfff\\ud800"}', b'{"question": "\\u0000"}',
        b'{"a": 1, "a": 2}', b'{"question": 1e999}', b'{"question": NaN}',
        deep(100_000, "[", "]").encode(), deep(100_000, '{"a":', "}").encode(),
        ('{"question": ' + deep(5_000, "[", "]") + "}").encode(),
        ('{"messages": ' + deep(150, "[", "]", '{"role": "user"}') + "}").encode(),
    ]),
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({}, optional={
        "question": JSON_VALUES, "model": JSON_VALUES, "tools": JSON_VALUES,
        "max_steps": JSON_VALUES, "messages": JSON_VALUES, "text": JSON_VALUES,
        "stream": JSON_VALUES, "query": JSON_VALUES, "url": JSON_VALUES, "goal": JSON_VALUES,
    }).map(lambda v: json.dumps(v).encode()),
)
SERVE_POSTS = ["/api/runs", "/api/replay", "/v1/chat/completions", "/api/runs/x/cancel", "/mcp"]
TOOL_POSTS = ["/search", "/visit"]


@bounded(60)
@given(path=st.sampled_from(SERVE_POSTS), body=RAW_BODIES)
def test_serve_survives_hostile_bodies(serve, path, body):
    headers = MCP_HEADERS if path == "/mcp" else JSON
    assert_no_5xx(serve.post(path, content=body, headers=headers), f"POST {path} {body[:80]!r}")


@bounded(60)
@given(path=st.sampled_from(TOOL_POSTS), body=RAW_BODIES)
def test_tool_server_survives_hostile_bodies(tools, path, body):
    assert_no_5xx(tools.post(path, content=body, headers=JSON), f"POST {path} {body[:80]!r}")


@bounded(30)
@given(
    path=st.sampled_from(["/api/runs/{}", "/api/runs/{}/events", "/api/runs/{}/cancel"]),
    run_id=st.text(max_size=80).filter(lambda s: "/" not in s and "?" not in s and "#" not in s),
    after=st.one_of(st.none(), HOSTILE_TEXT.filter(lambda s: s.isascii()), st.integers()),
)
def test_serve_survives_hostile_run_ids(serve, path, run_id, after):
    from urllib.parse import quote

    url = path.format(quote(run_id, safe="", errors="surrogatepass"))
    params = {"after": str(after)} if after is not None else None
    method = "POST" if url.endswith("/cancel") else "GET"
    response = serve.request(method, url, params=params, json={} if method == "POST" else None)
    assert_no_5xx(response, f"{method} {url}")


EVENT_TYPES = ["started", "step_started", "model_output", "turn", "tool_call", "tool_result",
               "format_error", "limit_notice", "answer", "error", "finished", "other"]
DATA_KEYS = ["question", "messages", "message", "arguments", "name", "content", "record", "text",
             "kind", "answer", "reason", "query", "url", "goal", "termination", "prediction"]
DATA = st.dictionaries(st.sampled_from(DATA_KEYS), JSON_VALUES, max_size=5)
SAVED_ROWS = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(EVENT_TYPES),
                           "data": DATA | JSON_VALUES | st.fixed_dictionaries({"record": DATA})}),
    st.fixed_dictionaries({"messages": st.lists(
        st.dictionaries(st.sampled_from(["role", "content"]), JSON_VALUES | st.sampled_from(
            ["system", "user", "assistant"]), max_size=2) | JSON_VALUES, max_size=4)},
        optional={"question": JSON_VALUES, "termination": JSON_VALUES,
                  "prediction": JSON_VALUES}),
)


@bounded(60)
@given(rows=st.lists(SAVED_ROWS, min_size=1, max_size=4), as_array=st.booleans())
def test_replay_survives_saved_files_of_any_shape(serve, rows, as_array):
    text = json.dumps(rows) if as_array else "\n".join(json.dumps(r) for r in rows)
    response = serve.post("/api/replay", json={"text": text})
    assert_no_5xx(response, f"replay {text[:300]}")
    assert response.status_code in (200, 400, 422), response.text[:300]


# ------------------------------------------------------------------- MCP: a real session


def mcp_post(client: httpx.Client, message: dict[str, Any] | bytes, session: str | None = None
             ) -> httpx.Response:
    headers = dict(MCP_HEADERS)
    if session:
        headers["mcp-session-id"] = session
    body = message if isinstance(message, bytes) else json.dumps(message).encode()
    return client.post("/mcp", content=body, headers=headers)


def mcp_result(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC message of a response (JSON, or the data of its event stream)."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in response.text.splitlines()
                if line.startswith("data:")]
        return json.loads(data[-1])
    return response.json()


@pytest.fixture(scope="module")
def mcp_session(serve) -> str:
    hello = mcp_post(serve, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "fuzz", "version": "1"}}})
    assert hello.status_code == 200, hello.text
    session = hello.headers["mcp-session-id"]
    mcp_post(serve, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
    return session


MCP_TOOLS = ["start_research", "research_status", "search", "visit", "deep_research"]
ARGUMENT_NAMES = ["question", "run_id", "wait_seconds", "query", "url", "goal"]


@bounded(40)
@given(
    tool=st.sampled_from(MCP_TOOLS),
    arguments=st.dictionaries(st.sampled_from(ARGUMENT_NAMES) | HOSTILE_TEXT, JSON_VALUES,
                              max_size=4),
)
def test_mcp_tool_calls_with_hostile_arguments(serve, mcp_session, tool, arguments):
    if isinstance(arguments.get("wait_seconds"), int | float):  # keep long polls short
        arguments["wait_seconds"] = 0
    if tool == "deep_research" and isinstance(arguments.get("question"), str):
        arguments["question"] = "direct: " + arguments["question"]  # a scripted, instant run
    message = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
               "params": {"name": tool, "arguments": arguments}}
    response = mcp_post(serve, json.dumps(message).encode(), mcp_session)
    assert_no_5xx(response, f"tools/call {tool} {str(arguments)[:200]}")
    if response.status_code == 200:
        assert "result" in mcp_result(response) or "error" in mcp_result(response)


def test_mcp_refuses_hostile_questions_with_tool_errors(serve, mcp_session):
    for question in ("x" * 500_000, "\ud800", "   "):
        message = {"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                   "params": {"name": "start_research", "arguments": {"question": question}}}
        response = mcp_post(serve, json.dumps(message).encode(), mcp_session)
        if question == "\ud800":  # the SDK's JSON-RPC parser refuses it before any tool
            assert response.status_code == 400 and "Parse error" in response.text
            continue
        assert response.status_code == 200, response.text[:300]
        result = mcp_result(response)["result"]
        assert result["isError"], result
    assert all(len(r["question"]) <= 8000 for r in serve.get("/api/runs").json()["runs"])


# ------------------------------------------------------------------------ nobody poisoned


def test_after_all_that_both_servers_still_work(serve, tools, mcp_session):
    """Runs last in this file (pytest keeps the file's order): every earlier test threw its
    worst at the same two servers."""
    serve_still_works(serve)
    tools_still_work(tools)
    listed = mcp_post(serve, {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, mcp_session)
    assert listed.status_code == 200
    names = {t["name"] for t in mcp_result(listed)["result"]["tools"]}
    assert {"deep_research", "search", "visit"} <= names

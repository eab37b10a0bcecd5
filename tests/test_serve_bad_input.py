"""Hostile and careless input to ``drvenus serve`` and ``drvenus tools serve`` (real uvicorn on
127.0.0.1, scripted model and tools): deep nesting, lone surrogates, huge questions over MCP and
replayed files of the wrong shape are refused with a reason (4xx), and the server keeps working
for everyone afterwards (issue 31)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

pytest.importorskip("fastapi")

from drvenus.net.server import MAX_JSON_DEPTH, ServerThread, json_problem  # noqa: E402
from drvenus.serve.app import create_app  # noqa: E402
from drvenus.serve.runs import MAX_QUESTION_CHARS, BadQuestion  # noqa: E402
from drvenus.serve.server import ServeThread  # noqa: E402
from drvenus.tools.server import create_app as create_tool_app  # noqa: E402
from helpers.serve import make_registry, tool_body  # noqa: E402
from scripted import ScriptedTools  # noqa: E402

JSON = {"content-type": "application/json"}
DEEP = 100_000


def deep(levels: int, inner: str = "1") -> str:
    return "[" * levels + inner + "]" * levels


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    app = create_app(make_registry(tmp_path_factory.mktemp("runs"), max_running=4,
                                   max_waiting=8))
    with ServeThread(app) as running:
        yield running


@pytest.fixture(scope="module")
def tool_server():
    with ServerThread(create_tool_app(ScriptedTools(tool_body))) as running:
        yield running


@pytest.fixture()
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def still_works(client: httpx.Client) -> None:
    """A normal client is still served: the run list, one run, a new run."""
    listing = client.get("/api/runs")
    assert listing.status_code == 200, listing.text
    for run in listing.json()["runs"][:5]:
        assert client.get(f"/api/runs/{run['id']}").status_code == 200
    assert client.post("/api/runs", json={"question": "direct: fine?"}).status_code == 201


# ------------------------------------------------------------------------------ deep nesting


@pytest.mark.parametrize("levels", [DEEP, MAX_JSON_DEPTH + 5])
def test_deep_nesting_is_a_400_on_every_json_route(client, tool_server, levels):
    bodies = {
        "/api/runs": '{"question": ' + deep(levels, '"q"') + "}",
        "/v1/chat/completions": '{"messages": ' + deep(levels, '{"role": "user"}') + "}",
        "/api/replay": '{"text": "x", "more": ' + deep(levels) + "}",
    }
    for path, body in bodies.items():
        r = client.post(path, content=body, headers=JSON)
        assert r.status_code == 400, (path, r.status_code, r.text[:200])
        error = r.json()["error"]
        message = error["message"] if isinstance(error, dict) else error  # /v1: OpenAI's shape
        assert f"nested more than {MAX_JSON_DEPTH} levels" in message, (path, message)
    with httpx.Client(base_url=tool_server.url, timeout=30) as tools:
        for path, body in (("/search", '{"query": ' + deep(levels, '"q"') + "}"),
                           ("/visit", '{"url": ["http://a.example/"], "goal": '
                                      + deep(levels, '"g"') + "}")):
            r = tools.post(path, content=body, headers=JSON)
            assert r.status_code == 400 and "nested more than" in r.json()["error"], r.text
        assert tools.post("/search", json={"query": ["ok"]}).status_code == 200
    still_works(client)


def test_json_problem_walks_any_depth_without_recursion():
    value: list = []
    for _ in range(200_000):
        value = [value]
    assert "nested more than 100 levels" in (json_problem(value) or "")
    assert json_problem({"a": [{"b": "\u00e9\u6771"}]}) is None
    assert "lone surrogate" in (json_problem({"k": ["ok", "\ud800"]}) or "")
    assert "lone surrogate" in (json_problem({"\udfff": 1}) or "")


# ------------------------------------------------------------------------- lone surrogates


def test_a_lone_surrogate_is_refused_and_poisons_nothing(client):
    for body in ('{"question": "\\ud800"}', '{"question": "why \\udc00 not"}'):
        r = client.post("/api/runs", content=body, headers=JSON)
        assert r.status_code == 400 and "surrogate" in r.json()["error"], r.text
    chat = '{"messages": [{"role": "user", "content": "who \\ud800?"}]}'
    r = client.post("/v1/chat/completions", content=chat, headers=JSON)
    assert r.status_code == 400 and "surrogate" in r.text
    replay = client.post("/api/replay", content='{"text": "\\ud800"}', headers=JSON)
    assert replay.status_code == 400
    still_works(client)


def test_the_registry_refuses_what_no_face_may_start(tmp_path):
    registry = make_registry(tmp_path)
    for question, status in (("\ud800", 400), ("  ", 400), ("x" * (MAX_QUESTION_CHARS + 1), 413)):
        with pytest.raises(BadQuestion) as info:
            registry.start(question)
        assert info.value.status == status
    assert registry.list() == []


def surrogate_script(question: str) -> list[str]:
    from scripted import answer

    return [answer("half a pair: \ud800 and more")]


def test_a_lone_surrogate_from_the_model_keeps_the_listing_working(tmp_path):
    """Input is refused at the door, but a model (or a page) may still produce one: the run
    stores it as U+FFFD, so its file, the run list, the run and its event stream all work."""
    from drvenus.agent import AgentConfig, ResearchAgent
    from drvenus.serve.agents import AgentPool
    from drvenus.serve.runs import RunRegistry
    from scripted import PerQuestionModel

    agent = ResearchAgent(PerQuestionModel(surrogate_script), ScriptedTools(tool_body),
                          AgentConfig(max_steps=3, max_attempts=1, backoff_base=0.0))
    app = create_app(RunRegistry(AgentPool.fixed(agent, "scripted"), tmp_path), mcp=False)
    with ServeThread(app) as running, httpx.Client(base_url=running.url, timeout=30) as c:
        run_id = c.post("/api/runs", json={"question": "direct"}).json()["id"]
        for _ in range(200):
            one = c.get(f"/api/runs/{run_id}")
            assert one.status_code == 200, one.text
            if one.json()["status"] == "done":
                break
            time.sleep(0.02)
        assert one.json()["prediction"] == "half a pair: \ufffd and more"
        assert c.get("/api/runs").status_code == 200
        with c.stream("GET", f"/api/runs/{run_id}/events") as stream:
            assert stream.status_code == 200 and "event: end" in stream.read().decode()
        written = (tmp_path / f"{run_id}.jsonl").read_text(encoding="utf-8")
        assert written.count("\n") == one.json()["events"]  # every event is in the file
        assert c.post("/api/runs", json={"question": "direct again"}).status_code == 201


# ---------------------------------------------------------------------- MCP question cap


def test_mcp_refuses_a_question_over_the_cap(server, client):
    pytest.importorskip("mcp")
    from mcp import Client

    async def go():
        async with Client(server.url + "/mcp") as mcp_client:
            huge = "x" * 500_000
            return [await mcp_client.call_tool(tool, {"question": huge})
                    for tool in ("start_research", "deep_research")]

    for result in asyncio.run(go()):
        assert result.is_error, result
        assert f"over {MAX_QUESTION_CHARS} characters" in result.content[0].text
    assert all(len(r["question"]) < 1000 for r in client.get("/api/runs").json()["runs"])


# ------------------------------------------------------------------- replay of odd shapes


BAD_REPLAYS = [
    ({"messages": ["not an object", 1]}, "messages[0] is not an object"),
    ({"messages": [{"role": "system"}, 5]}, "messages[1] is not an object"),
    ({"type": "started", "data": "x"}, "data is not an object"),
    ({"type": "started", "data": [1, 2]}, "data is not an object"),
    ({"type": "turn", "data": {"message": "hi"}}, "data.message is not an object"),
    ({"type": "tool_call", "data": {"name": "search", "arguments": [1]}},
     "data.arguments is not an object"),
    ({"type": "finished", "data": {"record": [1]}}, "data.record is not an object"),
    ({"type": "finished", "data": {"record": {"messages": [1]}}}, "is not an object"),
    ({"type": "started", "data": {"messages": "x"}}, "data.messages is not a list"),
]


@pytest.mark.parametrize(("row", "reason"), BAD_REPLAYS)
def test_replay_of_entries_that_are_not_objects_says_why(client, row, reason):
    r = client.post("/api/replay", json={"text": json.dumps(row)})
    assert r.status_code == 422, r.text
    assert "cannot replay" in r.json()["error"] and reason in r.json()["error"]


def test_replay_of_odd_but_readable_values_is_answered(client):
    rows = [
        {"type": "started", "data": {"question": 5}},
        {"type": "tool_call", "data": {"name": "search", "arguments": {"query": 7}}},
        {"type": "tool_call", "data": {"name": "visit", "arguments": {"url": "http://a/"}}},
        {"type": "finished", "data": {"record": {"termination": 3}}},
    ]
    text = "\n".join(json.dumps(r) for r in rows)
    r = client.post("/api/replay", json={"text": text})
    assert r.status_code == 200, r.text
    events = r.json()["runs"][0]["events"]
    assert events[1]["view"]["queries"] == [] and events[2]["view"]["urls"] == ["http://a/"]
    no_content = {"messages": [{"role": "system"}, {"role": "user"}]}
    assert client.post("/api/replay", json={"text": json.dumps(no_content)}).status_code == 200
    deep_text = json.dumps({"type": "started", "data": {"x": json.loads(deep(300))}})
    r = client.post("/api/replay", json={"text": deep_text})
    assert r.status_code == 422 and "nested more than" in r.json()["error"]

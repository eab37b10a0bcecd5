"""Heavy mode on every face of ``drvenus serve`` (real uvicorn on 127.0.0.1, a scripted model):
N parallel runs and one synthesised answer over the web API, /v1 (an extra body field or a
model id suffix) and MCP; every run's events tagged with its run and kept in the stored run
(replay works); bad values refused with one line (issue 33)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")

from drvenus.agent import replay_messages  # noqa: E402
from drvenus.agent.events import read_events, split_runs  # noqa: E402
from drvenus.agent.record import ResultRecord  # noqa: E402
from drvenus.serve.app import create_app  # noqa: E402
from drvenus.serve.server import ServeThread  # noqa: E402
from helpers.serve import DRACULA, HEAVY_CAP, SYNTHESISED, events_of, read_sse  # noqa: E402
from helpers.serve import make_heavy_registry as make_registry  # noqa: E402
from scripted import answer, call  # noqa: E402

CAP = HEAVY_CAP
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def server(runs_dir):
    with ServeThread(create_app(make_registry(runs_dir))) as running:
        yield running


@pytest.fixture()
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def check_heavy_trace(events: list[dict], runs: int) -> None:
    """Each run's events carry its index and replay to its own record; the decision is last."""
    tags = [e["data"].get("heavy_run") for e in events]
    assert set(tags) == {*range(runs), None}
    assert events[-1]["type"] == "finished" and tags[-1] is None
    split = split_runs(events)
    assert len(split) == runs + 1
    for i, run in enumerate(split[:runs]):
        assert {e["data"]["heavy_run"] for e in run} == {i}
        assert run[0]["type"] == "started" and run[-1]["type"] == "finished"
        assert replay_messages(run) == ResultRecord(**run[-1]["data"]["record"]).messages
    assert split[-1][0]["data"]["heavy"] == runs


def test_heavy_over_the_web_api_keeps_every_run(client, runs_dir):
    config = client.get("/api/config").json()
    assert config["heavy"] == 1 and config["heavy_cap"] == CAP
    created = client.post("/api/runs", json={"question": "Who wrote Dracula?", "heavy": 3})
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]
    events = events_of(client, run_id)
    assert {e["run"] for e in events} == {0, 1, 2, None}
    # the runs really went on at once: run 2 started before run 0 finished
    order = [(e["run"], e["type"]) for e in events]
    assert order.index((2, "started")) < order.index((0, "finished"))
    final = [e for e in events if e["run"] is None]
    assert final[0]["type"] == "started" and final[0]["view"]["heavy"] == 3
    assert final[0]["view"]["heavy_mode"] == "synthesis"
    assert final[-1]["type"] == "finished" and final[-1]["view"]["prediction"] == SYNTHESISED
    body = client.get(f"/api/runs/{run_id}").json()
    assert body["status"] == "done" and body["prediction"] == SYNTHESISED
    assert body["result"]["heavy"] == {"runs": 3, "chosen_by": "synthesis", "how": "synthesised"}
    assert body["result"]["sources"] == [DRACULA]  # read by the runs, not the synthesis
    # the stored run: every event, in order; read back (a restarted server) and replayed
    stored = read_events(runs_dir / f"{run_id}.jsonl")
    assert len(stored) == len(events)
    check_heavy_trace(stored, 3)
    again = make_registry(runs_dir).get(run_id)
    assert again is not None and again.record["prediction"] == SYNTHESISED
    assert len(again.events) == len(events)
    text = (runs_dir / f"{run_id}.jsonl").read_text(encoding="utf-8")
    [replayed] = client.post("/api/replay", json={"text": text}).json()["runs"]
    assert [e["run"] for e in replayed["events"]] == [e["run"] for e in events]
    record = stored[-1]["data"]["record"]  # a results file with the record replays too
    [rebuilt] = client.post("/api/replay", json={"text": json.dumps(record)}).json()["runs"]
    assert {e["run"] for e in rebuilt["events"]} == {0, 1, 2, None}
    assert rebuilt["events"][-1]["view"]["prediction"] == SYNTHESISED
    one = client.post("/api/runs", json={"question": "Who wrote Dracula?", "heavy": 1})
    plain = events_of(client, one.json()["id"])
    assert {e["run"] for e in plain} == {None} and plain[-1]["view"]["heavy"] is None


@pytest.mark.parametrize("value", [0, 65, CAP + 1, -1, "4", 2.5, True, "nan"])
def test_bad_heavy_values_are_400_with_one_line(client, value):
    raw = ('{"question": "Who wrote Dracula?", "heavy": NaN}' if value == "nan"
           else json.dumps({"question": "Who wrote Dracula?", "heavy": value}))
    r = client.post("/api/runs", content=raw, headers=JSON)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "heavy" in error and "\n" not in error


def test_a_stopped_heavy_run_ends_as_interrupted(client):
    run_id = client.post("/api/runs", json={"question": "slow: who wrote Dracula?",
                                             "heavy": 2}).json()["id"]
    with client.stream("GET", f"/api/runs/{run_id}/events") as r:
        read_sse(r, stop_after=4)  # the runs are under way
    assert client.post(f"/api/runs/{run_id}/cancel", json={}).json()["stopped"] is True
    body = client.get(f"/api/runs/{run_id}").json()
    assert body["status"] == "done" and body["termination"] == "interrupted"
    events = events_of(client, run_id)
    assert events[-1]["type"] == "finished" and events[-1]["run"] is None


def test_a_server_started_heavy_runs_every_research_heavy(tmp_path):
    """``drvenus serve --heavy 2``: a request without ``heavy`` gets 2 runs, ``heavy: 1`` one."""
    registry = make_registry(tmp_path, runs=2)

    async def go():
        heavy = registry.start("Who wrote Dracula?")
        single = registry.start("Who wrote Dracula?", registry.pool.check(
            type(heavy.choice)(heavy=1)))
        return await heavy.wait(), await single.wait()

    heavy, single = asyncio.run(go())
    assert heavy["prediction"] == SYNTHESISED and len(heavy["extra"]["heavy"]["runs"]) == 2
    assert single["prediction"] == "Bram Stoker" and "extra" not in single


def test_openai_heavy_by_extra_body_and_by_model_suffix(server):
    openai = pytest.importorskip("openai")
    oa = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    ids = [m.id for m in oa.models.list().data]
    assert f"drvenus+heavy{CAP}" in ids
    assert oa.models.retrieve("drvenus:default+heavy2").id == "drvenus:default+heavy2"
    question = [{"role": "user", "content": "Who wrote Dracula?"}]
    reply = oa.chat.completions.create(model="drvenus", messages=question,
                                       extra_body={"heavy": 2})
    message = reply.choices[0].message
    assert message.content.startswith(SYNTHESISED) and DRACULA in message.content
    reasoning = message.model_extra["reasoning_content"]
    assert "[run 1] Searching: Dracula author" in reasoning and "[run 2] Read:" in reasoning
    assert "Writing one answer from the answers of 2 runs" in reasoning
    chunks = list(oa.chat.completions.create(model="drvenus+heavy3", messages=question,
                                             stream=True))
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or ""
                        for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "[run 3] Answered: Bram Stoker" in reasoning
    assert content.startswith(SYNTHESISED)  # the answer is content; the runs are reasoning
    assert "[run" not in content


@pytest.mark.parametrize(
    ("model", "extra", "status", "param"),
    [
        ("drvenus", {"heavy": 0}, 400, "heavy"),
        ("drvenus", {"heavy": 65}, 400, "heavy"),
        ("drvenus", {"heavy": "two"}, 400, "heavy"),
        ("drvenus", {"heavy": 2.0}, 400, "heavy"),
        ("drvenus+heavy0", {}, 400, "model"),
        ("drvenus+heavy65", {}, 400, "model"),
        ("drvenus+heavy2", {"heavy": 3}, 400, "heavy"),
        ("drvenus+heavyx", {}, 404, "model"),
    ],
)
def test_openai_bad_heavy_values(server, model, extra, status, param):
    openai = pytest.importorskip("openai")
    oa = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.APIStatusError) as caught:
        oa.chat.completions.create(model=model, extra_body=extra,
                                   messages=[{"role": "user", "content": "Who wrote Dracula?"}])
    assert caught.value.status_code == status and caught.value.body["param"] == param
    assert "\n" not in caught.value.body["message"]


def test_openai_nan_heavy_is_400(client):
    r = client.post("/v1/chat/completions", headers=JSON, content=(
        '{"model": "drvenus", "heavy": NaN, "messages": [{"role": "user", "content": "q?"}]}'))
    assert r.status_code == 400 and r.json()["error"]["param"] == "heavy"


def test_mcp_heavy_research_with_progress_over_all_runs(server):
    pytest.importorskip("mcp")
    from mcp import Client

    async def go():
        progress: list[tuple[float, str]] = []

        async def on_progress(done, total, message):
            progress.append((done, message))

        async with Client(server.url + "/mcp", read_timeout_seconds=30) as mcp_client:
            tools = {t.name: t for t in (await mcp_client.list_tools()).tools}
            result = await mcp_client.call_tool(
                "deep_research", {"question": "Who wrote Dracula?", "heavy": 2},
                progress_callback=on_progress)
            bad = [await mcp_client.call_tool("deep_research",
                                              {"question": "Who wrote Dracula?", "heavy": v})
                   for v in (0, 65, "two", 2.5, CAP + 1)]  # (the SDK sends NaN as null)
            started = await mcp_client.call_tool("start_research",
                                                  {"question": "Who wrote Dracula?", "heavy": 2})
            status = await mcp_client.call_tool(
                "research_status", {"run_id": started.structured_content["run_id"],
                                    "wait_seconds": 20})
            return tools, result, progress, bad, status.structured_content

    tools, result, progress, bad, status = asyncio.run(go())
    for name in ("deep_research", "start_research"):
        schema = tools[name].input_schema["properties"]["heavy"]
        assert json.dumps(schema).count(f'"maximum": {CAP}') == 1, schema
    assert not result.is_error and result.content[0].text.startswith(SYNTHESISED)
    assert DRACULA in result.content[0].text
    values = [v for v, _ in progress]
    assert values == sorted(set(values)) and len(values) > 8
    messages = [m for _, m in progress]
    assert any("[run 1]" in m for m in messages) and any("[run 2]" in m for m in messages)
    assert any("Writing one answer from the answers of 2 runs" in m for m in messages)
    for reply in bad:
        text = reply.content[0].text
        assert reply.is_error and "heavy" in text and "\n" not in text, text
    assert status["status"] == "done" and status["answer"].startswith(SYNTHESISED)


def test_drvenus_mcp_heavy_over_stdio(tmp_path):
    """``drvenus mcp --heavy 2`` (a model server, a local corpus): deep_research is two runs
    and the synthesis; a request asks for 3; the stored runs keep every run's trace."""
    pytest.importorskip("mcp")
    import os
    import sys

    from mcp import Client, StdioServerParameters

    from drvenus import protocol
    from stub_server import StubServer

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "1", "title": "Dracula", "url": DRACULA,
                                  "text": "Dracula is an 1897 novel by Bram Stoker."}) + "\n")

    def reply(request) -> str:
        messages = request.json["messages"]
        if messages[0]["content"] == protocol.SYNTHESIS_PROMPT:
            return answer(SYNTHESISED)
        if not any(m["role"] == "assistant" for m in messages):
            return call("search", query=["Dracula author"])
        return answer("Bram Stoker")

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "DRVENUS_CACHE_DIR": str(tmp_path),
           "DRVENUS_MAX_ATTEMPTS": "1"}
    runs_dir = tmp_path / "runs"
    with StubServer(default=reply) as model:
        params = StdioServerParameters(command=sys.executable, env=env, args=[
            "-m", "drvenus", "mcp", "--heavy", "2", "--max-heavy", "3", "--base-url",
            model.base_url, "--model-name", "stub", "--corpus", str(corpus),
            "--runs-dir", str(runs_dir)])

        async def go():
            async with Client(params, read_timeout_seconds=120) as mcp_client:
                default = await mcp_client.call_tool("deep_research",
                                                     {"question": "Who wrote Dracula?"})
                three = await mcp_client.call_tool("deep_research",
                                                   {"question": "Who wrote Dracula?", "heavy": 3})
                over = await mcp_client.call_tool("deep_research",
                                                  {"question": "Who wrote Dracula?", "heavy": 4})
                return default, three, over

        default, three, over = asyncio.run(asyncio.wait_for(go(), 240))
    assert default.content[0].text.startswith(SYNTHESISED), default.content[0].text
    assert three.content[0].text.startswith(SYNTHESISED)
    assert over.is_error and "heavy" in over.content[0].text
    counts = sorted(len(read_events(p)[-1]["data"]["record"]["extra"]["heavy"]["runs"])
                    for p in runs_dir.glob("*.jsonl"))
    assert counts == [2, 3]
    for path in runs_dir.glob("*.jsonl"):
        events = read_events(path)
        check_heavy_trace(events, len(events[-1]["data"]["record"]["extra"]["heavy"]["runs"]))

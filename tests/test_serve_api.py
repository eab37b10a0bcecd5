"""``drvenus serve`` over real HTTP on 127.0.0.1 with a scripted model (fast): the web API and
its event stream, reconnecting, stopping, limits, replay of saved files, /v1 through the
``openai`` client and /mcp through the MCP SDK's client."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import httpx
import pytest

from drvenus.agent import read_trace
from drvenus.serve.app import create_app
from drvenus.serve.server import ServeThread
from helpers.serve import DRACULA, events_of, make_registry, read_sse


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def server(runs_dir):
    app = create_app(make_registry(runs_dir, max_running=2, max_waiting=1))
    with ServeThread(app) as running:
        yield running


@pytest.fixture()
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def start(client: httpx.Client, question: str, **options) -> str:
    r = client.post("/api/runs", json={"question": question, **options})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_the_page_and_its_files_are_served(client):
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert 'id="question"' in page.text and "/static/app.js" in page.text
    assert client.get("/static/app.js").status_code == 200
    assert client.get("/static/app.css").status_code == 200
    icon = client.get("/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
    config = client.get("/api/config").json()
    assert config["models"] == [{"id": "default", "label": "scripted", "about": "", "max_steps": 5}]
    assert config["max_steps"] == 5 and config["step_cap"] >= 5


def test_a_run_streams_viewable_events_to_the_end(client, runs_dir):
    run_id = start(client, "Who wrote Dracula?")
    events = events_of(client, run_id)
    assert [e["i"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[0] == "started" and kinds[-1] == "finished"
    search = next(e for e in events if e["type"] == "tool_result" and e["view"]["name"] == "search")
    assert search["view"]["results"][0]["hits"][0]["title"] == "Dracula"
    visit = next(e for e in events if e["type"] == "tool_result" and e["view"]["name"] == "visit")
    assert "1897 Gothic" in visit["view"]["pages"][0]["evidence"]
    thinking = next(e for e in events if e["type"] == "model_output")
    assert thinking["view"]["thinking"] == "I should use search."
    done = events[-1]["view"]
    assert done["answered"] and done["prediction"] == "Bram Stoker"
    assert done["sources"] == [DRACULA]
    # the result is there afterwards, and the run's file is a trace like ask --trace writes
    body = client.get(f"/api/runs/{run_id}").json()
    assert body["status"] == "done" and body["result"]["prediction"] == "Bram Stoker"
    [trace] = read_trace(runs_dir / f"{run_id}.jsonl")
    assert [e["type"] for e in trace] == [
        e["type"] for e in events
    ] and trace[-1]["data"]["record"]["messages"]
    assert run_id in [r["id"] for r in client.get("/api/runs").json()["runs"]]


def test_reconnecting_resumes_after_the_last_event_seen(client):
    run_id = start(client, "slow: who wrote Dracula?")
    with client.stream("GET", f"/api/runs/{run_id}/events") as r:
        first = [d for n, d in read_sse(r, stop_after=3) if n == "trace"]
    assert len(first) == 3  # disconnected mid-run
    assert client.get(f"/api/runs/{run_id}").json()["status"] == "running"
    rest = events_of(client, run_id, after=first[-1]["i"])
    assert [e["i"] for e in first + rest] == list(range(len(first) + len(rest)))
    assert rest[-1]["type"] == "finished" and rest[-1]["view"]["prediction"] == "Bram Stoker"
    # ?after= does the same for clients that cannot send headers
    again = client.get(f"/api/runs/{run_id}/events?after={len(first) + len(rest) - 2}")
    assert again.text.count("event: trace") == 1


def test_stop_ends_a_run_as_interrupted(client):
    run_id = start(client, "slow: stop me")
    with client.stream("GET", f"/api/runs/{run_id}/events") as r:
        read_sse(r, stop_after=2)
    stopped = client.post(f"/api/runs/{run_id}/cancel", json={}).json()
    assert stopped["stopped"] is True
    events = events_of(client, run_id)
    assert events[-1]["view"]["termination"] == "interrupted"
    assert client.post(f"/api/runs/{run_id}/cancel", json={}).json()["stopped"] is False


def test_unknown_runs_and_bad_requests(client):
    assert client.get("/api/runs/nope").status_code == 404
    assert client.get("/api/runs/..%2F..%2Fetc").status_code == 404
    assert client.post("/api/runs", json={"question": "  "}).status_code == 400
    assert client.post("/api/runs", json={"question": "q", "max_steps": 0}).status_code == 400
    assert client.post("/api/runs", json={"question": "q", "max_steps": "3"}).status_code == 400
    assert client.post("/api/runs", json={"question": "q", "model": "other"}).status_code == 400
    assert client.post("/api/runs", json=["q"]).status_code == 400
    form = client.post("/api/runs", data={"question": "q"})
    assert form.status_code == 415  # a form (or another site's simple request) cannot start runs
    big = client.post("/api/runs", content=b"{" + b" " * (2 << 20) + b"}",
                      headers={"content-type": "application/json"})
    assert big.status_code == 413
    assert client.post("/api/runs", json={"question": "x" * 9000}).status_code == 413


def test_an_unknown_run_id_gets_a_plain_404_on_every_run_route(client):
    """Issue 44, item 8: a link to a run this server lacks, whatever its id holds (quotes, a
    right-to-left mark, markup, a "/", 3,000 characters), is a 404 whose error is one plain
    sentence (no Python quoting or escapes, an odd id never echoed), with a code the page
    reads; a known run asked for something it lacks is told so (405 for a wrong method)."""
    from drvenus.serve.app import RUN_NOT_FOUND

    odd = ["a'b\"c", "%E2%80%AEevil%3Cb%3E", "a%2Fb", "a/b/c", "%00", "x" * 3000]
    requests = [("GET", "/api/runs/nope" + tail) for tail in ("", "/events", "/report", "/trace")]
    requests += [("POST", "/api/runs/nope/cancel")]
    requests += [("GET", f"/api/runs/{run_id}") for run_id in odd]
    requests += [("GET", f"/api/runs/{odd[1]}/events"), ("POST", f"/api/runs/{odd[0]}/cancel")]
    for method, path in requests:
        r = client.request(method, path, json={} if method == "POST" else None)
        assert r.status_code == 404 and r.headers["content-type"] == "application/json", path
        body = r.json()
        assert body["code"] == RUN_NOT_FOUND and body["error"].startswith("no run "), path
        assert not re.search(r"['\"\\<>]|\\u|\\x", body["error"]), body
        assert len(body["error"]) < 120
        if path.startswith("/api/runs/nope"):
            assert body["error"].startswith("no run nope on this server")
        else:
            assert body["error"].startswith("no run with that id on this server")
    assert RUN_NOT_FOUND in client.get("/static/app.js").text  # what the page tells apart
    run_id = start(client, "direct: a known run")
    events_of(client, run_id)
    wrong = client.get(f"/api/runs/{run_id}/cancel")
    assert wrong.status_code == 405 and "GET is not allowed" in wrong.json()["error"]
    other = client.get(f"/api/runs/{run_id}/bogus")
    assert other.status_code == 404 and "code" not in other.json()
    assert client.get(f"/api/runs/{run_id}").status_code == 200  # the routes still answer


def test_concurrent_runs_are_bounded(runs_dir):
    app = create_app(make_registry(runs_dir, max_running=1, max_waiting=1), mcp=False)
    with ServeThread(app) as running, httpx.Client(base_url=running.url, timeout=30) as c:
        a, b = start(c, "slow: a"), start(c, "slow: b")
        full = c.post("/api/runs", json={"question": "slow: c"})
        assert full.status_code == 503 and full.headers["retry-after"]
        assert c.get(f"/api/runs/{b}").json()["status"] == "queued"
        assert events_of(c, a)[-1]["type"] == "finished"
        assert events_of(c, b)[-1]["view"]["answered"]


def test_replay_reads_traces_and_result_records(client, runs_dir):
    run_id = start(client, "direct question")
    events_of(client, run_id)
    trace_text = (runs_dir / f"{run_id}.jsonl").read_text()
    [run] = client.post("/api/replay", json={"text": trace_text * 2}).json()["runs"][:1]
    assert run["question"] == "direct question"
    assert run["events"][-1]["view"]["prediction"] == "42"
    # a results row (drvenus run / eval), rebuilt into events from its messages
    answered = start(client, "Who wrote Dracula?")
    events_of(client, answered)
    record = read_trace(runs_dir / f"{answered}.jsonl")[0][-1]["data"]["record"]
    row = {"id": "q1", **record}
    body = client.post("/api/replay", json={"text": json.dumps(row) + "\n"}).json()
    events = body["runs"][0]["events"]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "started" and kinds[-1] == "finished"
    assert [e["view"]["name"] for e in events if e["type"] == "tool_call"] == ["search", "visit"]
    results = [e for e in events if e["type"] == "tool_result"]
    assert results[0]["view"]["results"][0]["hits"][0]["url"] == DRACULA
    assert events[-1]["view"]["sources"] == [DRACULA]
    bad = client.post("/api/replay", json={"text": "not json"})
    assert bad.status_code == 422 and "cannot replay" in bad.json()["error"]


def test_a_replay_being_parsed_does_not_stall_the_server(client, server, monkeypatch):
    """A big replay file is parsed off the event loop: while it parses, the server answers."""
    import threading

    import drvenus.serve.app as app_module

    answered = threading.Event()
    real = app_module.load_saved

    def slow_parse(text: str):
        if not answered.wait(10):  # on the event loop, the request below could never finish
            raise ValueError("the server stalled while a replay was parsed")
        return real(text)

    monkeypatch.setattr(app_module, "load_saved", slow_parse)
    result: dict = {}

    def post() -> None:
        result["r"] = httpx.post(server.url + "/api/replay", json={"text": "not json"}, timeout=30)

    poster = threading.Thread(target=post)
    poster.start()
    time.sleep(0.2)  # the replay request is in
    assert client.get("/api/config").status_code == 200
    answered.set()
    poster.join(30)
    assert "cannot replay" in result["r"].json()["error"]  # parsed after, not "stalled"
    assert "stalled" not in result["r"].json()["error"]


def test_openai_client_non_stream_and_stream(server):
    openai = pytest.importorskip("openai")
    oa = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    assert "drvenus" in [m.id for m in oa.models.list().data]
    reply = oa.chat.completions.create(
        model="drvenus",
        messages=[{"role": "system", "content": "be brief"},
                  {"role": "user", "content": "Who wrote Dracula?"}],
    )
    message = reply.choices[0].message
    assert message.content.startswith("Bram Stoker")
    assert f"Sources:\n- [Dracula]({DRACULA})" in message.content  # by title, as a link
    assert "Searching: Dracula author" in message.model_extra["reasoning_content"]
    chunks = list(oa.chat.completions.create(
        model="drvenus", stream=True,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Who wrote Dracula?"}]}],
    ))
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or ""
                        for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Searching: Dracula author" in reasoning and "Read:" in reasoning
    assert content.startswith("Bram Stoker") and DRACULA in content
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.usage is None for c in chunks)  # not asked for
    counted = list(oa.chat.completions.create(
        model="drvenus", stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Who wrote Dracula?"}],
    ))
    assert counted[-1].choices == [] and counted[-1].usage is not None
    usage = counted[-1].usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert all(c.usage is None for c in counted[:-1])
    with pytest.raises(openai.BadRequestError):
        oa.chat.completions.create(model="drvenus", messages=[{"role": "system", "content": "x"}])


def test_openai_errors_are_openai_shaped(server):
    """Unknown models are 404 model_not_found; what one research run cannot give (n > 1,
    tools) is 400; every error under /v1 is OpenAI's error JSON, so the client raises its typed
    errors with the reason."""
    openai = pytest.importorskip("openai")
    oa = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    assert oa.models.retrieve("drvenus").id == "drvenus"
    assert oa.models.retrieve("drvenus:default").id == "drvenus:default"
    with pytest.raises(openai.NotFoundError) as missing:
        oa.models.retrieve("gpt-4o")
    assert missing.value.code == "model_not_found"
    question = [{"role": "user", "content": "Who wrote Dracula?"}]
    with pytest.raises(openai.NotFoundError) as unknown:
        oa.chat.completions.create(model="gpt-4o", messages=question)
    assert unknown.value.code == "model_not_found" and "gpt-4o" in unknown.value.message
    with pytest.raises(openai.BadRequestError) as many:
        oa.chat.completions.create(model="drvenus", messages=question, n=2)
    assert many.value.param == "n"
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError) as tools:
        oa.chat.completions.create(model="drvenus", messages=question, tools=[tool])
    assert tools.value.param == "tools" and "not supported" in tools.value.message
    with httpx.Client(base_url=server.url, timeout=30) as c:
        plain = c.post("/v1/chat/completions", content=b"{}", headers={"content-type": "text/plain"})
        nowhere = c.get("/v1/embeddings")
        big = c.post("/v1/chat/completions", content=b"{" + b" " * (2 << 20) + b"}",
                     headers={"content-type": "application/json"})
    for response, status in ((plain, 415), (nowhere, 404), (big, 413)):
        assert response.status_code == status
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    assert "JSON" in plain.json()["error"]["message"]


def test_mcp_over_http_with_the_sdk_client(server):
    """The connector contract (ChatGPT deep research / company knowledge): search -> structured
    results with the URL as id, fetch(id) -> the page; visit answers the agent's own text;
    deep_research without a progress token answers; the tools carry hints and schemas."""
    pytest.importorskip("mcp")
    from mcp import Client

    async def go():
        async with Client(server.url + "/mcp") as mcp_client:
            tools = {t.name: t for t in (await mcp_client.list_tools()).tools}
            found = await mcp_client.call_tool("search", {"query": "Dracula author"})
            page = await mcp_client.call_tool("fetch", {"id": DRACULA})
            read = await mcp_client.call_tool("visit", {"url": DRACULA, "goal": "author"})
            research = await mcp_client.call_tool("deep_research", {"question": "Who wrote it?"})
            return tools, found, page, read, research

    tools, found, page, read, research = asyncio.run(go())
    assert set(tools) == {"deep_research", "start_research", "research_status", "search",
                          "fetch", "visit"}
    for tool in tools.values():
        assert tool.description and "\n" not in tool.description and "  " not in tool.description
        assert tool.annotations is not None and tool.annotations.open_world_hint is not None
    for name in ("search", "fetch", "visit", "deep_research", "research_status"):
        assert tools[name].annotations.read_only_hint is True, name
    assert tools["research_status"].annotations.open_world_hint is False
    assert tools["search"].annotations.open_world_hint is True
    for name in ("search", "fetch", "start_research", "research_status"):
        assert tools[name].output_schema is not None, name
    assert set(tools["fetch"].output_schema["required"]) == {"id", "title", "text", "url"}
    [hit] = found.structured_content["results"]
    assert hit["id"] == hit["url"] == DRACULA and hit["title"] == "Dracula"
    assert json.loads(found.content[0].text) == found.structured_content
    fetched = page.structured_content
    assert fetched["id"] == fetched["url"] == DRACULA
    assert "1897 Gothic horror novel" in fetched["text"] and fetched["title"]
    assert set(fetched) == {"id", "title", "text", "url", "metadata"}
    assert "Bram Stoker wrote Dracula." in read.content[0].text
    assert research.content[0].text.startswith("Bram Stoker")
    assert DRACULA in research.content[0].text


def test_mcp_deep_research_without_a_progress_token_answers_in_time(runs_dir):
    """A client that sends no progress token (the Inspector CLI, desktop clients with a fixed
    60 s timeout) gets the run id and how to follow it when the run outlasts the quick-answer
    wait, and research_status then brings the answer."""
    pytest.importorskip("mcp")
    from mcp import Client

    app = create_app(make_registry(runs_dir), mcp_quick_answer_seconds=0.3)
    with ServeThread(app) as running:
        async def go():
            async with Client(running.url + "/mcp", read_timeout_seconds=10) as mcp_client:
                start = time.monotonic()
                first = await mcp_client.call_tool("deep_research",
                                                   {"question": "slow: who wrote Dracula?"})
                took = time.monotonic() - start
                text = first.content[0].text
                run_id = re.search(r'run_id "([^"]+)"', text).group(1)
                status = await mcp_client.call_tool(
                    "research_status", {"run_id": run_id, "wait_seconds": 10})
                quick = await mcp_client.call_tool("deep_research",
                                                   {"question": "direct question"})
                return took, first, status.structured_content, quick

        took, first, status, quick = asyncio.run(go())
    assert not first.is_error and took < 10
    assert "Still researching" in first.content[0].text
    assert "research_status" in first.content[0].text
    assert status["status"] == "done" and status["answer"].startswith("Bram Stoker")
    assert quick.content[0].text.startswith("42")  # over within the wait: the answer itself


def test_mcp_research_longer_than_the_client_timeout_completes(server):
    """A client whose requests time out after 1 s: deep_research reports progress as it goes,
    start_research + research_status (long polls shorter than the timeout) get the answer of a
    run that takes longer; errors are tool errors (isError), the server has a version."""
    pytest.importorskip("mcp")
    from mcp import Client

    from drvenus import __version__

    async def go():
        progress: list[str] = []

        values: list[float] = []

        async def on_progress(done, total, message):
            progress.append(message)
            values.append(done)

        async with Client(server.url + "/mcp", read_timeout_seconds=1.0) as mcp_client:
            info = mcp_client.server_info
            quick = await mcp_client.call_tool("deep_research", {"question": "Who wrote it?"},
                                               progress_callback=on_progress)
            started = await mcp_client.call_tool("start_research",
                                                 {"question": "slow: who wrote Dracula?"})
            run_id = started.structured_content["run_id"]
            polls = []
            for _ in range(20):
                status = await mcp_client.call_tool(
                    "research_status", {"run_id": run_id, "wait_seconds": 0.5})
                polls.append(status.structured_content)
                if polls[-1]["status"] == "done":
                    break
            empty = await mcp_client.call_tool("deep_research", {"question": "  "})
            unknown = await mcp_client.call_tool("research_status", {"run_id": "nope"})
            wrong = await mcp_client.call_tool("research_status", {"wait_seconds": "x"})
            return info, quick, progress, values, polls, empty, unknown, wrong

    info, quick, progress, values, polls, empty, unknown, wrong = asyncio.run(go())
    assert len(values) > 3 and values == sorted(set(values)), values
    assert wrong.is_error and wrong.content[0].text.startswith(
        "invalid arguments for research_status: run_id is required; wait_seconds: ")
    assert "pydantic" not in wrong.content[0].text
    assert quick.content[0].text.startswith("Bram Stoker")
    assert any(m and "Searching: Dracula author" in m for m in progress), progress
    assert len(polls) > 1 and polls[0]["status"] != "done"  # it outlasted one poll
    assert polls[-1]["status"] == "done" and polls[-1]["answer"].startswith("Bram Stoker")
    assert empty.is_error and "empty" in empty.content[0].text
    assert unknown.is_error and "no run nope on this server" in unknown.content[0].text
    assert info.version == __version__ and info.version


INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"


@pytest.mark.slow
def test_mcp_inspector_cli_gets_a_reply_to_deep_research(runs_dir, tmp_path):
    """The MCP Inspector CLI (npm, sends no progress token, 60 s request timeout) calls
    deep_research and gets a reply (the run id to follow) instead of timing out; its strict
    check finds the tool schemas portable."""
    import os
    import shutil
    import subprocess

    npx = shutil.which("npx")
    if npx is None:
        pytest.skip("no npx (Node.js) to run the MCP Inspector CLI")
    env = {**os.environ, "MCP_CATALOG_PATH": str(tmp_path / "catalog.json")}

    def inspector(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([npx, "--yes", INSPECTOR, "--cli", *args], capture_output=True,
                              text=True, timeout=timeout, cwd=tmp_path, env=env)

    try:
        version = inspector("--version", timeout=300)
    except subprocess.TimeoutExpired:
        pytest.skip(f"{INSPECTOR} could not be fetched in time")
    if version.returncode != 0:
        pytest.skip(f"{INSPECTOR} is not available: {version.stderr.strip()[-300:]}")
    app = create_app(make_registry(runs_dir), mcp_quick_answer_seconds=0.3)
    with ServeThread(app) as running:
        url = running.url + "/mcp"
        called = inspector(url, "--transport", "http", "--method", "tools/call",
                           "--tool-name", "deep_research",
                           "--tool-arg", "question=slow: who wrote Dracula?")
        listed = inspector(url, "--transport", "http", "--method", "tools/list", "--strict")
    assert called.returncode == 0, called.stderr
    reply = json.loads(called.stdout)
    assert reply["isError"] is False
    text = reply["content"][0]["text"]
    assert "research_status" in text and "run_id" in text
    assert listed.returncode == 0, listed.stderr
    assert {t["name"] for t in json.loads(listed.stdout)["tools"]} >= {"search", "fetch"}

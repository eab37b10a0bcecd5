"""The tool server (`drvenus tools serve`) and RemoteToolbox: real uvicorn servers on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from drvenus.agent import AgentConfig, ResearchAgent  # noqa: E402
from drvenus.net import RetryPolicy  # noqa: E402
from drvenus.net.server import ServerThread, check_bind, is_loopback  # noqa: E402
from drvenus.protocol import ToolCall, normalize_tool_call  # noqa: E402
from drvenus.tools.remote import RemoteToolbox  # noqa: E402
from drvenus.tools.server import create_app, serve  # noqa: E402
from drvenus.tools.toolbox import Toolbox, offline_toolbox  # noqa: E402
from scripted import ScriptedModel, answer, call  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "s3cret-token-for-tests-0123456789"
DRACULA = "https://en.wikipedia.org/wiki/Dracula"

CALLS = [
    ("search", {"query": ["Bram Stoker"]}),
    ("search", {"query": ["Dracula novel", "Jane Austen"]}),
    ("search", {"queries": "  Emma  ", "unknown": 1}),  # alias, a string, an ignored key
    ("visit", {"url": [DRACULA], "goal": "who wrote it"}),
    ("visit", {"url": DRACULA, "goal": ["the year"]}),
    ("visit", {"url": ["https://example.com/nowhere", DRACULA], "goal": "author"}),
]


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    rows = [
        {"id": "1", "title": "Dracula", "url": DRACULA,
         "text": "Dracula is an 1897 Gothic horror novel by the Irish author Bram Stoker. "
                 "It introduced the vampire Count Dracula."},
        {"id": "2", "title": "Emma (novel)", "url": "https://en.wikipedia.org/wiki/Emma_(novel)",
         "text": "Emma is a novel written by Jane Austen, first published in 1815."},
    ]
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("index-cache")


def make_toolbox(corpus: Path, cache_dir: Path) -> Toolbox:
    return offline_toolbox(corpus, cache_dir=cache_dir)


@pytest.fixture(scope="module")
def server(corpus, cache_dir):
    """A server with a token over the tiny corpus (its own toolbox)."""
    app = create_app(make_toolbox(corpus, cache_dir), token=TOKEN)
    with ServerThread(app) as running:
        yield running


@pytest.fixture(scope="module")
def open_server(corpus, cache_dir):
    """A server without a token (loopback) and without a response cache."""
    app = create_app(make_toolbox(corpus, cache_dir), cache_size=0)
    with ServerThread(app) as running:
        yield running


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def local_results(corpus: Path, cache_dir: Path) -> list[str]:
    toolbox = make_toolbox(corpus, cache_dir)

    async def go():
        return [
            await toolbox.call(normalize_tool_call({"name": n, "arguments": a})) for n, a in CALLS
        ]

    return run(go())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------ the routes


def test_routes_answer_exactly_what_the_toolbox_returns(server, corpus, cache_dir):
    expected = local_results(corpus, cache_dir)
    with httpx.Client(base_url=server.url, headers=auth()) as client:
        for _ in range(2):  # the second round comes from the response cache
            for (name, args), want in zip(CALLS, expected, strict=True):
                r = client.post(f"/{name}", json=args)
                assert r.status_code == 200, r.text
                assert r.headers["content-type"] == "application/json"
                assert r.json()["content"].encode() == want.encode()
    assert "Bram Stoker" in expected[0] and "could not be" in expected[5]


def test_bad_arguments_are_422_with_the_protocol_error(open_server):
    with httpx.Client(base_url=open_server.url) as client:
        r = client.post("/search", json={"q": "x"})
        assert r.status_code == 422
        assert r.json()["content"] == "ERROR: search needs 'query': a list of search queries"
        r = client.post("/visit", json={"url": [DRACULA]})
        assert r.status_code == 422 and r.json()["content"].startswith("ERROR: ")
        json_type = {"Content-Type": "application/json"}
        assert client.post("/search", content=b"{not json", headers=json_type).status_code == 400
        assert client.post("/search", json=["Dracula"]).status_code == 400


def test_health_needs_no_token_and_says_little(server):
    r = httpx.get(f"{server.url}/health")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "tools": ["search", "visit"]}


def test_every_other_route_needs_the_token(server):
    with httpx.Client(base_url=server.url) as client:
        for headers in ({}, auth("wrong"), {"Authorization": TOKEN}, auth(TOKEN + "x")):
            r = client.post("/search", json={"query": ["Dracula"]}, headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert client.get("/metrics", headers=headers).status_code == 401
            assert client.post("/visit", json={}, headers=headers).status_code == 401
            assert client.get("/docs", headers=headers).status_code == 401
        assert client.get("/docs", headers=auth()).status_code == 404  # no API pages at all


def test_metrics_count_routes_statuses_and_cache(server):
    with httpx.Client(base_url=server.url, headers=auth()) as client:
        for _ in range(3):
            client.post("/search", json={"query": ["metrics probe"]})
        client.post("/search", json={}, headers={})
        text = client.get("/metrics").text
    assert "# TYPE drvenus_tool_server_requests_total counter" in text
    line = next(x for x in text.splitlines() if x.startswith(
        'drvenus_tool_server_requests_total{route="/search",status="200"}'))
    assert int(line.split()[-1]) >= 3
    assert 'drvenus_tool_server_requests_total{route="/search",status="401"}' in text
    assert 'drvenus_tool_server_request_seconds_count{route="/search"}' in text
    assert 'drvenus_tool_cache_lookups_total{result="hit",tool="search"}' in text
    assert "drvenus_tool_requests_total" in text  # the toolbox's own Metrics too


def test_huge_bodies_are_413(open_server):
    big = {"query": ["x" * (1 << 20)]}
    with httpx.Client(base_url=open_server.url) as client:
        r = client.post("/search", json=big)
        assert r.status_code == 413
        # no Content-Length (chunked): cut off while reading
        chunks = (b'{"query": ["' + b"y" * 65536 for _ in range(20))
        json_type = {"Content-Type": "application/json"}
        assert client.post("/search", content=chunks, headers=json_type).status_code == 413
        assert client.post("/search", json={"query": ["Dracula"]}).status_code == 200


class SlowTool:
    name = "search"

    def __init__(self, delay: float = 0.3, explode: bool = False) -> None:
        self.delay, self.explode = delay, explode

    async def __call__(self, arguments) -> str:
        await asyncio.sleep(self.delay)
        if self.explode:
            raise RuntimeError("kaboom")
        return f"found {arguments['query'][0]}"


def test_full_queue_is_503_and_the_rest_wait():
    app = create_app(Toolbox([SlowTool()]), max_concurrency=1, max_queue=1, cache_size=0)

    async def burst(url: str) -> list[int]:
        async with httpx.AsyncClient(base_url=url) as client:
            rs = await asyncio.gather(
                *(client.post("/search", json={"query": [f"q{i}"]}) for i in range(4))
            )
        return sorted(r.status_code for r in rs)

    with ServerThread(app) as running:
        statuses = run(burst(running.url))
    assert statuses.count(200) == 2 and statuses.count(503) == 2


def test_a_call_whose_client_has_gone_is_cancelled_and_frees_its_slot():
    """A client that gives up: its tool call stops (not run to the end holding the only slot),
    and the next client is served at once; a call two clients share survives one leaving."""

    class Watched(SlowTool):
        def __init__(self) -> None:
            super().__init__(delay=30)
            self.cancelled: list[str] = []
            self.finished: list[str] = []

        async def __call__(self, arguments) -> str:
            query = arguments["query"][0]
            try:
                await asyncio.sleep(2 if query.startswith("shared") else self.delay)
            except asyncio.CancelledError:
                self.cancelled.append(query)
                raise
            self.finished.append(query)
            return f"found {query}"

    tool = Watched()
    app = create_app(Toolbox([tool]), max_concurrency=1, max_queue=4, cache_size=0)

    async def go(url: str) -> tuple[int, int]:
        async with httpx.AsyncClient(base_url=url) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.post("/search", json={"query": ["slow"]}, timeout=0.5)
            for _ in range(40):
                if tool.cancelled:
                    break
                await asyncio.sleep(0.1)
            leaving = asyncio.ensure_future(
                client.post("/search", json={"query": ["shared"]}, timeout=0.5))
            staying = client.post("/search", json={"query": ["shared"]}, timeout=30)
            stayed = await staying
            with pytest.raises(httpx.ReadTimeout):
                await leaving
            return stayed.status_code, len(tool.finished)

    with ServerThread(app) as running:
        status, finished = run(go(running.url))
    assert tool.cancelled == ["slow"]  # the abandoned call stopped
    assert status == 200 and finished == 1  # the shared one ran to the end for the other client


def test_tool_errors_are_never_500():
    class Raising:
        names = ("search",)

        async def call(self, tool_call: ToolCall) -> str:
            raise RuntimeError("the runner broke")

    for toolbox in (Toolbox([SlowTool(0, explode=True)]), Raising()):
        with ServerThread(create_app(toolbox)) as running:
            r = httpx.post(f"{running.url}/search", json={"query": ["x"]})
        assert r.status_code == 200
        assert r.json()["content"].startswith("ERROR: search failed: ")


# -------------------------------------------------------------------------- binding rules


def test_public_address_needs_a_token():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("") and not is_loopback("10.1.2.3")
    check_bind("127.0.0.1", None)
    check_bind("0.0.0.0", TOKEN)
    with pytest.raises(ValueError, match="without a token"):
        check_bind("0.0.0.0", None)
    with pytest.raises(ValueError, match="without a token"):
        serve(Toolbox([SlowTool()]), "0.0.0.0", free_port(), None)


def drvenus(*args: str, env: dict | None = None, **kwargs) -> subprocess.Popen:
    base = {k: v for k, v in os.environ.items() if k != "DRVENUS_TOOLS_TOKEN"}
    full_env = {**base, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "drvenus", *args], env=full_env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs,
    )


def test_cli_refuses_public_address_without_token():
    proc = drvenus("tools", "serve", "--host", "0.0.0.0")
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert len(stderr.strip().splitlines()) == 1
    assert "refusing to serve tools on 0.0.0.0 without a token" in stderr


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {proc.communicate()[1]}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.2)
    raise AssertionError("server did not come up")


def test_cli_server_end_to_end(corpus, tmp_path, monkeypatch):
    from drvenus.config import load_settings
    from drvenus.stack import build_toolbox

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {"DRVENUS_TOOLS_TOKEN": TOKEN, "DRVENUS_CACHE_DIR": str(tmp_path / "cache"),
           "DRVENUS_TOOLS_URL": url}  # ignored by the server itself: it serves its own tools
    proc = drvenus("tools", "serve", "--port", str(port), "--corpus", str(corpus), env=env)
    try:
        wait_healthy(url, proc)
        monkeypatch.delenv("DRVENUS_TOOLS_URL", raising=False)
        in_process = build_toolbox(load_settings(corpus=corpus))  # what `drvenus ask` runs

        async def local() -> list[str]:
            try:
                return [await in_process.call(normalize_tool_call({"name": n, "arguments": a}))
                        for n, a in CALLS]
            finally:
                await in_process.aclose()

        expected = run(local())

        async def remote_results(token: str | None) -> list[str]:
            tools = RemoteToolbox(url, token, retry=RetryPolicy(1))
            try:
                return [await tools.call(ToolCall(n, normalize_tool_call(
                    {"name": n, "arguments": a}).arguments)) for n, a in CALLS]
            finally:
                await tools.aclose()

        assert run(remote_results(TOKEN)) == expected
        refused = run(remote_results(None))
        assert all("401" in r and "no token given" in r for r in refused)
        metrics = httpx.get(f"{url}/metrics", headers=auth()).text
        assert 'provider="local",tool="search"' in metrics  # the tools report to the server's
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
    assert f"on http://127.0.0.1:{port}" in stderr and "token required" in stderr


def test_cli_port_taken_is_one_line_error(corpus, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {"DRVENUS_CACHE_DIR": str(tmp_path / "cache")}
        proc = drvenus("tools", "serve", "--port", str(port), "--corpus", str(corpus), env=env)
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert stderr.strip().splitlines()[-1].startswith("error:")
    assert "in use" in stderr


# ---------------------------------------------------------------------------- RemoteToolbox


def test_remote_toolbox_gives_the_in_process_results(server, corpus, cache_dir):
    expected = local_results(corpus, cache_dir)
    remote = RemoteToolbox(server.url, TOKEN)
    assert remote.names == ("search", "visit") and "visit" in remote and "x" not in remote

    async def go():
        try:
            got = [await remote.call(normalize_tool_call({"name": n, "arguments": a}))
                   for n, a in CALLS]
            got.append(await remote.call(ToolCall("browse", {})))
            return got
        finally:
            await remote.aclose()

    got = run(go())
    assert got[:-1] == expected
    assert got[-1] == run(Toolbox([]).call(ToolCall("browse", {})))


def test_remote_toolbox_server_down_is_tool_error_text():
    remote = RemoteToolbox(f"http://127.0.0.1:{free_port()}", retry=RetryPolicy(2, base=0.01))
    started = time.monotonic()
    body = run(remote.call(ToolCall("search", {"query": ["x"]})))
    assert time.monotonic() - started < 10
    assert body.startswith("ERROR: search failed: tool server http://127.0.0.1:")
    assert "unreachable" in body and "(after 2 attempts)" in body


def test_remote_toolbox_wrong_token_says_so(server):
    remote = RemoteToolbox(server.url, "not-the-token")
    body = run(remote.call(ToolCall("search", {"query": ["x"]})))
    assert "refused the request (401, wrong token)" in body and "DRVENUS_TOOLS_TOKEN" in body


def test_remote_toolbox_retries_busy_server():
    answers = iter([
        httpx.Response(503, json={"error": "the tool server is busy"}, headers={"Retry-After": "0"}),
        httpx.Response(200, json={"content": "done"}),
    ])
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization", ""))
        return next(answers)

    remote = RemoteToolbox("http://tools.test", "tok", retry=RetryPolicy(3, base=0.01),
                           transport=httpx.MockTransport(handler))
    assert run(remote.call(ToolCall("search", {"query": ["x"]}))) == "done"
    assert seen == ["Bearer tok", "Bearer tok"]


def test_remote_toolbox_rejects_bad_urls():
    for url in ("localhost:8765", "ftp://x", ""):
        with pytest.raises(ValueError, match="http"):
            RemoteToolbox(url)


def test_agent_through_the_server_matches_in_process(server, corpus, cache_dir):
    script = [
        call("search", query=["Bram Stoker novel"]),
        call("visit", url=[DRACULA], goal="the author"),
        answer("Bram Stoker"),
    ]

    async def messages(tools) -> list[dict]:
        agent = ResearchAgent(ScriptedModel(script), tools, AgentConfig(max_steps=5))
        try:
            record = await agent.run("Who wrote Dracula?")
        finally:
            await tools.aclose()
        assert record.termination == "answered"
        return record.messages

    local = run(messages(make_toolbox(corpus, cache_dir)))
    remote = run(messages(RemoteToolbox(server.url, TOKEN)))
    assert remote == local
    assert "Bram Stoker" in local[3]["content"] and "Evidence in page" in local[5]["content"]


def test_remote_toolbox_from_settings(monkeypatch):
    from drvenus.config import load_settings

    monkeypatch.setenv("DRVENUS_TOOLS_URL", "http://127.0.0.1:8765/")
    monkeypatch.setenv("DRVENUS_TOOLS_TOKEN", TOKEN)
    settings = load_settings()
    assert settings.tools_token_value() == TOKEN and TOKEN not in repr(settings)
    remote = RemoteToolbox.from_settings(settings)
    assert remote.base_url == "http://127.0.0.1:8765" and TOKEN not in repr(remote)
    monkeypatch.delenv("DRVENUS_TOOLS_URL")
    with pytest.raises(ValueError, match="DRVENUS_TOOLS_URL"):
        RemoteToolbox.from_settings(load_settings())


def test_a_run_whose_every_tool_call_found_the_server_unusable_is_a_failed_run(server, tmp_path):
    """The server refusing the token (401) or gone (connection refused) mid-batch: the item is
    a ``tool_error`` (a failed run the rerun retries), not an answered, scored item; one call
    that worked keeps the run an outcome."""
    from drvenus.batch import read_results, run_batch
    from drvenus.questions import Question
    from drvenus.tools.remote import ToolServerUnusable

    script = [call("search", query=["Bram Stoker novel"]), answer("Bram Stoker")]

    async def one(tools) -> object:
        agent = ResearchAgent(ScriptedModel(script), tools, AgentConfig(max_steps=5))
        try:
            return await agent.run("Who wrote Dracula?")
        finally:
            await tools.aclose()

    for tools in (RemoteToolbox(server.url, "wrong-token-0123456789", retry=RetryPolicy(1)),
                  RemoteToolbox("http://127.0.0.1:9", TOKEN, retry=RetryPolicy(1))):
        record = run(one(tools))
        assert record.termination == "tool_error" and record.failed, record.termination
        assert "tool server" in record.error and record.prediction == "Bram Stoker"
    assert run(one(RemoteToolbox(server.url, TOKEN))).termination == "answered"
    with pytest.raises(ToolServerUnusable, match="401, the token is wrong"):
        RemoteToolbox(server.url, "wrong-token-0123456789").check()
    RemoteToolbox(server.url, TOKEN).check()

    out = tmp_path / "results.jsonl"
    items = [Question(id="1", question="Who wrote Dracula?")]
    bad = RemoteToolbox(server.url, "wrong-token-0123456789", retry=RetryPolicy(1))
    agent = ResearchAgent(ScriptedModel(script), bad, AgentConfig(max_steps=5))
    summary = run(run_batch(agent, items, out, workers=1))
    assert summary.failed == 1 and not read_results(out).is_done("1")  # a rerun retries it
    good = ResearchAgent(ScriptedModel(script), RemoteToolbox(server.url, TOKEN),
                         AgentConfig(max_steps=5))
    assert run(run_batch(good, items, out, workers=1)).terminations["answered"] == 1
    assert read_results(out).is_done("1")


def test_cli_bounds_the_queue(monkeypatch, corpus, tmp_path):
    from typer.testing import CliRunner

    import drvenus.tools.server as server_module
    from drvenus.cli import app

    seen = {}
    monkeypatch.setattr(server_module, "serve", lambda *a, **kw: seen.update(kw))
    monkeypatch.setenv("DRVENUS_CACHE_DIR", str(tmp_path))
    result = CliRunner().invoke(app, ["tools", "serve", "--corpus", str(corpus),
                                      "--max-queue", "3", "--max-concurrency", "2"])
    assert result.exit_code == 0, result.output
    assert seen["max_queue"] == 3 and seen["max_concurrency"] == 2


@pytest.mark.slow
def test_ctrl_c_with_a_full_queue_ends_quietly(tmp_path):
    """200 calls queued behind 4 slow ones, then Ctrl-C twice: the server ends, answering the
    waiting calls 503 (shutting down), without a traceback per request."""
    import signal

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "slow_tool_server.py"),
                             str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    assert proc.stdout.readline().startswith("ready")

    async def burst() -> list:
        limits = httpx.Limits(max_connections=300)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            calls = [asyncio.ensure_future(client.post(f"http://127.0.0.1:{port}/search",
                                                       json={"query": [f"q{i}"]}))
                     for i in range(200)]
            await asyncio.sleep(2)
            proc.send_signal(signal.SIGINT)
            await asyncio.sleep(1)
            proc.send_signal(signal.SIGINT)
            return await asyncio.gather(*calls, return_exceptions=True)

    answers = run(burst())
    _, stderr = proc.communicate(timeout=60)
    assert len(stderr.splitlines()) < 20, stderr[-3000:]
    assert "Traceback" not in stderr
    statuses = [a.status_code for a in answers if isinstance(a, httpx.Response)]
    assert statuses and set(statuses) <= {503}


def test_a_tool_server_killed_mid_run_ends_the_run_at_once(corpus, cache_dir):
    """The circuit breaker: a real tool server on 127.0.0.1 answers the first call and is then
    stopped; after DEFAULT_MAX_UNUSABLE_TOOL_CALLS unreachable calls in a row the run ends as
    ``tool_error`` instead of spending its whole step budget (30 steps here) on them."""
    from drvenus.agent.loop import DEFAULT_MAX_UNUSABLE_TOOL_CALLS

    running = ServerThread(create_app(make_toolbox(corpus, cache_dir))).start()

    def searches(messages) -> str:
        turn = sum(1 for m in messages if m["role"] == "assistant")
        if turn == 1:  # the first call was answered: now the server dies
            running.stop()
        return call("search", query=[f"Dracula question {turn}"])

    model = ScriptedModel([searches])
    tools = RemoteToolbox(running.url, retry=RetryPolicy(2, base=0.0))
    agent = ResearchAgent(model, tools, AgentConfig(max_steps=30, max_attempts=1))

    async def go():
        try:
            return await agent.run("Who wrote Dracula?")
        finally:
            await tools.aclose()

    record = run(go())
    assert record.termination == "tool_error" and record.failed
    assert record.tool_call_count == 1 + DEFAULT_MAX_UNUSABLE_TOOL_CALLS, record.tool_call_count
    assert len(model.calls) == 1 + DEFAULT_MAX_UNUSABLE_TOOL_CALLS  # no forced answer either
    assert "Bram Stoker" in record.messages[3]["content"]  # the call before it died worked
    assert f"{DEFAULT_MAX_UNUSABLE_TOOL_CALLS} tool calls in a row" in record.error
    assert "unreachable" in record.error

    # a call that works in between resets the count: a flaky server is not a dead one
    flaky = iter([True, False, False, True, False, False, True])

    class Flaky:
        names = ("search", "visit")

        async def call(self, tool_call):
            from drvenus.tools.base import UnusableToolText

            return "[]" if next(flaky) else UnusableToolText("ERROR: unreachable")

    script = [call("search", query=[f"q{i}"]) for i in range(7)] + [answer("done")]
    record = run(ResearchAgent(ScriptedModel(script), Flaky(), AgentConfig(max_steps=30))
                 .run("q"))
    assert record.termination == "answered" and record.tool_call_count == 7

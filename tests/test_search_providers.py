"""Online search providers (Serper, SearXNG) against a real local HTTP server, the provider
chain with fallback, the cache, limits, retries and metrics of the ``search`` tool."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest

from drvenus.corpus import Hit
from drvenus.net.retry import RetryPolicy
from drvenus.protocol import MISSING_ARGUMENT, SEARCH, parse_search_body, tool_error_message
from drvenus.tools.cache import ToolCache
from drvenus.tools.limits import Limits
from drvenus.tools.metrics import Metrics
from drvenus.tools.search import (
    FAILED_TITLE,
    IndexSearch,
    LocalSearch,
    Search,
    SearchProvider,
)
from drvenus.tools.web_search import (
    SearxngSearch,
    SerperSearch,
    has_cjk,
    make_search_providers,
    parse_retry_after,
)
from helpers.search import KEY, Canned, FakeSearchServer

FAST = RetryPolicy(attempts=3, base=0.01, cap=0.05)
TWO = RetryPolicy(attempts=2, base=0.01, cap=0.05)
US = {"location": "United States", "gl": "us", "hl": "en"}
CN = {"location": "China", "gl": "cn", "hl": "zh-cn"}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture
def serper() -> Iterator[FakeSearchServer]:
    with FakeSearchServer("serper") as server:
        yield server


@pytest.fixture
def searxng() -> Iterator[FakeSearchServer]:
    with FakeSearchServer("searxng") as server:
        yield server


class FakeIndex:
    """A tiny in-memory stand-in for CorpusIndex."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def search(self, query: str, k: int = 10) -> list[Hit]:
        self.calls.append(query)
        hit = Hit("doc", f"Local {query}", "https://local.example/doc", "local snippet", 1.0)
        return [hit][:k]


def serper_at(server: FakeSearchServer, **kwargs: Any) -> SerperSearch:
    kwargs.setdefault("retry", FAST)
    kwargs.setdefault("timeout", 2.0)
    return SerperSearch(kwargs.pop("api_key", KEY), base_url=server.url, **kwargs)


def searxng_at(server: FakeSearchServer, **kwargs: Any) -> SearxngSearch:
    kwargs.setdefault("retry", FAST)
    kwargs.setdefault("timeout", 2.0)
    return SearxngSearch(server.url, **kwargs)


async def call(tool: Search, queries: Any) -> list[dict[str, Any]]:
    """Run the tool once, close it, and decode its body."""
    try:
        body = await tool({"query": queries})
    finally:
        await tool.aclose()
    data = parse_search_body(body)
    assert data is not None, body
    return data


def hits(entry: dict[str, Any]) -> list[dict[str, Any]]:
    return entry["web_page_info_list"]


# --- Serper -------------------------------------------------------------------------------------


def test_serper_top10_in_order_and_request(serper: FakeSearchServer) -> None:
    [entry] = run(call(Search([serper_at(serper)]), ["eiffel tower height"]))
    results = hits(entry)
    assert entry["query"] == "eiffel tower height"
    assert [r["title"] for r in results] == [
        f"eiffel tower height - result {i}" for i in range(1, 11)
    ]
    assert results[0] == {
        "title": "eiffel tower height - result 1",
        "url": "https://example.com/1?q=eiffel tower height",
        "snippet": "Snippet 1 about eiffel tower height.",
        "date": "Mar 3, 2024",
    }
    assert set(results[1]) == {"title", "url", "snippet"}
    [req] = serper.requests
    assert (req.method, req.path) == ("POST", "/search")
    assert req.json == {"q": "eiffel tower height", **US}
    assert req.headers["X-API-KEY"] == KEY


def test_serper_locale_follows_cjk_rule(serper: FakeSearchServer) -> None:
    queries = ["埃菲尔铁塔 高度", "Eiffel 塔", "エッフェル", "plain english"]
    run(call(Search([serper_at(serper)]), queries))
    bodies = {r.json["q"]: r.json for r in serper.requests}
    assert bodies["埃菲尔铁塔 高度"] == {"q": "埃菲尔铁塔 高度", **CN}
    assert bodies["Eiffel 塔"] == {"q": "Eiffel 塔", **CN}
    assert bodies["エッフェル"] == {"q": "エッフェル", **US}  # kana only: not U+4E00..U+9FFF
    assert bodies["plain english"] == {"q": "plain english", **US}
    assert has_cjk("\u4e00") and has_cjk("\u9fff") and not has_cjk("\u9fff\u3000"[1:])


def test_several_queries_one_request_each_in_order(serper: FakeSearchServer) -> None:
    # The first answer is the slowest: the entries still follow the queries' order.
    serper.queue(Canned(delay=0.2))
    queries = ["alpha", "beta", "gamma"]
    data = run(call(Search([serper_at(serper)]), queries))
    assert [e["query"] for e in data] == queries
    assert [hits(e)[0]["title"] for e in data] == [f"{q} - result 1" for q in queries]
    assert sorted(r.query for r in serper.requests) == queries
    assert serper.max_in_flight >= 2  # the queries ran concurrently


def test_no_results_is_an_empty_entry_without_fallback(
    serper: FakeSearchServer, searxng: FakeSearchServer
) -> None:
    metrics = Metrics()
    tool = Search([serper_at(serper), searxng_at(searxng)], metrics=metrics)
    data = run(call(tool, ["nothing matches this", "something"]))
    assert data[0] == {"query": "nothing matches this", "web_page_info_list": []}
    assert len(hits(data[1])) == 10
    assert searxng.requests == []
    assert metrics.count(SEARCH, "serper", "empty") == 1
    assert metrics.count(SEARCH, "serper", "ok") == 1


def test_http_error_gives_a_note_entry(serper: FakeSearchServer) -> None:
    serper.always = Canned(status=500)
    data = run(call(Search([serper_at(serper, retry=TWO)]), ["broken", "also broken"]))
    assert [e["query"] for e in data] == ["broken", "also broken"]
    [note] = hits(data[0])
    assert note["title"] == FAILED_TITLE and note["url"] == ""
    assert "'broken'" in note["snippet"] and "HTTP 500" in note["snippet"]
    assert "Try again later" in note["snippet"]
    assert len(serper.requests) == 4  # two attempts per query


def test_429_with_retry_after_is_retried(serper: FakeSearchServer) -> None:
    serper.queue(Canned(status=429, headers={"Retry-After": "0.3"}))
    start = time.monotonic()
    [entry] = run(call(Search([serper_at(serper, retry=RetryPolicy(3, 0.01, 2.0))]), ["q"]))
    assert time.monotonic() - start >= 0.25  # waited as the server asked
    assert len(hits(entry)) == 10
    assert len(serper.requests) == 2


def test_401_is_not_retried_and_key_not_shown(serper: FakeSearchServer) -> None:
    wrong = "sk-wrong-key-987"
    [entry] = run(call(Search([serper_at(serper, api_key=wrong)]), ["q"]))
    [note] = hits(entry)
    assert "HTTP 401" in note["snippet"] and "check the API key" in note["snippet"]
    assert wrong not in json.dumps(entry)
    assert len(serper.requests) == 1


def test_invalid_json_is_an_error_not_retried(serper: FakeSearchServer) -> None:
    serper.always = Canned(body="<html>oops</html>")
    [entry] = run(call(Search([serper_at(serper)]), ["q"]))
    assert "not JSON" in hits(entry)[0]["snippet"]
    assert len(serper.requests) == 1


def test_connection_refused_is_retried_then_noted() -> None:
    with FakeSearchServer("serper") as gone:
        url = gone.url
    provider = SerperSearch(KEY, base_url=url, retry=TWO, timeout=1.0)
    [entry] = run(call(Search([provider]), ["q"]))
    assert "connection failed" in hits(entry)[0]["snippet"]
    assert "after 2 attempts" in hits(entry)[0]["snippet"]


def test_timeout_every_request(serper: FakeSearchServer) -> None:
    serper.delay = 60.0  # never in time: without the timeout this would take two minutes
    metrics = Metrics()
    tool = Search([serper_at(serper, retry=TWO, timeout=0.1)], metrics=metrics)
    start = time.monotonic()
    [entry] = run(call(tool, ["slow"]))
    assert time.monotonic() - start < 10  # 2 x 0.1 s expected; loose for a busy machine
    assert "timed out after 0.1s" in hits(entry)[0]["snippet"]
    assert len(serper.requests) == 2
    assert metrics.count(SEARCH, "serper", "timeout") == 1


# --- SearXNG ------------------------------------------------------------------------------------


def test_searxng_request_and_mapping(searxng: FakeSearchServer) -> None:
    data = run(call(Search([searxng_at(searxng)], top_k=5), ["rivers", "长江"]))
    results = hits(data[0])
    assert [r["title"] for r in results] == [f"rivers ({i})" for i in range(1, 6)]
    assert results[0] == {
        "title": "rivers (1)",
        "url": "https://searx.example/1",
        "snippet": "Content 1 for rivers.",
        "date": "2024-03-03T00:00:00",
    }
    assert "date" not in results[1]
    params = {r.params["q"]: r.params for r in searxng.requests}
    assert params["rivers"] == {"q": "rivers", "format": "json"}
    assert params["长江"] == {"q": "长江", "format": "json", "language": "zh-CN"}
    assert {r.method for r in searxng.requests} == {"GET"}


def test_searxng_no_results(searxng: FakeSearchServer) -> None:
    [entry] = run(call(Search([searxng_at(searxng)]), "nothing at all"))
    assert entry == {"query": "nothing at all", "web_page_info_list": []}


# --- the provider chain ---------------------------------------------------------------------------


def test_fallback_serper_then_searxng_then_local(
    serper: FakeSearchServer, searxng: FakeSearchServer
) -> None:
    serper.always = Canned(status=503)
    searxng.queue(Canned(status=502), Canned(status=502))  # the first query's two attempts
    index = FakeIndex()
    metrics = Metrics()
    providers = [serper_at(serper, retry=TWO), searxng_at(searxng, retry=TWO), IndexSearch(index)]
    tool = Search(providers, metrics=metrics, top_k=3)
    first = run(call(tool, ["one"]))
    tool = Search(providers, metrics=metrics, top_k=3)
    second = run(call(tool, ["two"]))
    assert hits(first[0]) == [
        {"title": "Local one", "url": "https://local.example/doc", "snippet": "local snippet"}
    ]
    assert [r["title"] for r in hits(second[0])] == ["two (1)", "two (2)", "two (3)"]
    assert index.calls == ["one"]
    assert metrics.count(SEARCH, "serper", "error") == 2
    assert metrics.count(SEARCH, "searxng", "error") == 1
    assert metrics.count(SEARCH, "searxng", "ok") == 1
    assert metrics.count(SEARCH, "local", "ok") == 1


def test_all_providers_fail_note_names_each(
    serper: FakeSearchServer, searxng: FakeSearchServer
) -> None:
    serper.always = Canned(status=400)
    searxng.always = Canned(status=500)
    tool = Search([serper_at(serper), searxng_at(searxng, retry=TWO)])
    [entry] = run(call(tool, ["q"]))
    snippet = hits(entry)[0]["snippet"]
    assert "serper: HTTP 400" in snippet and "searxng: HTTP 500" in snippet
    assert len(serper.requests) == 1 and len(searxng.requests) == 2


def test_provider_crash_falls_back() -> None:
    class Crashing:
        name = "crashy"

        async def search(self, query: str, k: int) -> list[dict[str, Any]]:
            raise KeyError("bug")

        async def aclose(self) -> None:
            return None

    crashing: SearchProvider = Crashing()
    data = run(call(Search([crashing, IndexSearch(FakeIndex())]), ["q"]))
    assert hits(data[0])[0]["title"] == "Local q"


def test_missing_query_and_lone_string() -> None:
    tool = Search([IndexSearch(FakeIndex())])
    assert run(tool({})) == tool_error_message(SEARCH, MISSING_ARGUMENT[SEARCH])
    assert run(tool({"query": []})) == tool_error_message(SEARCH, MISSING_ARGUMENT[SEARCH])
    data = parse_search_body(run(tool({"query": "lone"})))
    assert data is not None and data[0]["query"] == "lone"
    local = LocalSearch(FakeIndex(), top_k=1)
    assert local.index is not None and local.top_k == 1


# --- cache ----------------------------------------------------------------------------------------


def test_cache_hit_across_cache_instances(serper: FakeSearchServer, tmp_path: Path) -> None:
    path = tmp_path / "tools.sqlite"
    metrics = Metrics()
    first = run(
        call(Search([serper_at(serper)], cache=ToolCache(path), metrics=metrics), ["Eiffel"])
    )
    again = Search([serper_at(serper)], cache=ToolCache(path), metrics=metrics)
    second = run(call(again, ["  eiffel  "]))  # normalised to the same key
    assert len(serper.requests) == 1
    assert hits(second[0]) == hits(first[0])
    assert second[0]["query"] == "  eiffel  "
    assert metrics.count(SEARCH, "serper") == 1
    assert metrics.render().count('result="hit"') == 1
    assert 'drvenus_tool_cache_lookups_total{result="hit",tool="search"} 1' in metrics.render()
    assert 'drvenus_tool_cache_lookups_total{result="miss",tool="search"} 1' in metrics.render()


def test_cache_key_includes_k(serper: FakeSearchServer, tmp_path: Path) -> None:
    cache = ToolCache(tmp_path / "c.sqlite")
    run(call(Search([serper_at(serper)], top_k=10, cache=cache), ["x"]))
    [entry] = run(call(Search([serper_at(serper)], top_k=3, cache=cache), ["x"]))
    assert len(serper.requests) == 2 and len(hits(entry)) == 3
    assert cache.get("search:serper", "x|k=10") is not None


def test_cache_ttl_expiry(serper: FakeSearchServer, tmp_path: Path) -> None:
    cache = ToolCache(tmp_path / "c.sqlite")
    run(call(Search([serper_at(serper)], cache=cache, cache_ttl=60), ["x"]))
    run(call(Search([serper_at(serper)], cache=cache, cache_ttl=60), ["x"]))
    assert len(serper.requests) == 1
    time.sleep(0.06)
    run(call(Search([serper_at(serper)], cache=cache, cache_ttl=0.05), ["x"]))
    assert len(serper.requests) == 2


def test_failures_are_not_cached_empty_answers_are(
    serper: FakeSearchServer, tmp_path: Path
) -> None:
    cache = ToolCache(tmp_path / "c.sqlite")
    serper.queue(Canned(status=500), Canned(status=500))
    [failed] = run(call(Search([serper_at(serper, retry=TWO)], cache=cache), ["x"]))
    assert hits(failed)[0]["title"] == FAILED_TITLE
    [ok] = run(call(Search([serper_at(serper)], cache=cache), ["x"]))
    assert len(hits(ok)) == 10 and len(serper.requests) == 3
    run(call(Search([serper_at(serper)], cache=cache), ["nothing here"]))
    run(call(Search([serper_at(serper)], cache=cache), ["nothing here"]))
    assert len(serper.requests) == 4
    assert cache.get("search:serper", "nothing here|k=10") == "[]"


def test_local_provider_is_not_cached(tmp_path: Path) -> None:
    cache = ToolCache(tmp_path / "c.sqlite")
    index = FakeIndex()
    for _ in range(2):
        run(call(Search([IndexSearch(index)], cache=cache), ["x"]))
    assert index.calls == ["x", "x"]
    assert cache._db.execute("SELECT COUNT(*) FROM entries").fetchone()[0] == 0  # nothing stored


# --- limits, metrics, secrets -----------------------------------------------------------------------


def test_rate_limit_spaces_requests(serper: FakeSearchServer) -> None:
    provider = serper_at(serper, limits=Limits(concurrency=8, rate=20.0))
    start = time.monotonic()
    run(call(Search([provider]), ["a", "b", "c", "d"]))
    elapsed = time.monotonic() - start
    assert len(serper.requests) == 4
    assert elapsed >= 0.1  # 4 requests at 20/s: three gaps of ~0.05s
    times = sorted(r.time for r in serper.requests)
    assert times[-1] - times[0] >= 0.1


def test_concurrency_limit(serper: FakeSearchServer) -> None:
    serper.delay = 0.05
    provider = serper_at(serper, limits=Limits(concurrency=1))
    run(call(Search([provider]), ["a", "b", "c"]))
    assert serper.max_in_flight == 1 and len(serper.requests) == 3


def test_metrics_render_latency(serper: FakeSearchServer) -> None:
    metrics = Metrics()
    run(call(Search([serper_at(serper)], metrics=metrics), ["a", "b"]))
    text = metrics.render()
    assert 'outcome="ok",provider="serper",tool="search"} 2' in text
    assert 'drvenus_tool_request_seconds_count{provider="serper",tool="search"} 2' in text


def test_key_never_in_logs_errors_or_repr(
    serper: FakeSearchServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    serper.queue(Canned(status=500), Canned(status=429, headers={"Retry-After": "0"}))
    serper.queue(*[Canned(status=503)] * 3)
    provider = serper_at(serper)
    tool = Search([provider])
    data = run(call(tool, ["a", "b"]))
    assert len(serper.requests) >= 5  # failures, retries, successes (order varies)
    assert KEY not in caplog.text and "SECRET" not in caplog.text
    assert KEY not in json.dumps(data)
    assert KEY not in repr(provider) and KEY not in repr(tool) and KEY not in str(vars(tool))
    assert "serper" in caplog.text  # the failures were logged, without the key


# --- small parts ----------------------------------------------------------------------------------


def test_parse_retry_after() -> None:
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after("0.5") == 0.5
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    later = parse_retry_after(formatdate(time.time() + 30, usegmt=True))
    assert later is not None and 25 <= later <= 31


def test_make_search_providers() -> None:
    index = FakeIndex()
    providers = make_search_providers(
        ["serper", "SearXNG", "local"],
        serper_api_key=KEY,
        searxng_url="http://127.0.0.1:1/",
        index=index,
        limits={"serper": Limits(concurrency=2, rate=5.0)},
        retry=TWO,
        timeout=3.0,
    )
    serper, searx, local = providers
    assert isinstance(serper, SerperSearch) and isinstance(searx, SearxngSearch)
    assert isinstance(local, IndexSearch)
    assert serper.limits == Limits(concurrency=2, rate=5.0) and searx.limits == Limits()
    assert serper.retry is TWO and searx.timeout == 3.0
    assert searx.base_url == "http://127.0.0.1:1"
    for names, kwargs in [
        (["serper"], {}),
        (["searxng"], {}),
        (["local"], {}),
        (["bing"], {}),
        (["local", "local"], {"index": index}),
    ]:
        with pytest.raises(ValueError):
            make_search_providers(names, **kwargs)
    with pytest.raises(ValueError):
        SerperSearch("")


def test_aclose_closes_the_client(serper: FakeSearchServer) -> None:
    provider = serper_at(serper)

    async def go() -> None:
        await provider.search("x", 10)
        client = provider._clients.current
        assert client is not None
        await provider.aclose()
        assert client.is_closed and provider._clients.current is None
        await provider.aclose()  # twice is fine

    run(go())

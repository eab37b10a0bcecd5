"""The visit tool on the (local, real) web: readers in turn, the cache, metrics, the time budget,
the page budget, and the LLM extractor's shorten-and-retry and JSON-repair paths."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from drvenus.llm.openai_compat import OpenAICompatModel
from drvenus.net.retry import RetryPolicy
from drvenus.protocol import (
    DRVENUS_TEXTS,
    is_visit_failure,
    join_visits,
    parse_visit_body,
    render_visit_failure,
)
from drvenus.tools.cache import ToolCache, normalize_url
from drvenus.tools.extract import Extraction, ExtractiveExtractor, LLMExtractor
from drvenus.tools.metrics import Metrics
from drvenus.tools.pages import FetchReader, JinaReader, PageReader
from drvenus.tools.tokens import (
    ByteEstimate,
    EncodingCounter,
    ScriptEstimate,
    default_counter,
    truncate_to_tokens,
)
from drvenus.tools.visit import Visit
from stub_server import StubServer
from web_site import WebSite

FAST = RetryPolicy(attempts=2, base=0.0)
GOAL = "Who built the lighthouse and when?"
GOOD = {
    "rational": "The page names the builder.",
    "evidence": "The Rivermouth lighthouse was built in 1871 by the engineer Thomas Hale.",
    "summary": "Thomas Hale built it in 1871.",
}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def site() -> Iterator[WebSite]:
    with WebSite(jina_key="k-123") as running:
        yield running


def fetch_reader(**options: Any) -> FetchReader:
    options.setdefault("allow_private", True)
    return FetchReader(retry=FAST, **options)


async def visit(tool: Visit, urls: Sequence[str], goal: str = GOAL) -> str:
    try:
        return await tool({"url": list(urls), "goal": goal})
    finally:
        await tool.aclose()


class Recorder:
    """An extractor that records the page text it is given."""

    def __init__(self) -> None:
        self.pages: list[str] = []

    async def extract(self, page_text: str, goal: str, url: str) -> Extraction | None:
        self.pages.append(page_text)
        return Extraction(evidence=page_text[:80], summary="seen")


# --- the tool ----------------------------------------------------------------------------------


def test_a_page_cached_by_a_permissive_process_is_not_served_under_a_strict_policy(
    site: WebSite, tmp_path: Path
) -> None:
    """`tools serve --allow-private-urls` reads an intranet page into the shared cache; a
    process whose policy refuses private addresses (`drvenus mcp`, `ask`) must not get it from
    the cache: the policy is part of the key, and the URL is checked again before a cached page
    is served (here an entry stored under the strict policy's own key, as an older drvenus or
    another writer could have left it)."""
    cache = ToolCache(tmp_path / "tools.sqlite")
    url = site.url + "/notes.txt"
    permissive = Visit([fetch_reader()], Recorder(), cache=cache)
    assert "Plain notes" in run(visit(permissive, [url]))
    hits = site.hits["/notes.txt"]

    strict_reader = FetchReader(retry=FAST)
    strict = Visit([strict_reader], Recorder(), cache=cache)
    frames = parse_visit_body(run(visit(strict, [url])))
    assert frames is not None and is_visit_failure(frames[0]["summary"])
    assert "Plain notes" not in str(frames) and site.hits["/notes.txt"] == hits
    assert "loopback address" in (frames[0]["evidence"] or "")
    assert "--allow-private-urls" in (frames[0]["evidence"] or "")

    planted = json.dumps({"title": "", "text": "Plain notes: the intranet secret"})
    cache.put(Visit.cache_namespace(strict_reader), normalize_url(url), planted)
    body = run(visit(Visit([FetchReader(retry=FAST)], Recorder(), cache=cache), [url]))
    assert "secret" not in body and "loopback address" in body
    cache.close()


def test_a_cached_page_is_checked_against_what_its_host_resolves_to_now(tmp_path: Path) -> None:
    cache = ToolCache(tmp_path / "tools.sqlite")
    url = "http://intranet.example/wiki"
    answers = {"intranet.example": ["10.0.0.7"]}

    async def resolver(host: str, port: int) -> list[str]:
        if host not in answers:
            raise OSError("no DNS here")
        return answers[host]

    reader = FetchReader(retry=FAST, resolver=resolver)
    page = json.dumps({"title": "", "text": "Plain notes: cached text"})
    cache.put(Visit.cache_namespace(reader), normalize_url(url), page)
    body = run(visit(Visit([reader], Recorder(), cache=cache), [url]))
    assert "cached text" not in body and "resolves to a private address" in body

    answers["intranet.example"] = ["93.184.216.34"]  # public now: served from the cache
    reader = FetchReader(retry=FAST, resolver=resolver)
    assert "cached text" in run(visit(Visit([reader], Recorder(), cache=cache), [url]))
    answers.clear()  # no DNS at all: not a refusal, the page was read under this policy
    reader = FetchReader(retry=FAST, resolver=resolver)
    assert "cached text" in run(visit(Visit([reader], Recorder(), cache=cache), [url]))
    cache.close()


def test_refused_frame_says_why() -> None:
    frame = DRVENUS_TEXTS.visit_refused("http://10.0.0.1/", "g", "10.0.0.1 is private.\n")
    parsed = parse_visit_body(frame)
    assert parsed is not None and is_visit_failure(parsed[0]["summary"])
    assert parsed[0]["evidence"] == "The page was not read: 10.0.0.1 is private."


def test_visit_reads_real_pages_with_an_llm_extractor(site: WebSite) -> None:
    with StubServer([json.dumps(GOOD)] * 2) as llm:
        extractor = LLMExtractor(OpenAICompatModel(llm.base_url, "stub-model"))
        tool = Visit([fetch_reader()], extractor)
        urls = [site.url + "/article.html", site.url + "/paper.pdf"]
        frames = parse_visit_body(run(visit(tool, urls)))
        prompts = [r.json["messages"][0]["content"] for r in llm.chat_requests]
        body = llm.chat_requests[0].json
    assert frames is not None and [f["url"] for f in frames] == urls
    assert frames[0]["evidence"] == GOOD["evidence"] and frames[0]["summary"] == GOOD["summary"]
    assert any("| 1968 | Light automated |" in p for p in prompts)
    assert any("The storm destroyed the old pier." in p for p in prompts)
    assert body["temperature"] == 0.7 and "max_tokens" not in body


def test_readers_in_turn_and_metrics(site: WebSite) -> None:
    metrics = Metrics()
    readers: list[PageReader] = [
        JinaReader("wrong-key", base_url=site.url + "/jina", retry=FAST, allow_private=True),
        fetch_reader(),
    ]
    url = site.url + "/article.html"
    frames = parse_visit_body(run(visit(Visit(readers, Recorder(), metrics=metrics), [url])))
    assert frames is not None and frames[0]["summary"] == "seen"
    assert metrics.count("visit", "jina", "error") == 1
    assert metrics.count("visit", "fetch", "ok") == 1

    jina_first = [JinaReader("k-123", base_url=site.url + "/jina", retry=FAST), fetch_reader()]
    recorder = Recorder()
    run(visit(Visit(jina_first, recorder, metrics=metrics), ["https://example.org/light"]))
    assert recorder.pages[0].startswith("Title: Rivermouth Lighthouse")
    assert metrics.count("visit", "jina", "ok") == 1


def test_refused_and_unreadable_urls_get_the_failure_frame(site: WebSite) -> None:
    metrics = Metrics()
    tool = Visit([FetchReader(retry=FAST), fetch_reader()], Recorder(), metrics=metrics)
    urls = ["http://169.254.169.254/latest/meta-data/", "file:///etc/passwd"]
    frames = parse_visit_body(run(visit(tool, urls, "g")))
    assert frames is not None and all(is_visit_failure(f["summary"]) for f in frames)
    # the refusal is told to the agent (and kept in the record), not only in -v logs
    assert "169.254.169.254 is a cloud metadata address" in (frames[0]["evidence"] or "")
    assert frames[1] == parse_visit_body(render_visit_failure(urls[1], "g"))[0]  # not a web URL
    assert metrics.count("visit", "fetch", "refused") == 1
    assert metrics.count("visit") == 1  # the refused URL is not offered to the second reader

    tool = Visit([fetch_reader()], Recorder(), metrics=metrics)
    url = site.url + "/photo.png"
    assert run(visit(tool, [url], "g")) == join_visits([render_visit_failure(url, "g")])
    assert metrics.count("visit", "fetch", "error") == 1


def test_cache_serves_pages_again(site: WebSite, tmp_path: Path) -> None:
    cache = ToolCache(tmp_path / "tools.sqlite")
    metrics = Metrics()
    url = site.url + "/notes.txt"
    before = site.hits["/notes.txt"]
    for _ in range(2):
        tool = Visit([fetch_reader()], Recorder(), cache=cache, metrics=metrics)
        frames = parse_visit_body(run(visit(tool, [url])))
        assert frames is not None and "Plain notes" in (frames[0]["evidence"] or "")
    assert site.hits["/notes.txt"] == before + 1
    assert cache.get("page:fetch:private", normalize_url(url)) is not None
    assert metrics.count("visit", "fetch", "ok") == 1
    rendered = metrics.render()
    assert 'result="hit"' in rendered and 'result="miss"' in rendered
    cache.close()


def test_overall_time_budget(site: WebSite) -> None:
    metrics = Metrics()
    tool = Visit([fetch_reader(timeout=10)], Recorder(), metrics=metrics, overall_timeout=3.0)
    urls = [site.url + "/slow", site.url + "/article.html"]
    start = time.monotonic()
    body = run(visit(tool, urls))
    # the budget is 3 s: room for the quick page on a busy machine, well short of the slow one
    assert time.monotonic() - start < 9.5
    frames = parse_visit_body(body)
    assert frames is not None
    # the slow page (10 s) was cut by the budget: its frame is the failure frame
    assert body.split("\n=======\n")[0] == render_visit_failure(urls[0], GOAL)
    assert frames[1]["summary"] == "seen"
    assert metrics.count("visit", "fetch", "timeout") == 1


def test_page_budget_is_applied_with_the_counter(site: WebSite) -> None:
    recorder = Recorder()
    tool = Visit([fetch_reader()], recorder, max_page_tokens=30, counter=ScriptEstimate())
    run(visit(tool, [site.url + "/article.html"]))
    assert recorder.pages[0].startswith("# Rivermouth Lighthouse")
    assert ScriptEstimate().count(recorder.pages[0]) <= 30 < len(recorder.pages[0]) // 4 + 10


# --- token counting ----------------------------------------------------------------------------


def test_script_estimate_counts_cjk_per_character() -> None:
    english = "The lighthouse was built in 1871 by the engineer Thomas Hale. " * 10
    chinese = "埃菲尔铁塔是位于法国巴黎战神广场上的镂空结构铁塔" * 10
    assert ScriptEstimate().count(english) == ByteEstimate().count(english)
    assert ScriptEstimate().count(chinese) == round(1.3 * len(chinese))
    assert ByteEstimate().count(chinese) == len(chinese) * 3 // 4  # the package estimate
    cut = truncate_to_tokens(chinese + english, 100, ScriptEstimate())
    assert ScriptEstimate().count(cut) <= 100 and (chinese + english).startswith(cut)
    assert len(cut) == int(100 / 1.3)


class CharEncoding:
    """A toy tokenizer: one token per character."""

    def encode_ordinary(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, tokens: Sequence[int]) -> str:
        return "".join(map(chr, tokens))


def test_encoding_counter_cuts_by_tokens() -> None:
    counter = EncodingCounter(CharEncoding(), "chars")
    text = "ab " * 50_000  # more than one encoding chunk
    assert counter.count(text) == len(text)
    assert counter.truncate(text, 100_001) == text[:100_001]
    assert counter.truncate("short", 10) == "short"
    assert default_counter().count("hello world") >= 2


# --- the LLM extractor -------------------------------------------------------------------------


def page_lengths(llm: StubServer, page: str) -> list[int]:
    """The length of the page part of each prompt the extractor sent."""
    out = []
    for request in llm.chat_requests:
        prompt = request.json["messages"][0]["content"]
        start = prompt.index(page[:20])
        out.append(len(prompt[start : prompt.index("\n\n## Goal")]))
    return out


def extract(replies: list[Any], page: str, **options: Any) -> tuple[Any, StubServer]:
    with StubServer(replies) as llm:
        extractor = LLMExtractor(OpenAICompatModel(llm.base_url, "stub-model"), **options)
        result = run(extractor.extract(page, GOAL, "https://x.example/p"))
        run(extractor.aclose())
    return result, llm


def test_short_replies_shorten_the_page_then_cut_to_25000_chars() -> None:
    page = "The lighthouse keeper wrote daily. " * 4_000  # 140,000 characters
    replies = ["", "too short", {"status": 400, "content": "context length exceeded"}, "",
               json.dumps(GOOD)]
    result, llm = extract(replies, page)
    assert result is not None and result.summary == GOOD["summary"]
    lengths = page_lengths(llm, page)
    assert lengths[:4] == [140_000, 98_000, 68_600, 48_020]
    assert lengths[4] == 25_000 and len(lengths) == 5


def test_invalid_json_is_asked_again_then_repaired() -> None:
    json5_reply = "{'evidence': 'Built in 1871 by Thomas Hale.', 'summary': 'Thomas Hale, 1871',}"
    result, llm = extract([json5_reply, "no json here, sorry", "still none", "nope, none"], "p" * 50)
    assert result is not None and result.summary == "Thomas Hale, 1871"
    assert len(llm.chat_requests) == 4  # the reply, three more asks, then the repair

    result, llm = extract(["Sure! {\"evidence\": broken", json.dumps(GOOD)], "p" * 50)
    assert result is not None and result.evidence == GOOD["evidence"]
    assert len(llm.chat_requests) == 2


def test_extractor_failure_falls_back_to_the_offline_extractor() -> None:
    page = "The lighthouse was built in 1871 by Thomas Hale.\n\nThe ferry runs twice a day."
    result, llm = extract([], page, fallback=ExtractiveExtractor(), max_attempts=3)
    assert len(llm.chat_requests) == 3
    assert result is not None and "Thomas Hale" in (result.evidence or "")
    nothing, _ = extract([], page, max_attempts=2)
    assert nothing is None


def test_keys_stay_out_of_logs(site: WebSite, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    reader = JinaReader(["secret-key-1", "k-123"], base_url=site.url + "/jina", retry=FAST)
    tool = Visit([reader], Recorder())
    run(visit(tool, ["https://example.org/a", "https://example.org/b"]))
    assert "secret-key" not in caplog.text and "k-123" not in caplog.text
    assert "secret-key" not in repr(reader)

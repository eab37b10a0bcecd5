"""The local search and visit tools, the page extractors and the toolbox."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drvenus.corpus import CorpusIndex, build_index
from drvenus.llm.base import Generation, LLMError, SamplingParams
from drvenus.protocol import (
    ToolCall,
    join_visits,
    parse_search_body,
    parse_visit_body,
    render_visit_failure,
    unknown_tool_message,
)
from drvenus.tools.extract import (
    Extraction,
    ExtractiveExtractor,
    LLMExtractor,
    parse_extraction,
    split_sentences,
)
from drvenus.tools.search import LocalSearch
from drvenus.tools.toolbox import Toolbox, offline_toolbox
from drvenus.tools.visit import LocalVisit, truncate_page

RIVER_PAGE = """Rivermouth

Rivermouth is a small coastal town in the north of the country. It has about 4,000 inhabitants.

The town was founded in 1642 by fishermen from the south. Its harbour was rebuilt after a storm \
destroyed the old pier in 1893.

The local economy depends on fishing and tourism. A ferry connects Rivermouth with the islands \
twice a day in summer.

Rivermouth's lighthouse, built in 1871 by the engineer Thomas Hale, is 38 metres tall and is the \
tallest lighthouse on the coast."""

DOCS = [
    {
        "id": "rivermouth",
        "title": "Rivermouth",
        "url": "https://en.wikipedia.org/wiki/Rivermouth",
        "text": RIVER_PAGE.split("\n\n", 1)[1],
    },
    {
        "id": "eiffel",
        "title": "Eiffel Tower",
        "url": "https://en.wikipedia.org/wiki/Eiffel_Tower",
        "text": "The Eiffel Tower is a wrought-iron lattice tower in Paris. It is 330 metres tall.",
    },
]

GOAL = "Who built the lighthouse and when?"


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> CorpusIndex:
    root = tmp_path_factory.mktemp("tools")
    path = root / "docs.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in DOCS), encoding="utf-8")
    return CorpusIndex(build_index(path, cache_dir=root / "cache").path)


class FakeModel:
    """A scripted ChatModel: replies in order; an exception instance is raised instead."""

    name = "fake"

    def __init__(self, replies: list[str | Exception]) -> None:
        self.replies = list(replies)
        self.calls: list[list[dict[str, str]]] = []

    async def generate(
        self,
        messages: list[dict[str, str]],
        params: SamplingParams,
        **kwargs: object,
    ) -> Generation:
        self.calls.append(messages)
        reply = self.replies.pop(0) if self.replies else "no more replies"
        if isinstance(reply, Exception):
            raise reply
        return Generation(text=reply)

    def count_tokens(self, text: str) -> int:
        return len(text) // 4

    async def aclose(self) -> None:
        return None


# --- search ------------------------------------------------------------------------------------


def test_search_output_parses(index: CorpusIndex) -> None:
    tool = LocalSearch(index, top_k=5)
    body = run(tool({"query": ["Rivermouth lighthouse", "qqqzzz nothing", "Eiffel tower"]}))
    data = parse_search_body(body)
    assert data is not None
    assert [e["query"] for e in data] == ["Rivermouth lighthouse", "qqqzzz nothing", "Eiffel tower"]
    first = data[0]["web_page_info_list"][0]
    assert first["url"] == "https://en.wikipedia.org/wiki/Rivermouth"
    assert first["title"] == "Rivermouth"
    assert "lighthouse" in first["snippet"]
    assert set(first) == {"title", "url", "snippet"}
    assert data[1]["web_page_info_list"] == []
    assert data[2]["web_page_info_list"][0]["title"] == "Eiffel Tower"


def test_search_top_k_and_lone_string(index: CorpusIndex) -> None:
    body = run(LocalSearch(index, top_k=1)({"query": "tower"}))
    data = parse_search_body(body)
    assert data is not None and len(data) == 1 and len(data[0]["web_page_info_list"]) == 1


# --- visit -------------------------------------------------------------------------------------


def test_visit_output_parses_with_evidence(index: CorpusIndex) -> None:
    tool = LocalVisit(index, ExtractiveExtractor())
    url = "https://en.m.wikipedia.org/wiki/Rivermouth"
    frames = parse_visit_body(run(tool({"url": [url], "goal": GOAL})))
    assert frames is not None and len(frames) == 1
    frame = frames[0]
    assert frame["url"] == url and frame["goal"] == GOAL
    assert frame["evidence"] is not None and "Thomas Hale" in frame["evidence"]
    assert "ferry" not in frame["evidence"]
    assert "1871" in frame["summary"]


def test_visit_failures(index: CorpusIndex) -> None:
    tool = LocalVisit(index, ExtractiveExtractor())
    urls = [
        "https://en.wikipedia.org/wiki/No_such_page",
        "file:///etc/passwd",
        "https://en.wikipedia.org/wiki/Eiffel_Tower",
    ]
    body = run(tool({"url": urls, "goal": "height"}))
    frames = parse_visit_body(body)
    assert frames is not None and [f["url"] for f in frames] == urls
    parts = body.split("\n=======\n")
    assert parts[0] == render_visit_failure(urls[0], "height")
    assert parts[1] == render_visit_failure(urls[1], "height")
    assert frames[2]["evidence"] is not None and "330 metres" in frames[2]["evidence"]


class RecordingExtractor:
    def __init__(self, result: Extraction | None = None, error: Exception | None = None) -> None:
        self.pages: list[str] = []
        self.result = result
        self.error = error

    async def extract(self, page_text: str, goal: str, url: str) -> Extraction | None:
        self.pages.append(page_text)
        if self.error is not None:
            raise self.error
        return self.result


def test_visit_cuts_page_to_budget_and_handles_extractor_errors(index: CorpusIndex) -> None:
    url = "https://en.wikipedia.org/wiki/Rivermouth"
    recorder = RecordingExtractor(Extraction(evidence=None, summary="short"))
    tool = LocalVisit(index, recorder, max_page_tokens=20)
    frames = parse_visit_body(run(tool({"url": [url], "goal": GOAL})))
    assert frames is not None and frames[0]["evidence"] is None and frames[0]["summary"] == "short"
    assert recorder.pages[0].startswith("Rivermouth is a small") and len(recorder.pages[0]) <= 80

    for extractor in (RecordingExtractor(None), RecordingExtractor(error=RuntimeError("x"))):
        body = run(LocalVisit(index, extractor)({"url": [url], "goal": GOAL}))
        assert body == join_visits([render_visit_failure(url, GOAL)])


def test_truncate_page() -> None:
    text = "word " * 1000
    cut = truncate_page(text, max_tokens=100)
    assert len(cut) <= 400 and not cut.endswith("wor")
    assert truncate_page("short", 100) == "short"
    cjk = "東京" * 1000  # 3 UTF-8 bytes a character: far fewer characters fit
    assert len(truncate_page(cjk, max_tokens=100)) == 400 // 3


# --- extractors --------------------------------------------------------------------------------


def test_extractive_evidence_is_the_relevant_passage() -> None:
    result = run(ExtractiveExtractor().extract(RIVER_PAGE, GOAL, "u"))
    assert result is not None and result.evidence is not None
    assert "built in 1871 by the engineer Thomas Hale" in result.evidence
    assert "ferry" not in result.evidence
    assert "Thomas Hale" in result.summary

    two = run(ExtractiveExtractor().extract(RIVER_PAGE, "When was the town founded? ferry", "u"))
    assert two.evidence.index("1642") < two.evidence.index("ferry")  # page order


def test_extractive_without_overlap_falls_back_to_the_lead() -> None:
    result = run(ExtractiveExtractor().extract(RIVER_PAGE, "quantum chromodynamics", "u"))
    assert result is not None
    assert "does not directly address" in result.summary
    assert "coastal town" in result.summary
    assert result.evidence.startswith("Rivermouth")
    assert run(ExtractiveExtractor().extract("   ", GOAL, "u")) is None


def test_split_sentences_keeps_initials_and_abbreviations() -> None:
    text = "It was written by Arthur C. Clarke in the U.S. in 1968. Dr. Smith agreed. Yes!"
    assert split_sentences(text) == [
        "It was written by Arthur C. Clarke in the U.S. in 1968.",
        "Dr. Smith agreed.",
        "Yes!",
    ]


GOOD = {
    "rational": "The page names the builder.",
    "evidence": "Built in 1871 by Thomas Hale.",
    "summary": "Thomas Hale built it in 1871.",
}


def test_llm_extractor_good_json() -> None:
    model = FakeModel([json.dumps(GOOD)])
    result = run(LLMExtractor(model).extract(RIVER_PAGE, GOAL, "https://x.org/r"))
    assert result == Extraction(GOOD["evidence"], GOOD["summary"], GOOD["rational"])
    prompt = model.calls[0][0]["content"]
    assert GOAL in prompt and "https://x.org/r" in prompt and "Thomas Hale" in prompt


@pytest.mark.parametrize(
    "reply",
    [
        "Here you go:\n```json\n" + json.dumps(GOOD, indent=2) + "\n```\nDone.",
        "<think>\nlet me look\n</think>\n" + json.dumps(GOOD),
        "{'rational': 'r', 'evidence': 'Built in 1871 by Thomas Hale.', "
        "'summary': 'Thomas Hale built it in 1871.',}",
        'Sure! {"evidence": ["Built in 1871", "by Thomas Hale."], "summary": "Thomas Hale, 1871"}',
    ],
)
def test_llm_extractor_lenient_parsing(reply: str) -> None:
    result = run(LLMExtractor(FakeModel([reply])).extract(RIVER_PAGE, GOAL, "u"))
    assert result is not None
    assert "1871" in (result.evidence or "") and "Thomas Hale" in result.summary


def test_llm_extractor_retries_then_fails() -> None:
    model = FakeModel(["garbage", "{not json", '{"other": 1}', json.dumps(GOOD)])
    assert run(LLMExtractor(model, max_attempts=3).extract(RIVER_PAGE, GOAL, "u")) is None
    assert len(model.calls) == 3

    flaky = FakeModel([LLMError("server down"), json.dumps(GOOD)])
    result = run(LLMExtractor(flaky).extract(RIVER_PAGE, GOAL, "u"))
    assert result is not None and result.summary == GOOD["summary"]


def test_llm_extractor_fallback_and_visit_failure(index: CorpusIndex) -> None:
    model = FakeModel(["garbage"] * 2)
    extractor = LLMExtractor(model, max_attempts=2, fallback=ExtractiveExtractor())
    result = run(extractor.extract(RIVER_PAGE, GOAL, "u"))
    assert result is not None and "Thomas Hale" in (result.evidence or "")

    url = "https://en.wikipedia.org/wiki/Rivermouth"
    visit = LocalVisit(index, LLMExtractor(FakeModel(["garbage"] * 3)))
    assert run(visit({"url": [url], "goal": GOAL})) == join_visits([render_visit_failure(url, GOAL)])


def test_parse_extraction_rejects_empty() -> None:
    assert parse_extraction('{"evidence": "", "summary": ""}') is None
    assert parse_extraction("") is None
    only_summary = parse_extraction('{"summary": "s"}')
    assert only_summary == Extraction(evidence=None, summary="s")


# --- toolbox -----------------------------------------------------------------------------------


class BrokenTool:
    name = "search"

    async def __call__(self, arguments: Mapping[str, Any]) -> str:
        raise ValueError("index exploded")


class SlowTool:
    name = "visit"

    async def __call__(self, arguments: Mapping[str, Any]) -> str:
        await asyncio.sleep(10)
        return "late"


def test_toolbox_catches_exceptions_and_timeouts() -> None:
    box = Toolbox([BrokenTool(), SlowTool()], timeout=0.05)
    assert box.names == ("search", "visit")
    out = run(box.call(ToolCall("search", {"query": ["x"]})))
    assert out == "ERROR: search failed: index exploded"
    out = run(box.call(ToolCall("visit", {"url": ["https://x.org"], "goal": "g"})))
    assert out.startswith("ERROR: visit failed: timed out")
    only_search = Toolbox({"search": BrokenTool()})
    assert run(only_search.call(ToolCall("visit", {}))) == unknown_tool_message("visit")


def test_offline_toolbox_on_a_corpus_file(tmp_path: Path) -> None:
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in DOCS), encoding="utf-8")
    box = offline_toolbox(path, top_k=3, cache_dir=tmp_path / "cache")
    body = run(box.call(ToolCall("search", {"query": ["lighthouse engineer"]})))
    data = parse_search_body(body)
    assert data is not None and data[0]["web_page_info_list"][0]["title"] == "Rivermouth"
    url = data[0]["web_page_info_list"][0]["url"]
    frames = parse_visit_body(run(box.call(ToolCall("visit", {"url": [url], "goal": GOAL}))))
    assert frames is not None and "Thomas Hale" in (frames[0]["evidence"] or "")
    assert list((tmp_path / "cache" / "index").iterdir())


def test_offline_toolbox_builtin_corpus(tmp_path: Path) -> None:
    box = offline_toolbox(cache_dir=tmp_path / "cache")
    body = run(box.call(ToolCall("search", {"query": ["Hamlet Shakespeare tragedy"]})))
    data = parse_search_body(body)
    assert data is not None
    top = data[0]["web_page_info_list"][0]
    assert top["url"] == "https://en.wikipedia.org/wiki/Hamlet"
    call = ToolCall("visit", {"url": [top["url"]], "goal": "When was Hamlet written?"})
    frames = parse_visit_body(run(box.call(call)))
    assert frames is not None and "1599" in (frames[0]["evidence"] or "")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["John", "A.", "Smith", "was", "born", "c.", "1900.", "He",
                                 "died", "in", "St.", "Ives!", "\"Why?\"", "It", "(1815).",
                                 "Mr.", "Brown", "e.g.", "3", "U.S.", "cats."]),
                max_size=30))
def test_sentences_cover_the_text_and_start_where_the_snippets_start(words) -> None:
    """One sentence rule (drvenus.text) for the extractor, the answer focus and the search
    snippets: the sentences are the text cut at ``sentence_starts``, nothing lost, and a
    sentence never starts after an initial or an abbreviation."""
    from drvenus.text import sentence_starts

    text = " ".join(words)
    pieces = split_sentences(text)
    assert " ".join(pieces).split() == text.split()
    starts = list(sentence_starts(text))
    assert len(pieces) == len(starts) + 1 or not text.strip()
    for at in starts:
        before = text[:at].split()[-1].lower()
        assert before not in ("a.", "c.", "st.", "mr.", "e.g.", "u.s.")

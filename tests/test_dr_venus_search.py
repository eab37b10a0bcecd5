"""``--protocol dr-venus`` writes search results as DR-Venus's search tool does (Serper's reply
through drvenus's Serper provider, then the profile's renderer), compared with DR-Venus's own
function loaded from the pinned files (tests/dr_venus_functions.py)."""

from __future__ import annotations

import asyncio

import pytest

from dr_venus_functions import NEEDS_REFERENCE, search_function
from drvenus.protocol import render_search
from drvenus.protocol.dr_venus import render_search_text
from drvenus.reference.profiles import profile
from drvenus.tools.search import Search
from drvenus.tools.web_search import SerperSearch


def hit(i: int, **extra) -> dict:
    return {"title": f"Title {i}", "link": f"https://site{i}.example/page", **extra}


REPLIES = [
    ("Dune author", {"organic": [hit(1, snippet="Frank Herbert wrote Dune.")]}),
    ("Dune author", {"organic": [hit(1, snippet="s", date="Jan 2, 2020")]}),
    ("Dune author", {"organic": [hit(1, snippet="s", source="Wikipedia")]}),
    ("Dune author", {"organic": [hit(1, snippet="s", date="2020", source="Wikipedia")]}),
    ("Dune author", {"organic": [hit(1)]}),  # a hit without a snippet
    ("Dune author", {"organic": [hit(1, date="2020")]}),
    ("Herbert's novel", {"organic": [hit(1, snippet="an apostrophe in the query")]}),
    ("Dune", {"organic": [hit(i, snippet=f"snippet {i}") for i in range(1, 11)]}),
    ("nothing here", {"searchParameters": {"q": "nothing here"}}),  # no organic: no result
    ("video", {"organic": [hit(1, snippet="Your browser can't play this video. Watch it.")]}),
    ("沙丘 作者", {"organic": [hit(1, snippet="弗兰克·赫伯特", source="百科")]}),
    ("mixed", {"organic": [hit(1, snippet="a"), hit(2), hit(3, date="1965", snippet="c")]}),
    ("quotes", {"organic": [hit(1, snippet='He said "Dune" [1] (novel)')]}),
]


def ours(query: str, reply: dict) -> str:
    provider = SerperSearch("key")

    async def answer(*args, **kwargs):
        return reply

    provider._request_json = answer  # type: ignore[method-assign]
    tool = Search([provider], top_k=10, render=profile("dr-venus").search_renderer())
    return asyncio.run(tool({"query": [query]}))


def test_the_table_reaches_every_kind_of_reply():
    """No result, a full page of ten, dates, a CJK query (its own locale), quotes: the
    comparison below covers the renderer's cases, not a few."""
    from drvenus.tools.web_search import has_cjk

    rendered = {query: ours(query, reply) for query, reply in REPLIES}
    assert any("No results found" in text for text in rendered.values())
    assert any(len(reply.get("organic", [])) == 10 for _, reply in REPLIES)
    assert any(hit.get("date") for _, reply in REPLIES for hit in reply.get("organic", []))
    assert any(has_cjk(query) for query in rendered)


def test_each_profile_has_its_renderer_and_queries_are_joined():
    assert profile("drvenus").search_renderer() is render_search
    assert profile("dr-venus").search_renderer() is render_search_text
    text = render_search_text([("a", []), ("b", [])])
    assert text.count("No results found") == 2 and "\n=======\n" in text


@NEEDS_REFERENCE
@pytest.mark.parametrize(("query", "reply"), REPLIES)
def test_search_text_equals_dr_venus(query, reply, tmp_path):
    theirs = search_function(tmp_path)
    assert ours(query, reply) == theirs(query, reply)

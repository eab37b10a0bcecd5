"""``--protocol dr-venus`` shows the model the search results DR-Venus's model reads: the
Markdown of DR-Venus's search tool as its dispatcher (``custom_call_tool``) re-reads it into
JSON, quirks included. Compared with DR-Venus's own dispatcher and search tool loaded from the
pinned files (tests/dr_venus_functions.py), Serper answering both with the same replies:
hand-made ones, generated ones (hypothesis), and ``drvenus ask`` against a stub Serper."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dr_venus_functions import NEEDS_REFERENCE, dispatcher, search_function
from drvenus.protocol import render_search
from drvenus.protocol.dr_venus import render_search_text, render_search_view, search_view
from drvenus.reference.profiles import profile
from drvenus.tools.search import Search
from drvenus.tools.web_search import SerperSearch


def hit(i: int, **extra) -> dict:
    return {"title": f"Title {i}", "link": f"https://site{i}.example/page", **extra}


NOTHING = {"searchParameters": {"q": "nothing here"}}  # Serper omits "organic": no result
REPLIES = [
    ("Dune author", {"organic": [hit(1, snippet="Frank Herbert wrote Dune.")]}),
    ("Dune author", {"organic": [hit(1, snippet="s", date="Jan 2, 2020")]}),
    ("Dune author", {"organic": [hit(1, snippet="s", source="Wikipedia")]}),
    ("Dune author", {"organic": [hit(1, snippet="s", date="2020", source="Wikipedia")]}),
    ("Dune author", {"organic": [hit(1)]}),  # a hit without a snippet
    ("Dune author", {"organic": [hit(1, date="2020")]}),
    ("Herbert's novel", {"organic": [hit(1, snippet="an apostrophe in the query")]}),
    ("Dune", {"organic": [hit(i, snippet=f"snippet {i}") for i in range(1, 11)]}),
    ("nothing here", NOTHING),
    ("video", {"organic": [hit(1, snippet="Your browser can't play this video. Watch it.")]}),
    ("沙丘 作者", {"organic": [hit(1, snippet="弗兰克·赫伯特", source="百科")]}),
    ("mixed", {"organic": [hit(1, snippet="a"), hit(2), hit(3, date="1965", snippet="c")]}),
    ("quotes", {"organic": [hit(1, snippet='He said "Dune" [1] (novel)')]}),
    ("list", {"organic": [hit(1, snippet="Top books:\n2. [Dune](x)\nend")]}),  # a fake hit
]
#: calls of several queries: an apostrophe, a query without results (alone, first, between)
CALLS = [
    ["Dune author", "Herbert's novel", "nothing here"],
    ["nothing here", "Dune author"],
    ["Dune author", "nothing here", "mixed"],
    ["'quoted' start", "Dune"],
    ["nothing here"],
    ["Dune", "video", "沙丘 作者", "quotes", "list"],
]


def reply_for(query: str) -> dict:
    for q, reply in REPLIES:
        if q == query:
            return reply
    return NOTHING if "nothing" in query else {"organic": [hit(1, snippet=f"about {query}")]}


def ours(arguments: dict, replies: dict[str, dict]) -> str:
    """The dr-venus profile's search tool body: drvenus's Serper provider answered by
    ``replies``, the profile's renderer."""
    provider = SerperSearch("key")

    async def answer(method, path, json):
        return replies[json["q"]]

    provider._request_json = answer  # type: ignore[method-assign]
    chosen = profile("dr-venus")
    tool = Search([provider], top_k=10, render=chosen.search_renderer(),
                  missing=chosen.search_without_query())
    return asyncio.run(tool(arguments))


def test_the_tables_reach_every_kind_of_reply():
    """No result, a full page of ten, dates, a CJK query (its own locale), an apostrophe, and
    calls where a query without results comes first, between and last."""
    from drvenus.tools.web_search import has_cjk

    assert any("organic" not in reply for _, reply in REPLIES)
    assert any(len(reply.get("organic", [])) == 10 for _, reply in REPLIES)
    assert any(hit.get("date") for _, reply in REPLIES for hit in reply.get("organic", []))
    assert any(has_cjk(query) for query, _ in REPLIES)
    assert any("'" in q for q, _ in REPLIES)
    nothing = [[("nothing" in q) for q in call] for call in CALLS]
    assert any(n[0] and len(n) > 1 for n in nothing) and any(n[-1] and len(n) > 1
                                                            for n in nothing)
    assert any(True in n[1:-1] for n in nothing)


def test_each_profile_has_its_renderer():
    assert profile("drvenus").search_renderer() is render_search
    assert profile("drvenus").search_without_query() is None
    assert profile("dr-venus").search_renderer() is render_search_view
    assert profile("dr-venus").search_without_query() == "[]"


def test_the_view_keeps_the_quirks_of_the_re_reading():
    """The query cut at its apostrophe; a query without results glued onto the previous
    query's last snippet (after the separator), or dropped when it comes first."""
    hits = [{"title": "T", "url": "https://a.example", "snippet": "S"}]
    view = json.loads(render_search_view([("Herbert's novel", hits), ("none", [])]))
    assert view[0]["query"] == "Herbert"
    assert view[0]["web_page_info_list"][0]["snippet"].startswith("S\n=======\nNo results found")
    assert json.loads(render_search_view([("none", []), ("a", hits)]))[0]["query"] == "a"
    assert search_view("") == "[]" and render_search_view([]) == "[]"


@NEEDS_REFERENCE
@pytest.mark.parametrize(("query", "reply"), REPLIES)
def test_search_markdown_equals_dr_venus_tool(query, reply):
    """The Markdown under the view: DR-Venus's ``google_search_with_serp``."""
    theirs = search_function()
    assert render_search_text([(query, asyncio.run(_hits(reply)))]) == theirs(query, reply)


async def _hits(reply: dict) -> list[dict]:
    provider = SerperSearch("key")

    async def answer(*args, **kwargs):
        return reply

    provider._request_json = answer  # type: ignore[method-assign]
    return await provider.search("q", 10)


@pytest.fixture(scope="module")
def dispatch():
    return dispatcher()


@pytest.fixture(scope="module")
def dispatch_rl():
    return dispatcher("RL")


@NEEDS_REFERENCE
@pytest.mark.parametrize("queries", CALLS + [[q] for q, _ in REPLIES])
def test_tool_response_equals_dr_venus_dispatcher(queries, dispatch, dispatch_rl):
    """What the model reads, inference's dispatcher and RL's, byte for byte."""
    replies = {q: reply_for(q) for q in queries}
    call = {"name": "search", "arguments": {"query": queries}}
    text = ours({"query": queries}, replies)
    assert text == dispatch(call, replies) == dispatch_rl(call, replies)


@NEEDS_REFERENCE
def test_a_call_without_a_query_reads_as_dr_venus(dispatch):
    for arguments in ({}, {"query": []}):
        assert ours(arguments, {}) == dispatch({"name": "search", "arguments": arguments}, {})


# Serper's replies as Serper writes them: strings trimmed, every hit with its link, at most
# ten hits; the text inside is anything, the re-reading's traps included
_TRAPS = st.sampled_from(["'", "=======", "\n", "\n\n", "1. [", "](", ")", "[", "]", " ", "2.",
                          "A Google search for '", "Your browser can't play this video.",
                          "No results found for 'x'.", "\n3. [a](b)\n"])
_TEXT = st.lists(st.one_of(_TRAPS, st.text(max_size=6)), max_size=5).map("".join)
_TRIMMED = _TEXT.map(str.strip)
_LINK = st.text(st.characters(blacklist_categories=("Zs", "Cc", "Zl", "Zp")), min_size=1,
                max_size=12).map(str.strip).filter(bool)


@st.composite
def serper_hit(draw: st.DrawFn) -> dict:
    item = {"title": draw(_TRIMMED), "link": draw(_LINK)}
    for key, value in (("snippet", _TRIMMED), ("date", _TRIMMED.filter(bool)),
                       ("source", _TRIMMED.filter(bool))):
        if draw(st.booleans()):
            item[key] = draw(value)
    return item


_REPLY = st.one_of(st.just(NOTHING), st.builds(
    lambda hits: {"organic": hits}, st.lists(serper_hit(), min_size=1, max_size=10)))
_QUERY = _TRIMMED.filter(bool)


@NEEDS_REFERENCE
@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.tuples(_QUERY, _REPLY), min_size=1, max_size=4,
                unique_by=lambda pair: pair[0]))
def test_generated_replies_read_as_dr_venus(dispatch, pairs):
    replies = dict(pairs)
    queries = [q for q, _ in pairs]
    call = {"name": "search", "arguments": {"query": queries}}
    assert ours({"query": queries}, replies) == dispatch(call, replies)


@NEEDS_REFERENCE
def test_ask_against_a_stub_serper_shows_what_dr_venus_shows(tmp_path, dispatch):
    """``drvenus ask --protocol dr-venus --search serper``: the tool response is DR-Venus's
    dispatcher's text for the same Serper replies, byte for byte."""
    from helpers.cli import ANSWER, drvenus
    from helpers.search import KEY, FakeSearchServer, serper_answer
    from stub_server import StubServer

    queries = ["Dune author", "Herbert's novel", "nothing here"]
    call = {"name": "search", "arguments": {"query": queries}}
    turn = f"<think>\nLet me search.\n</think>\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
    with FakeSearchServer("serper", n=10) as serper, StubServer([turn, ANSWER]) as model:
        r = drvenus("ask", "Who wrote Dune?", "--base-url", model.base_url, "--json",
                    "--no-constrained", "--protocol", "dr-venus", "--search", "serper",
                    env={"DRVENUS_CACHE_DIR": str(tmp_path), "DRVENUS_SERPER_URL": serper.url,
                         "SERPER_KEY_ID": KEY}, timeout=120)
    assert r.returncode == 0, r.stderr
    record = json.loads(r.stdout)
    response = next(m["content"] for m in record["messages"] if m["role"] == "user"
                    and m["content"].startswith("<tool_response>"))
    replies = {q: serper_answer(q, 10) for q in queries}
    assert response == f"<tool_response>\n{dispatch(call, replies)}\n</tool_response>"

"""The embedded recipe's training data (drvenus.recipe): bucket rule, question sets, teacher."""

from __future__ import annotations

import asyncio
import json
import random
from functools import cache

from drvenus import protocol
from drvenus.grading.match import normalize_answer
from drvenus.recipe.articles import RESERVED_COUNT, is_reserved, load_articles
from drvenus.recipe.build import (
    BuildConfig,
    check_buckets,
    eval_row,
    mix_questions,
    rl_row,
    run_teacher,
    select_sft,
    title_overlaps,
    write_jsonl,
)
from drvenus.recipe.facts import contains_answer, find_span, name_after
from drvenus.recipe.pairs import COMPARISON, YES_NO, comparisons, yes_no
from drvenus.recipe.questions import (
    Question,
    assign_splits,
    dedupe,
    single_hop,
    two_hop,
)
from drvenus.recipe.teacher import Teacher, tool_response_bodies
from drvenus.recipe.tokens import ChatTokenCounter
from drvenus.small.spans import question_query

SEED = 17
SYSTEM = protocol.build_system_prompt("2026-12-01")


@cache
def articles():
    return load_articles()


@cache
def by_title():
    return {a.title: a for a in articles()}


@cache
def question_sets():
    rng = random.Random(SEED)
    singles = single_hop(articles(), rng)
    doubles, _ = two_hop(articles(), rng)
    pairs = comparisons(articles(), rng) + yes_no(articles(), rng)
    questions = dedupe([*singles, *doubles, *pairs])
    assign_splits(questions, SEED)
    return questions


@cache
def toolbox():
    from drvenus.config import load_settings
    from drvenus.stack import build_toolbox

    return build_toolbox(load_settings(search="local", visit="local"))


def teacher() -> Teacher:
    counter = ChatTokenCounter(None)
    return Teacher(toolbox(), {a.title: a.url for a in articles()}, SYSTEM,
                   count_tokens=counter.count, max_tokens=2048, seed=SEED)


def sample(kind_filter, n, seed=0):
    pool = [q for q in question_sets() if kind_filter(q)]
    return random.Random(seed).sample(pool, min(n, len(pool)))


# --- the bucket rule ---------------------------------------------------------------------------


def test_bucket_rule_on_the_package_data():
    arts = articles()
    assert len(arts) == 10_033
    assert sum(a.reserved for a in arts) == RESERVED_COUNT == 2_545
    assert is_reserved("Dracula") == (__import__("hashlib").sha256(b"Dracula").hexdigest()[0]
                                      in "0123")


def test_train_splits_never_use_reserved_articles_and_eval_only_reserved():
    questions = question_sets()
    check_buckets(questions)  # raises on a violation
    for q in questions:
        reserved = [is_reserved(t) for t in q.gold_titles]
        if q.split in ("train-sft", "train-rl"):
            assert not any(reserved), q
        else:
            assert q.split in ("dev", "test") and all(reserved), q
    splits = {q.split for q in questions}
    assert splits == {"train-sft", "train-rl", "dev", "test"}
    sft = {q.gold_titles[0] for q in questions if q.split == "train-sft"}
    rl = {q.gold_titles[0] for q in questions if q.split == "train-rl"}
    assert not sft & rl  # split by article: no question (or article) in both


def test_generation_is_deterministic():
    rng = random.Random(SEED)
    first = [q.to_dict() for q in single_hop(articles()[:800], rng)]
    rng = random.Random(SEED)
    again = [q.to_dict() for q in single_hop(articles()[:800], rng)]
    assert first == again and first


# --- single-hop and two-hop questions ---------------------------------------------------------


def test_single_hop_answers_are_in_the_article_and_not_in_the_question():
    singles = [q for q in question_sets() if q.hops == 1]
    assert len(singles) > 3000
    kinds = {q.kind for q in singles}
    assert {"birth_year", "nationality", "capital_of", "population", "atomic_number"} <= kinds
    assert {"who", "what", "when", "where", "which", "how many"} <= {q.wh for q in singles}
    for q in singles:
        art = by_title()[q.gold_titles[0]]
        assert find_span(art.text, q.answer) is not None, q  # verbatim (up to whitespace)
        assert not contains_answer(q.question, q.answer), q
        assert q.subject.lower() in q.question.lower()  # the subject is named
        assert len(q.answer.split()) <= 6


def test_two_hop_questions_bridge_two_articles():
    doubles = [q for q in question_sets() if q.source == "wiki-two-hop"]
    assert len(doubles) > 100
    for q in doubles:
        a, b = (by_title()[t] for t in q.gold_titles)
        assert a.title != b.title and q.bridge == b.title
        assert find_span(a.text, b.title) is not None or b.title.lower() in a.text.lower()
        assert find_span(b.text, q.answer) is not None
        assert not contains_answer(q.question, q.answer)
        assert not contains_answer(q.question, b.title)
        assert a.title in q.question
        assert is_reserved(a.title) == is_reserved(b.title)


def test_comparison_and_yes_no_questions_name_both_subjects():
    pairs = [q for q in question_sets() if q.source in (COMPARISON, YES_NO)]
    kinds = {q.kind for q in pairs}
    assert {"cmp:birth_year", "cmp:death_year", "cmp:population", "yn:nationality",
            "yn:country"} <= kinds
    answers = [q.answer for q in pairs if q.source == YES_NO]
    assert answers.count("yes") == answers.count("no") > 100  # as many of each
    for q in pairs:
        a, b = (by_title()[t] for t in q.gold_titles)
        sides = q.meta["pair"]
        assert a.title != b.title and is_reserved(a.title) == is_reserved(b.title)
        assert all(s["mention"] in q.question for s in sides)
        assert all(find_span(by_title()[s["title"]].text, s["value"]) for s in sides)
        if q.source == COMPARISON:
            assert q.answer in (sides[0]["mention"], sides[1]["mention"])
            assert sides[0]["value"] != sides[1]["value"]
        else:
            same = sides[0]["value"] == sides[1]["value"]
            assert q.answer == ("yes" if same else "no")


def test_a_comparison_answer_follows_the_values():
    q = next(q for q in question_sets() if q.kind == "cmp:birth_year")
    years = {s["mention"]: int(s["value"]) for s in q.meta["pair"]}
    other = next(m for m in years if m != q.answer)
    later = "later" in q.question or "younger" in q.question
    assert (years[q.answer] > years[other]) == later


def test_sft_selection_fills_each_family_share_first():
    from types import SimpleNamespace

    def traj(source, i, tokens=100):
        question = SimpleNamespace(source=source, kind=f"k{i % 3}")
        return SimpleNamespace(question=question, tokens=tokens, visits=i % 2)

    pool = [traj("wiki-single-hop", i) for i in range(200)]
    pool += [traj("wiki-described", i) for i in range(30)] + [traj(COMPARISON, i) for i in range(5)]
    mix = {"wiki-described": 0.5, COMPARISON: 0.2, "wiki-single-hop": 0.3}
    chosen = select_sft(pool, 4_000, mix, random.Random(0))
    by = [t.question.source for t in chosen]
    assert sum(t.tokens for t in chosen) == 4_000
    assert by.count(COMPARISON) == 5  # all there were
    # each family's share first; the 300 tokens comparisons left, round-robin
    assert by.count("wiki-described") >= 20 and by.count("wiki-single-hop") >= 12
    assert by.count("wiki-described") + by.count("wiki-single-hop") == 35
    assert len({id(t) for t in chosen}) == len(chosen)


def test_name_after_skips_descriptors():
    text = "Carmen is an opera by the French composer Georges Bizet. The libretto"
    assert name_after(text, text.index("by ") + 3) == "Georges Bizet"
    assert name_after("born in Pisa, Italy", len("born in ")) == "Pisa"


def test_question_query_fits_the_embedded_grammar():
    q = question_query("who was the father of the founder of psychoanalysis and what was "
                       "his job in vienna?", 60)
    assert len(q) <= 60 and q[0].isupper() and "?" not in q
    assert q == "Father founder psychoanalysis job vienna"
    assert question_query("What is 2+2?") == "2 2"
    assert question_query("Which river flows through the capital of Hungary?") == \
        "River flows through capital Hungary"
    assert question_query("Who is he?") == ""


# --- the teacher ------------------------------------------------------------------------------


def _solve(questions):
    return asyncio.run(run_teacher(teacher(), questions, concurrency=4))


@cache
def solved_sample():
    train = sample(lambda q: q.split == "train-sft" and q.hops == 1, 24, seed=1)
    train += sample(lambda q: q.split == "train-sft" and q.source == "wiki-two-hop", 12, seed=2)
    train += sample(lambda q: q.split == "train-sft" and q.source == COMPARISON, 8, seed=3)
    train += sample(lambda q: q.split == "train-sft" and q.source == YES_NO, 8, seed=4)
    solved, drops = _solve(train)
    return train, solved, drops


def test_teacher_turns_pass_the_protocol_format_check():
    train, solved, drops = solved_sample()
    assert len(solved) >= 0.7 * len(train), drops
    for traj in solved.values():
        msgs = traj.messages
        assert msgs[0] == {"role": "system", "content": SYSTEM}
        assert msgs[1] == {"role": "user", "content": traj.question.question}
        assistants = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
        for i in assistants:
            assert protocol.check_turn_format(msgs[i]["content"], i == len(msgs) - 1)
        for m in msgs[2:]:
            if m["role"] == "user":
                assert protocol.classify_tool_response(m["content"]) in ("search", "visit")
        first = protocol.parse_turn(msgs[2]["content"]).tool_call
        assert first is not None and first.name == "search"
        final = protocol.parse_turn(msgs[-1]["content"])
        assert final.kind == "answer"
        assert normalize_answer(final.answer) == normalize_answer(traj.question.answer)
        assert set(traj.sources) <= set(traj.question.gold_titles)
        assert not any(is_reserved(s) for s in traj.sources)


def test_teacher_tool_responses_are_the_live_toolbox_bytes():
    from drvenus.config import load_settings
    from drvenus.stack import build_toolbox

    _, solved, _ = solved_sample()
    fresh = build_toolbox(load_settings(search="local", visit="local"))

    async def check():
        n = 0
        for traj in solved.values():
            for call, message in tool_response_bodies(traj.messages):
                assert protocol.wrap_tool_response(await fresh.call(call)) == message
                n += 1
        return n

    assert asyncio.run(check()) >= len(solved)


def test_teacher_turns_are_in_the_embedded_grammar():
    from drvenus.small.grammar import grammar_for_kind
    from drvenus.small.levers import EMBEDDED_LEVERS
    from gbnf import Grammar

    grammar = Grammar(grammar_for_kind("any", levers=EMBEDDED_LEVERS))
    _, solved, _ = solved_sample()
    turns = [m["content"] for t in list(solved.values())[:6] for m in t.messages
             if m["role"] == "assistant"]
    assert turns and all(grammar.accepts(t) for t in turns)
    # each turn in the grammar the agent decodes it with, built from the conversation before
    # it: the first search asks the question's words, the answer is a span of what was read,
    # of the shape the question asks for
    # (the reader's pick on plain questions aside: the teacher answers with the gold span,
    # which the reader may rank second; the model learns the answer, the reader then chooses)
    # (and the second hop aside: its query and the answer after it are the grammar's, chosen
    # by the reader and the reranker; the teacher's second search is its own)
    # (and the first search's thought aside: the grammar writes that turn whole, without one)
    options = EMBEDDED_LEVERS.but(span_rank=0, bridge_search="off", forced_think_chars=None)
    checked = 0
    for traj in list(solved.values())[:8]:
        msgs = traj.messages
        for i, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            kind = "search" if i == 2 else "any"
            turn_grammar = Grammar(grammar_for_kind(kind, False, msgs[:i], options))
            assert turn_grammar.accepts(m["content"]), (traj.question.question, m["content"])
            checked += 1
    assert checked >= 8


def test_a_second_hop_focuses_on_what_the_first_did_not_answer():
    """The embedded answer focus on a real two-hop reading: once the first search has shown
    that "the country whose capital is Tegucigalpa" is Honduras, the sentences kept of the
    second search are those about "bordered to the west", not the capital again."""
    from drvenus.protocol.state import TurnState
    from drvenus.small.spans import focus_sentences, span_sources

    question = ("The country or region whose capital is Tegucigalpa is bordered to the west by "
                "whom?")
    messages = [{"role": "user", "content": question}]
    for query in (question_query(question), "Honduras"):
        body = asyncio.run(toolbox().call(protocol.ToolCall(protocol.SEARCH,
                                                            {"query": [query]})))
        messages.append({"role": "user", "content": protocol.wrap_tool_response(body)})
    focus = focus_sentences(span_sources(TurnState.of(messages)), question, 3)
    assert any(s.startswith("It is bordered to the west by Guatemala") for s in focus), focus


def test_teacher_drops_what_it_cannot_find():
    art = by_title()[next(q.gold_titles[0] for q in question_sets() if q.split == "train-sft")]
    q = Question(id="x", question=f"What is the secret motto of {art.title}?",
                 answer="Zyxwv unfindable", aliases=[], kind="birth_year", hops=1,
                 gold_titles=[art.title], bucket="train", split="train-sft",
                 source="wiki-single-hop", subject=art.title)
    traj, why = asyncio.run(teacher().solve(q))
    assert traj is None and why == "answer_not_found"


# --- distant supervision and the files ---------------------------------------------------------


def test_mix_rows_are_bucketed_by_the_article_holding_the_answer(shared_data):
    import pyarrow.parquet as pq

    rows = pq.read_table(shared_data / "qa" / "deepresearcher-mix-test.parquet").to_pylist()[:150]
    by_url = {a.url: a for a in articles()}
    questions, why = asyncio.run(mix_questions(rows, toolbox(), by_url))
    assert why["kept"] == len(questions) > 0
    for q in questions:
        holders = [by_title()[t] for t in q.gold_titles]
        assert find_span(holders[0].text, q.answer) is not None
        assert all(any(find_span(a.text, x) for x in [q.answer, *q.aliases]) for a in holders)
        assert all(title_overlaps(a.title, q.question) for a in holders)
        assert not contains_answer(q.question, q.answer)
        assert q.bucket == ("reserved" if all(a.reserved for a in holders) else "train")
        if q.bucket == "train":
            assert not any(a.reserved for a in holders)


def test_end_to_end_teacher_then_clean_with_the_correctness_filter(tmp_path):
    from drvenus.data.pipeline import CleanOptions, run_clean

    train, solved, _ = solved_sample()
    rows = [solved[q.id].raw_row() for q in train if q.id in solved]
    raw = tmp_path / "raw.jsonl"
    write_jsonl(raw, rows)
    stats = run_clean(CleanOptions(input=raw, output_dir=tmp_path / "clean", correctness="em",
                                   strict_format=True, current_date="2026-12-01", workers=1))
    assert stats["rows"]["source"] == len(rows)
    assert stats["rows"]["stage3_correct"] == len(rows)  # every teacher answer is correct
    assert stats["rows"]["final_resampled"] == len(rows)
    import pyarrow.parquet as pq

    cleaned = pq.read_table(tmp_path / "clean" / "cleaned_resampled.parquet").to_pylist()
    assert cleaned[0]["messages"][0]["content"] == SYSTEM  # the template is the same prompt


def test_rl_and_eval_rows_are_read_by_the_trainer_and_eval(tmp_path):
    from drvenus.eval.benchmarks import load
    from drvenus.train.rl.questions import question_rows

    qs = sample(lambda q: q.split == "train-rl", 5) + sample(lambda q: q.split == "test", 5)
    write_jsonl(tmp_path / "rl.jsonl", (rl_row(q) for q in qs[:5]))
    write_jsonl(tmp_path / "test.jsonl", (eval_row(q) for q in qs[5:]))
    assert question_rows(tmp_path / "rl.jsonl") == [(q.question, q.ground_truth) for q in qs[:5]]
    items = load("jsonl", tmp_path / "test.jsonl")
    assert [i.question for i in items] == [q.question for q in qs[5:]]
    assert [i.answer for i in items] == [q.answer for q in qs[5:]]
    assert json.loads((tmp_path / "test.jsonl").read_text().splitlines()[0])["id"] == qs[5].id


def test_build_config_defaults_fit_the_brief():
    cfg = BuildConfig(out=__import__("pathlib").Path("x"))
    assert cfg.max_tokens <= 2048 and 1_000_000 <= cfg.sft_tokens <= 1_500_000
    assert abs(sum(cfg.sft_mix.values()) - 1) < 1e-9

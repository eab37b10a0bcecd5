"""The span reader (drvenus.small.reader): its candidates, its ranking with the shipped
weights, its place in the answer grammar, and the fit of recipes/embedded/train_reader.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from drvenus.protocol import wrap_tool_response
from drvenus.small.grammar import grammar_for_kind
from drvenus.small.reader import FEATURES, WEIGHTS, candidates, rank_spans
from drvenus.small.spans import clause_words, question_words

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recipes" / "embedded"))
from train_reader import accuracy, fit, norm  # noqa: E402

from gbnf import Grammar  # noqa: E402

SKI = (
    "Ski jumping\n"
    "...winter sport in which competitors aim to achieve the farthest jump after sliding down "
    "on their skis from a specially designed curved ramp. Ski jumping was first contested in "
    "Norway in the late 19th century, and later spread throughout Europe and North America.\n"
    "Alpine skiing\n"
    "Sport of skiing downhill. Alpine skiing is the pastime of sliding down snow-covered slopes."
)


def search_messages(question: str, hits: list[tuple[str, str]]) -> list[dict[str, str]]:
    body = json.dumps([{"query": question, "web_page_info_list": [
        {"title": t, "url": f"https://en.wikipedia.org/wiki/{t.replace(' ', '_')}", "snippet": s}
        for t, s in hits]}])
    call = '<think>\nx\n</think>\n<tool_call>\n{"name": "search", "arguments": {"query": ["q"]}}' \
           "\n</tool_call>"
    return [{"role": "user", "content": question}, {"role": "assistant", "content": call},
            {"role": "user", "content": wrap_tool_response(body)}]


def test_the_shipped_weights_name_every_feature_and_rank_the_framed_name_first():
    assert set(WEIGHTS) == set(FEATURES) and any(WEIGHTS.values())
    best = rank_spans([SKI], "In which country was the winter sport of skiing down a curved "
                             "ramp and leaping as far as possible first contested?", 3)
    assert best[0].text == "Norway"
    assert len({b.words for b in best}) == len(best) <= 3
    assert best == sorted(best, key=lambda b: -b.score)


def test_candidates_leave_out_question_words_and_never_cross_a_clause():
    question = "Which novel did Bram Stoker write in 1897?"
    found = candidates(["Dracula is an 1897 novel by Bram Stoker, an Irish author."], question)
    spans = {" ".join(w) for w, _ in found}
    assert "Dracula" in spans and "Irish author" in spans
    assert not any(w.lower() in ("stoker", "novel", "1897") for s in spans for w in s.split())
    assert not any("," in s for s in spans)
    for _, features in found:
        assert set(features) == set(FEATURES)


def test_a_number_question_ranks_numbers_only_when_there_are_any():
    text = "The Sikh Gurus\nGuru Nanak was the first of the ten Sikh Gurus, born in Talwandi."
    best = rank_spans([text], "The founder of Sikhism was the first of how many Sikh Gurus?", 2)
    assert best[0].text == "ten"
    assert rank_spans(["Nothing numeric here at all."], "How many moons?", 1)  # never empty


def _features(texts: list[str], question: str) -> dict[str, dict[str, float]]:
    return {" ".join(w): f for w, f in candidates(texts, question)}


def test_the_span_where_the_wh_phrase_stands_aligns_with_the_question():
    mermaid = ("Mermaid\nIn folklore, a mermaid is an aquatic creature with the head and upper "
               "body of a female human and the tail of a fish.")
    question = "The legendary sea creature with the head of a woman has the tail of what animal?"
    f = _features([mermaid], question)
    # "the tail of [what animal]" / "the tail of a [fish]": the article is skipped
    # ... and of the question's last four content words before it, "tail" is right there
    assert f["fish"]["wh_prev_word"] == 1.0 and f["fish"]["wh_left"] == 0.25
    assert f["female human"]["wh_prev_word"] == 1.0  # "body of a" -> "of" too
    assert f["female human"]["wh_left"] < f["fish"]["wh_left"]
    assert f["folklore"]["wh_prev_word"] == 0.0 and f["folklore"]["wh_left"] == 0.0
    assert f["fish"]["window_match"] > 0.0
    assert "In" not in f  # stopwords alone are never an answer


def test_a_question_without_a_wh_word_has_no_alignment():
    f = _features(["Dracula is an 1897 novel by Bram Stoker."], "Name the author of Dracula.")
    assert all(v["wh_prev_word"] == v["wh_left"] == v["wh_right"] == 0.0 for v in f.values())


def test_the_words_after_the_wh_phrase_align_after_the_span():
    text = "It is the oldest form of music, and the human voice can be considered the first " \
           "musical instrument by some."
    f = _features([text], "What do some people consider the very first musical instrument?")
    assert f["human voice"]["wh_right"] > 0.0
    assert f["oldest form"]["wh_right"] == 0.0


def _answers(grammar: Grammar, texts: list[str]) -> set[str]:
    return {t for t in texts
            if grammar.accepts(f"<think>\nok\n</think>\n<answer>\n{t}\n</answer>")}


def test_a_plain_question_answers_with_the_ranked_spans_whole_and_a_name_question_not():
    snippet = SKI.split("\n")[1]
    tries = ["Norway", "Europe", "North America", "Ski jumping", "late 19th century", "Norway in"]
    # a plain "what" question: one of the reader's two best spans, whole
    plain = "What was first contested in the late 19th century, a winter sport on skis?"
    messages = search_messages(plain, [("Ski jumping", snippet)])
    grammar = Grammar(grammar_for_kind("answer", messages=messages, span_answers=True,
                                       span_rank=2, span_words=8))
    best = {b.text for b in rank_spans([f"Ski jumping\n{snippet}"], plain, 2)}
    assert _answers(grammar, [*best, *tries]) == best
    # "in which country": the answer shape narrows it; the reader is not asked
    named = "In which country was ski jumping first contested?"
    messages = search_messages(named, [("Ski jumping", snippet)])
    ranked = Grammar(grammar_for_kind("answer", messages=messages, span_answers=True,
                                      span_rank=2, span_words=8))
    unranked = Grammar(grammar_for_kind("answer", messages=messages, span_answers=True,
                                        span_words=8))
    assert _answers(ranked, tries) == _answers(unranked, tries) and len(_answers(ranked, tries)) > 2


_WORDS = st.sampled_from("the Nile river flows in Egypt 1897 ten was born Paris , . ( ) "
                         "of Museum Louvre novel by Stoker who what".split(" "))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(_WORDS, max_size=30).map(" ".join), max_size=4),
       st.lists(_WORDS, min_size=1, max_size=12).map(" ".join), st.integers(1, 5))
def test_ranked_spans_are_word_runs_of_the_texts_without_the_question(texts, question, k):
    best = rank_spans(texts, question + "?", k)
    assert len(best) <= k
    exclude = question_words(question + "?")
    runs = [tuple(c) for t in texts for c in clause_words(t, exclude)]
    for b in best:
        assert 1 <= len(b.words) <= 8
        assert any(b.words == run[i:i + len(b.words)] for run in runs
                   for i in range(len(run))), b


def test_fit_learns_the_feature_that_marks_the_gold():
    rng = np.random.default_rng(0)
    lists = []
    for _ in range(240):
        x = rng.normal(size=(12, len(FEATURES)))
        y = np.zeros(12, bool)
        gold = int(rng.integers(12))
        x[gold, FEATURES.index("near")] += 3.0
        y[gold] = True
        lists.append((x, y))
    w = fit(lists[:200], 1e-3, steps=200)
    assert w[FEATURES.index("near")] == max(w)
    assert accuracy(lists[200:], w, 1) > 0.8
    assert accuracy(lists[200:], np.zeros(len(FEATURES)), 1) < 0.5
    assert accuracy([(np.zeros((0, len(FEATURES))), np.zeros(0, bool))], w, 1) == 0.0


def test_norm_folds_case_accents_punctuation_and_articles():
    assert norm("The Élysée  Palace!") == norm("elysee palace") == "elysee palace"

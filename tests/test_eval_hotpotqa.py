"""HotpotQA as published (``--benchmark hotpotqa``): the official JSON layout read into items and
a distractor corpus, HotpotQA's EM / F1 rules, the wrong-file errors, and a scripted end-to-end
``drvenus eval`` whose report shows EM and F1 with their intervals."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from pathlib import Path

import pytest

from drvenus.corpus.urls import wikipedia_url
from drvenus.eval import benchmarks as bm
from drvenus.eval.judges import grade
from drvenus.eval.metrics import RunResult, summarize
from drvenus.eval.report import build_report, render_markdown
from drvenus.grading.judge import JudgeClient, JudgeConfig
from drvenus.grading.match import HOTPOTQA, SQUAD, exact_match, f1_score
from drvenus.protocol import ANSWER_SPLIT, build_system_prompt, initial_messages, wrap_tool_response
from drvenus.small.grammar import grammar_for_kind
from drvenus.small.levers import EMBEDDED_LEVERS
from drvenus.small.spans import answer_shape
from gbnf import Grammar
from helpers.cli import drvenus_eval as drvenus
from scripted import answer, call
from stub_server import StubServer

# the embedded preset's levers with the linear reader: these tests read the spans a grammar
# admits, which the linear reader's language lists (the neural one admits its best spans only)
LINEAR_LEVERS = EMBEDDED_LEVERS.but(span_reader="linear", span_rerank=0)

EIFFEL = ["The Eiffel Tower is a wrought-iron lattice tower in Paris.",
          " It was built by the company of Gustave Eiffel."]
BIG_BEN = ["Big Ben is the nickname of the Great Bell in London."]
GUSTAVE = ["Gustave Eiffel was a French civil engineer."]
GUSTAVE_OTHER = ["Gustave Eiffel (1832-1923) built bridges", " and the Eiffel Tower."]

TINY = [
    {"_id": "5a8b0001", "question": "In which city is the tower built by Gustave Eiffel's company?",
     "answer": "Paris", "type": "bridge", "level": "medium",
     "supporting_facts": [["Eiffel Tower", 0], ["Gustave Eiffel", 0], ["Eiffel Tower", 1]],
     "context": [["Eiffel Tower", EIFFEL], ["Big Ben", BIG_BEN], ["Gustave Eiffel", GUSTAVE]]},
    {"_id": "5a8b0002", "question": "Are the Eiffel Tower and Big Ben both in France?",
     "answer": "no", "type": "comparison", "level": "easy",
     "supporting_facts": [["Eiffel Tower", 0], ["Big Ben", 0]],
     "context": [["Big Ben", BIG_BEN], ["Eiffel Tower", EIFFEL],
                 ["Gustave Eiffel", GUSTAVE_OTHER]]},
]
IRCOT_ROW = {"question_id": "q1", "question_text": "Who?",
             "answers_objects": [{"spans": ["Paris"]}],
             "contexts": [{"title": "Eiffel Tower", "paragraph_text": "".join(EIFFEL),
                           "is_supporting": True}]}


@pytest.fixture()
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    return path


# ---------------------------------------------------------------------------- loading, corpus
def test_official_items_ids_meta_and_gold_urls(tiny):
    q1, q2 = bm.load("hotpotqa", tiny)
    assert [q1.id, q2.id] == ["5a8b0001", "5a8b0002"]
    assert (q1.question, q1.answers, q2.answers) == (TINY[0]["question"], ["Paris"], ["no"])
    assert (q1.meta["type"], q1.meta["level"], q2.meta["type"]) == ("bridge", "medium",
                                                                     "comparison")
    # the supporting titles' paragraphs (a title named twice counts once)
    assert q1.meta["gold_urls"] == [wikipedia_url("Eiffel Tower"), wikipedia_url("Gustave Eiffel")]
    assert q2.meta["gold_urls"] == [wikipedia_url("Big Ben"), wikipedia_url("Eiffel Tower")]
    assert bm.get_spec("hotpotqa").grader == "hotpotqa"


def test_official_corpus_one_document_per_paragraph_deduplicated(tiny):
    docs = list(bm.hotpotqa_official_corpus(tiny))
    assert [(d["title"], d["text"]) for d in docs] == [
        ("Eiffel Tower", "".join(EIFFEL)), ("Big Ben", "".join(BIG_BEN)),
        ("Gustave Eiffel", "".join(GUSTAVE)), ("Gustave Eiffel", "".join(GUSTAVE_OTHER))]
    # sentences concatenated as given: their own leading spaces, nothing added
    assert docs[0]["text"] == ("The Eiffel Tower is a wrought-iron lattice tower in Paris. It was "
                               "built by the company of Gustave Eiffel.")
    # the hotpotqa-paragraphs URL scheme: the title's article, a pseudo URL for another paragraph
    assert [d["url"] for d in docs[:3]] == [wikipedia_url(t) for t in
                                            ("Eiffel Tower", "Big Ben", "Gustave Eiffel")]
    assert docs[3]["url"] == f"https://{bm.HOTPOT_CORPUS}.corpus.local/doc/{docs[3]['id']}"
    assert len({d["id"] for d in docs}) == 4


def test_the_test_set_without_answers_loads(tmp_path, caplog):
    rows = [{"_id": r["_id"], "question": r["question"], "context": r["context"]} for r in TINY]
    path = tmp_path / "hotpot_test_fullwiki.json"
    path.write_text(json.dumps(rows))
    items = bm.load("hotpotqa", path)
    assert [(i.id, i.answers, i.meta) for i in items] == [("5a8b0001", [], {"gold_urls": []}),
                                                          ("5a8b0002", [], {"gold_urls": []})]
    assert "2 question(s) without an answer" in caplog.text
    assert len(list(bm.hotpotqa_official_corpus(path))) == 4


def test_malformed_context_entries_are_skipped(tmp_path):
    row = {**TINY[0], "context": [["Eiffel Tower", EIFFEL], {"title": "x"}, ["Big Ben"], "text"],
           "supporting_facts": [["Eiffel Tower", 0], "Big Ben"]}
    path = tmp_path / "odd.json"
    path.write_text(json.dumps([row]))
    (item,) = bm.load("hotpotqa", path)
    assert item.meta["gold_urls"] == [wikipedia_url("Eiffel Tower")]
    assert [d["title"] for d in bm.hotpotqa_official_corpus(path)] == ["Eiffel Tower"]


def _sentences(text: str) -> list[str]:
    """A crude sentence split that keeps every character: each sentence after the first keeps
    the spaces before it, as HotpotQA's sentences do."""
    return [s for s in re.split(r"(?<=[.!?])(?=\s)", text) if s]


def _to_official(row: dict) -> dict:
    spans = [s for a in row["answers_objects"] for s in a["spans"]]
    return {
        "_id": row["question_id"], "question": row["question_text"], "answer": spans[0],
        "type": "comparison" if spans[0].lower() in ("yes", "no") else "bridge", "level": "hard",
        "supporting_facts": [[c["title"], 0] for c in row["contexts"] if c["is_supporting"]],
        "context": [[c["title"], _sentences(c["paragraph_text"])] for c in row["contexts"]],
    }


def test_official_layout_of_the_shared_dev_questions_matches_the_ircot_file(shared_data,
                                                                            tmp_path):
    lines = (shared_data / "qa" / "hotpotqa-dev-500-with-paragraphs.jsonl").read_text(
        encoding="utf-8").splitlines()
    ircot = tmp_path / "dev.jsonl"
    ircot.write_text("\n".join(lines) + "\n", encoding="utf-8")
    official = tmp_path / "dev.json"
    official.write_text(json.dumps([_to_official(json.loads(x)) for x in lines]), encoding="utf-8")

    a, b = bm.load("hotpotqa-paragraphs", ircot), bm.load("hotpotqa", official)
    assert [i.id for i in b] == [json.loads(x)["question_id"] for x in lines]
    assert [(i.id, i.question, i.answer, i.meta["gold_urls"]) for i in a] == \
        [(i.id, i.question, i.answer, i.meta["gold_urls"]) for i in b]
    assert sum(i.answer in ("yes", "no") for i in b) > 20
    # one corpus builder: the same documents, ids and URLs from either layout
    docs = list(bm.hotpotqa_official_corpus(official))
    assert docs == list(bm.hotpotqa_corpus(ircot))
    assert len(docs) == 4858 and len({d["url"] for d in docs}) == len(docs)


# ---------------------------------------------------------------------------- wrong files
def test_a_file_of_the_other_layout_is_one_error_naming_the_reader(tmp_path, tiny):
    ircot = tmp_path / "dev.jsonl"
    ircot.write_text(json.dumps(IRCOT_ROW) + "\n")
    with pytest.raises(ValueError, match="IRCoT-style HotpotQA JSONL") as got:
        bm.load("hotpotqa", ircot)
    assert str(ircot) in str(got.value) and "--benchmark hotpotqa-paragraphs" in str(got.value)
    with pytest.raises(ValueError, match="HotpotQA's official JSON") as got:
        bm.load("hotpotqa-paragraphs", tiny)
    assert str(tiny) in str(got.value) and str(got.value).endswith("--benchmark hotpotqa")
    plain = tmp_path / "qa.jsonl"
    plain.write_text(json.dumps({"question": "Who?", "answer": "Paris"}) + "\n")
    with pytest.raises(ValueError, match="is not HotpotQA's official JSON"):
        bm.load("hotpotqa", plain)
    with pytest.raises(ValueError, match="is not IRCoT-style"):
        list(bm.hotpotqa_corpus(plain))
    assert len(bm.load("hotpotqa-paragraphs", ircot)) == 1  # the right reader still reads it


def test_cli_wrong_file_is_one_line_exit_2(tmp_path, tiny):
    ircot = tmp_path / "dev.jsonl"
    ircot.write_text(json.dumps(IRCOT_ROW) + "\n")
    for benchmark, data, reader in (("hotpotqa", ircot, "hotpotqa-paragraphs"),
                                    ("hotpotqa-paragraphs", tiny, "hotpotqa")):
        r = drvenus("eval", "--benchmark", benchmark, "--data", str(data), "--out",
                    str(tmp_path / "out"))
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert r.returncode == 2 and len(lines) == 1, r.stderr
        assert str(data) in lines[0] and f"--benchmark {reader}" in lines[0]
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------- EM / F1 rules
@pytest.mark.parametrize(("prediction", "gold", "em", "f1"), [
    ("No.", "no", True, 1.0),
    ("The yes", "yes", True, 1.0),                   # articles go before the comparison
    ("yes it is", "yes", False, 0.0),                # a closed answer: no partial credit
    ("no", "no way", False, 0.0),                    # either side closed counts
    ("noanswer", "no answer", False, 0.0),
    ("the Eiffel Tower", "Eiffel Tower", True, 1.0),
    ("an apple, a pear", "apple pear", True, 1.0),
    ("Paris, France!", "paris   france", True, 1.0),  # punctuation, case, white space
    ("Paris France", "Paris", False, 2 / 3),
    ("Gustave", f"Alexandre Gustave Eiffel{ANSWER_SPLIT}Gustave", True, 1.0),
    ("", "", True, 0.0),                              # HotpotQA: no shared token, no F1
])
def test_hotpotqa_em_and_f1(prediction, gold, em, f1):
    assert exact_match(prediction, gold) is em
    assert f1_score(prediction, gold, HOTPOTQA) == pytest.approx(f1)


def test_squad_rules_unchanged():
    assert f1_score("yes it is", "yes") == pytest.approx(0.5)
    assert f1_score("", "", SQUAD) == 1.0 and f1_score("x", "") == 0.0


def test_hotpotqa_grader_keeps_em_and_f1(tiny):
    q1, q2 = bm.load("hotpotqa", tiny)
    yes_no = asyncio.run(grade("hotpotqa", q2, "No."))
    assert (yes_no.correct, yes_no.exact, yes_no.score) == (True, True, 1.0)
    long = asyncio.run(grade("hotpotqa", q2, "No, only the Eiffel Tower is"))
    assert (long.correct, long.exact, long.score) == (False, False, 0.0)
    assert asyncio.run(grade("qa", q2, "No, only the Eiffel Tower is")).score > 0  # SQuAD's
    partial = asyncio.run(grade("hotpotqa", q1, "Paris, France"))
    assert (partial.correct, partial.exact) == (False, False)
    assert partial.score == pytest.approx(2 / 3)
    assert partial.to_dict()["exact"] is False


def test_with_a_judge_em_stays_apart_from_the_verdict(tiny, tmp_path):
    q1, _ = bm.load("hotpotqa", tiny)
    with StubServer([], default="reasoning: the same city.\ncorrect: yes") as server:
        judge = JudgeClient(JudgeConfig(base_url=server.base_url, model="judge", retries=1,
                                        timeout_s=10, cache_path=tmp_path / "cache.sqlite"))

        async def go():
            try:
                return await grade("hotpotqa", q1, "Paris, France", judge)
            finally:
                await judge.aclose()

        graded = asyncio.run(go())
    assert (graded.correct, graded.method, graded.exact) == (True, "judge", False)
    assert graded.score == pytest.approx(2 / 3)


def test_report_shows_em_and_f1_with_intervals():
    rows = [RunResult(f"q{i}", run, correct=ok, score=score, grade={"exact": ok})
            for i, (ok, score) in enumerate([(True, 1.0), (False, 0.5), (False, 0.0),
                                             (True, 1.0)]) for run in (0, 1)]
    m = summarize(rows)["exact_f1"]
    assert (m["items"], m["em"], m["f1"]) == (4, 0.5, 0.625)
    assert m["em_ci95"][0] < 0.5 < m["em_ci95"][1] and m["f1_ci95"][0] < 0.625 < m["f1_ci95"][1]
    md = render_markdown(build_report({"benchmark": "hotpotqa", "items": 4, "runs": 2}, rows,
                                      "hotpotqa", None))
    assert "| Exact match (EM), 95% interval | 50.0% (" in md and "| F1, 95% interval | 0.625 (" in md
    assert "HotpotQA's official exact match" in md
    assert summarize([RunResult("q", 0, True, score=1.0)])["exact_f1"] is None


# ---------------------------------------------------------------------------- yes / no answers
@pytest.mark.parametrize(("question", "yes_no"), [
    ("Are the Eiffel Tower and Big Ben both in France?", True),
    ("Were Scott Derrickson and Ed Wood of the same nationality?", True),
    ("  did Gustave Eiffel build bridges?", True),
    ("Which tower is older, the Eiffel Tower or Big Ben?", False),
    ("Who built the Eiffel Tower?", False),
    ("Isaac Newton was born in which year?", False),
    ("", False),
])
def test_yes_no_questions(question, yes_no):
    assert answer_shape(question).yes_no is yes_no


def _read(question: str) -> list[dict]:
    hits = [{"title": "Eiffel Tower", "url": wikipedia_url("Eiffel Tower"),
             "snippet": "".join(EIFFEL)}]
    return [*initial_messages(question, build_system_prompt("2025-01-01")),
            {"role": "user", "content": wrap_tool_response(json.dumps(
                [{"query": "Eiffel Tower", "web_page_info_list": hits}]))}]


def test_a_grounded_answer_is_yes_or_no_to_a_yes_no_question():
    """The embedded model's answer is a span of what it read; no span says "no", so a yes/no
    question is answered yes or no (and only such a question)."""
    def accepts(question: str, body: str) -> bool:
        grammar = grammar_for_kind("answer", False, _read(question), LINEAR_LEVERS)
        return Grammar(grammar).accepts(f"<think>\n\n</think>\n<answer>\n{body}\n</answer>")

    comparison = "Are the Eiffel Tower and Big Ben both in France?"
    for body in ("no", "yes"):
        assert accepts(comparison, body), body
    for body in ("no way", "maybe", "Gustave Eiffel"):
        assert not accepts(comparison, body), body
    assert accepts("Who built the Eiffel Tower?", "Gustave Eiffel")
    assert not accepts("Who built the Eiffel Tower?", "no")


@pytest.mark.slow
def test_llama_cpp_samples_the_yes_no_grammar(embedded_gguf):
    from drvenus.llm.llamacpp import LlamaCppServer

    grammar = grammar_for_kind("answer", False, _read("Is the Eiffel Tower in Paris?"),
                               LINEAR_LEVERS)
    server = LlamaCppServer(embedded_gguf, window=1024, n_threads=1)
    try:
        reply = server.chat({"messages": [{"role": "user", "content": "Hi"}], "grammar": grammar,
                             "max_tokens": 200, "temperature": 0.0}, threading.Event())
    finally:
        server.close()
    assert "error" not in reply, reply
    assert "<answer>" in reply["choices"][0]["message"]["content"]


# ---------------------------------------------------------------------------- end to end
def _agent(request) -> str:
    """Search once, then answer: "No" to the yes/no question, a longer span to the other."""
    messages = request.json["messages"]
    question = next(m["content"] for m in messages if m["role"] == "user")
    if len(messages) <= 2:
        return call("search", query=["Eiffel Tower"])
    return answer("no" if "both in France" in question else "Paris, France")


def test_eval_hotpotqa_end_to_end(tmp_path, tiny):
    out = tmp_path / "run"
    with StubServer([], default=_agent) as server:
        r = drvenus("eval", "--benchmark", "hotpotqa", "--data", str(tiny), "--out", str(out),
                    "--runs", "1", "--workers", "1", "--base-url", server.base_url,
                    "--model-name", "stub")
    assert r.returncode == 0, r.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["grader"] == "hotpotqa" and set(report["items"]) == {"5a8b0001", "5a8b0002"}
    m = report["metrics"]
    assert m["avg_at_k"] == 0.5 and m["exact_f1"]["em"] == 0.5
    assert m["exact_f1"]["f1"] == pytest.approx((1 + 2 / 3) / 2)
    assert set(m["per_level"]) == {"easy", "medium"}
    assert m["recall"]["retrieved"] is not None and m["cost_all"]["search_calls"] == 1
    corpus = [json.loads(x) for x in (out / "corpus.jsonl").read_text().splitlines()]
    assert len(corpus) == 4
    assert "Exact match (EM), 95% interval" in r.stdout

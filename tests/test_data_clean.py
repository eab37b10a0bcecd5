r"""drvenus data clean: stages, drop reasons, resampling, reference equivalence, judge, CLI.

Golden values (REFERENCE_*) and how to regenerate them
======================================================

They are DR-Venus's own output, never this repository's: ``SFT/data_clean/prepare_trajectories.py``
of https://github.com/inclusionAI/DR-Venus at commit 6dfa2c2
(6dfa2c24785ff057687b1c3641adba2b2c60bcc6), run unmodified in a scratch virtualenv on the input
``build_reference_input()`` writes. From the project root, with ../shared/data present and the
project's dev virtualenv as ``python``::

    python3 -m venv /tmp/drvenus-ref
    /tmp/drvenus-ref/bin/pip install pandas pyarrow numpy json5
    git clone https://github.com/inclusionAI/DR-Venus /tmp/DR-Venus
    git -C /tmp/DR-Venus checkout 6dfa2c2
    S=/tmp/DR-Venus/SFT/data_clean/prepare_trajectories.py
    python tests/data_fixtures.py build-reference-input /tmp/ref-in
    /tmp/drvenus-ref/bin/python $S --input /tmp/ref-in --output-dir /tmp/ref-out \
        --current-date 2026-03-01
    /tmp/drvenus-ref/bin/python $S --input /tmp/ref-in --output-dir /tmp/ref-shuffled \
        --current-date 2026-03-01 --shuffle --seed 42 --keep-metadata
    python tests/data_fixtures.py reference-values /tmp/ref-out /tmp/ref-shuffled

The last command prints the four REFERENCE_* constants below, ready to paste. (Last checked with
pandas 3.1.1, numpy 2.4.6, pyarrow 26.0.1.) The script's system prompt is not ours, so the row
digest leaves out ``messages[0]``; ``--current-date`` changes nothing after it.

Tests that need the shared trajectories take the ``shared_data`` fixture (tests/conftest.py):
without ../shared/data they are skipped, with the reason shown in pytest's summary.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from data_fixtures import (
    JudgeStub,
    build_reference_input,
    load_trajectories,
    raw_row,
    rows_digest,
    serper_markdown,
    write_clean_parquet,
    write_raw_parquet,
)
from drvenus.cli.data import data_app
from drvenus.data.normalize import clean_answer_turn, clean_tool_call_turn, normalize_row
from drvenus.data.options import CleanOptions
from drvenus.data.pipeline import run_clean
from drvenus.data.plan import NothingReadError
from drvenus.data.resample import ResamplePolicy
from drvenus.data.shuffle import legacy_permutation
from drvenus.data.stages import (
    drop_duplicate_tool_calls,
    prune_disallowed_tools,
    validate_messages,
)
from drvenus.grading.judge import JudgeConfig
from drvenus.grading.match import exact_match, f1_score, normalize_answer
from drvenus.protocol import parse_search_body, unwrap_tool_response
from drvenus.protocol.legacy import (
    ANSWER_RE,
    THINK_RE,
    TagBlock,
    parse_serper_lines,
    parse_serper_markdown,
    serper_hits,
)
from drvenus.protocol.render import render_search, render_search_hits

# From prepare_trajectories.py on build_reference_input() (see the module docstring).
REFERENCE_STATS = {
    "rows": {"source": 32, "stage1_normalized": 27, "stage2_valid": 16, "final_resampled": 21},
    "pruned_tool_turns_removed": 5,
    "pruned_tool_response_turns_removed": 5,
    "pruned_tool_name_counts": {"google_scholar": 5},
    "duplicate_tool_turns_removed": 10,
    "drop_reasons": {
        "missing_question_or_gt": 2, "raw_clean_failed": 2, "too_short": 2,
        "first_user_contains_tool_response": 1, "clean_input_invalid": 1,
        "assistant_missing_tool_call": 1, "assistant_tool_turn_contains_answer": 1,
        "assistant_missing_think": 1, "user_missing_tool_response_at_3": 1,
        "final_assistant_missing_answer": 1, "bad_role_at_2": 1,
        "final_assistant_contains_tool": 1, "non_str_content_at_4": 1,
    },
    "tools_after_cleaning": {"search": 377, "visit": 118},
    "turn_buckets": {
        "original": {"0-50": 14, ">100": 1, "51-100": 1},
        "resampled": {"0-50": 14, ">100": 5, "51-100": 2},
    },
    "multiplier_distribution": {"1": 14, "5": 1, "2": 1},
}
REFERENCE_PER_FILE_DUPLICATES = {"train-00000.parquet": 9, "train-00001.parquet": 1,
                                 "train-00002.parquet": 0}
# sha256 of [[question, messages[1:], gt], ...] of the reference's cleaned_resampled.parquet
REFERENCE_ROWS_SHA256 = "35d4e922ea693f53cd331cfced861474f84b397b52e45360c0544eda0b481658"
# (file digit, source row, copy) of the reference output with --shuffle --seed 42
REFERENCE_SHUFFLED = [
    ("0", 0, 0), ("1", 5, 0), ("1", 3, 0), ("0", 1, 0), ("0", 5, 3), ("0", 5, 0), ("0", 7, 0),
    ("0", 3, 0), ("1", 6, 0), ("1", 4, 0), ("0", 8, 0), ("0", 2, 0), ("0", 5, 4), ("2", 2, 0),
    ("0", 4, 0), ("0", 7, 1), ("0", 5, 2), ("0", 6, 0), ("0", 9, 0), ("2", 0, 0), ("0", 5, 1),
]


@pytest.fixture(scope="module")
def ref_input(tmp_path_factory, shared_data) -> Path:
    return build_reference_input(tmp_path_factory.mktemp("ref_input"))


# --------------------------------------------------------------------------- reference


@pytest.mark.parametrize("workers", [1, 2])
def test_matches_reference_script(ref_input, tmp_path, workers):
    stats = run_clean(CleanOptions(input=ref_input, output_dir=tmp_path, correctness="off",
                                   current_date="2026-03-01", workers=workers, chunk_rows=3))
    for key, value in REFERENCE_STATS.items():
        assert stats[key] == value, key
    for name, dup in REFERENCE_PER_FILE_DUPLICATES.items():
        assert stats["per_file"][name]["duplicate_tool_turns_removed"] == dup
    assert stats["correctness"]["mode"] == "off"
    assert stats["unexpected_errors"] == 0
    assert rows_digest(tmp_path / "cleaned_resampled.parquet") == REFERENCE_ROWS_SHA256
    assert pq.read_schema(tmp_path / "cleaned_resampled.parquet").names == [
        "question", "messages", "gt"]


def test_shuffle_matches_reference_and_is_worker_independent(ref_input, tmp_path):
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        run_clean(CleanOptions(input=ref_input, output_dir=out, correctness="off", shuffle=True,
                               seed=42, keep_metadata=True, workers=workers))
        rows = pq.read_table(out / "cleaned_resampled.parquet").to_pylist()
        outs.append([(r["_source_file"][-9], r["_source_row"], r["_sample_copy"]) for r in rows])
        assert set(rows[0]) >= {"_turns", "_resample_multiplier", "_sample_copy"}
    assert outs[0] == outs[1] == REFERENCE_SHUFFLED


def test_intermediate_and_jsonl_outputs(ref_input, tmp_path):
    run_clean(CleanOptions(input=ref_input, output_dir=tmp_path, correctness="off",
                           keep_intermediate=True, write_jsonl=True, workers=1))
    assert pq.read_metadata(tmp_path / "stage1_normalized.parquet").num_rows == 27
    assert pq.read_metadata(tmp_path / "stage2_deduped.parquet").num_rows == 16
    lines = (tmp_path / "cleaned_resampled.jsonl").read_text().splitlines()
    assert len(lines) == 21 and set(json.loads(lines[0])) == {"question", "messages", "gt"}


def test_permutation_is_numpys_legacy_one():
    # numpy.random.RandomState(42).permutation(10)
    assert legacy_permutation(10, 42) == [8, 1, 5, 0, 7, 2, 9, 4, 3, 6]
    assert legacy_permutation(0, 1) == []


# --------------------------------------------------------------------------- stages


def test_serper_markdown_round_trip(shared_data):
    """Every search response of every shared trajectory survives search JSON -> Serper markdown
    -> parse_serper_markdown: queries, and each hit's title, url and snippet."""
    checked = 0
    for traj in load_trajectories():
        for m in traj["messages"]:
            entries = parse_search_body(unwrap_tool_response(m["content"]) or "")
            if not entries:
                continue
            parsed = parse_serper_markdown(serper_markdown(entries, random.Random(checked)))
            assert [q for q, _ in parsed] == [e["query"] for e in entries]
            for (_, hits), e in zip(parsed, entries, strict=True):
                expected = [{k: h[k] for k in ("title", "url", "snippet")}
                            for h in e["web_page_info_list"]]
                assert hits == expected
            checked += 1
    assert checked > 100  # the shared trajectories hold 234 search responses


def test_serper_edge_cases():
    text = ('A Google search for "x (y)" found 2 results:\n\n## Web Results\n'
            "1. [a [b] c](http://u/(1)) tail text\nDate updated: 2020\nmore\n\n"
            "2. [no url]\n3. [t](u)\n")
    [(query, hits)] = parse_serper_markdown(text)
    assert query == "x (y)"
    assert hits == [
        {"title": "a [b] c", "url": "http://u/(1)", "snippet": "tail text\nDate updated: 2020\nmore"},
        {"title": "t", "url": "u", "snippet": ""},
    ]
    assert parse_serper_markdown("no header ## Web Results") == [("", [])]


# Lines the one-pass Serper reader must read exactly as the line-at-a-time one: headers with
# and without quotes, "## Web Results" with spaces, result lines with nested brackets, URLs with
# parentheses, no space after "N.", non-ASCII digits and whitespace, date lines in any case,
# blank and whitespace-only lines, and text that only looks like any of them.
_SERPER_LINES = [
    "A Google search for 'q' found 3 results:", '  A Google search for "x y" found 10 results:  ',
    "A Google search for found 1 results:", "x A Google search for 'q' found 3 results:",
    "A Google search for 'q' found 3 results: more", "## Web Results", " ## Web Results\t",
    "## Web Results extra", "1. [t](u)", "2. [a [b] c](http://u/(1)) tail", "3. [](u)", "4. [t]()",
    "5. [t] (u)", "6. [t](u", "7.[t](u)", "8.  [t](u) x ", "\u30009. [t](u)", "10. [x](y)\x1f",
    "12. [t](u(v)w) z", "13. [t[](u)", "14. [t]](u)", "[t](u)", "1 . [t](u)", "\u0661. [digit](u)",
    "15. [t](u) Date published: 1", "Date published: 2020", "date Updated : x",
    "  Date published: y  ", "", " ", "\t", "\xa0", "snippet text", "  more text  ", "\xa0nb\xa0",
    "<tool_response>", "</tool_response> x",
]


def test_one_pass_serper_reader_reads_as_the_line_reader():
    rng = random.Random(7)
    checked = 0
    for _ in range(20000):
        text = "\n".join(rng.choice(_SERPER_LINES) for _ in range(rng.randint(0, 14)))
        if rng.random() < 0.1:
            text = f"\n {text}\n\n"
        plain = text.replace("<tool_response>", "").replace("</tool_response>", "").strip()
        expected = parse_serper_lines(plain)
        assert parse_serper_markdown(text) == expected, text
        checked += sum(len(hits) for _, hits in expected)
    assert checked > 20000  # most texts hold results
    # line breaks other than "\n" go to the line reader itself
    text = "A Google search for 'q' found 1 results:\r\n## Web Results\r\n1. [t](u)\u2028s"
    assert parse_serper_markdown(text) == [("q", [{"title": "t", "url": "u", "snippet": "s"}])]
    assert serper_hits(text) == [("q", [("t", "u", "s")])]


def test_search_hits_render_as_render_search():
    rng = random.Random(5)
    chars = ['a', '"', "\\", "\n", "\x00", "\x1f", "\x7f", "é", "中", "\ud800", "\u2028", " ", "/"]
    for _ in range(3000):
        def s() -> str:
            return "".join(rng.choice(chars) for _ in range(rng.randint(0, 5)))
        per_query = [(s(), [(s(), s(), s()) for _ in range(rng.randint(0, 3))])
                     for _ in range(rng.randint(0, 3))]
        as_dicts = [(q, [{"title": t, "url": u, "snippet": x} for t, u, x in hits])
                    for q, hits in per_query]
        assert render_search_hits(per_query) == render_search(as_dicts)


def test_tag_blocks_find_what_the_lazy_patterns_find():
    tool_call_pattern = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL | re.IGNORECASE)
    rng = random.Random(3)
    atoms = ["<think>", "</think>", "<THINK>", "</Think>", "x", "\n", "<thin", "k>", "<answer>",
             "</ANSWER>", "<tool_call>", "</tool_call>", "\u212a", "<thin\u212a>"]
    for tag, pattern in (("think", THINK_RE), ("answer", ANSWER_RE), ("tool_call", tool_call_pattern)):
        block = TagBlock(tag)
        for _ in range(5000):
            text = "".join(rng.choice(atoms) for _ in range(rng.randint(0, 12)))
            m = pattern.search(text)
            assert block.first(text) == (m.group(1) if m else None), text
            assert block.all(text) == [m.group(1) for m in pattern.finditer(text)], text


def test_tool_call_turn_normalisation():
    out = clean_tool_call_turn("<THINK> t <answer>x</answer></THINK><tool_call>{'name': 'search', "
                               "'arguments': {'queries': 'q'}}</tool_call>")
    assert out == ('<think>\nt x\n</think>\n<tool_call>\n{"name": "search", "arguments": '
                   '{"query": ["q"]}}\n</tool_call>')
    assert clean_tool_call_turn("<think></think><tool_call>{}</tool_call>") is None
    visit = clean_tool_call_turn('<think>v</think><tool_call>{"name": "visit", "arguments": '
                                 '{"urls": "u", "goal": ["g", "h"], "x": 1}}</tool_call>')
    assert '{"name": "visit", "arguments": {"url": ["u"], "goal": "g"}}' in visit
    code = '{"name": "PythonInterpreter", "arguments": {}}\n<code>print(1)</code>'
    assert code in clean_tool_call_turn(f"<think>c</think><tool_call>{code}</tool_call>")


def test_answer_turn_normalisation():
    text = ("<think>a <summary>s1</summary> b</think>\n<summary> s2 </summary>"
            "<answer>first</answer><answer> last </answer>")
    assert clean_answer_turn(text) == "<think>\na s1 b\n\ns2\n</think>\n<answer>\nlast\n</answer>"
    assert clean_answer_turn("<answer>x</answer>") is None


def _call(name: str, **args) -> dict:
    body = json.dumps({"name": name, "arguments": args})
    return {"role": "assistant", "content": f"<think>\nt\n</think>\n<tool_call>\n{body}\n</tool_call>"}


RESP = {"role": "user", "content": "<tool_response>\nr\n</tool_response>"}


def test_prune_and_dedup():
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
            _call("search", query=["b", "a"]), RESP,
            _call("Scholar", query=["x"]), RESP, RESP,
            _call("search", query=["a", "b", " a "]), RESP,
            _call("visit", url="u", goal="g"), RESP,
            _call("visit", urls=["u"], goal="other"), RESP,
            {"role": "assistant", "content": "<think>\nt\n</think>\n<answer>\nx\n</answer>"}]
    pruned, info = prune_disallowed_tools(msgs, {"search", "visit"})
    assert info.tools == [["Scholar"]] and info.responses == [2]
    deduped, n = drop_duplicate_tool_calls(pruned)
    assert n == 2 and len(deduped) == 7
    assert validate_messages(deduped) is None


def test_normalize_row_schemas(shared_data):
    traj = load_trajectories()[0]
    row, reason = normalize_row(raw_row(traj, random.Random(0)), mode="row", template="T")
    assert reason is None and row["messages"][0]["content"] == "You are a raw-data assistant."
    assert row["messages"][1:] == traj["messages"][1:]  # exact round trip of the real data
    clean, _ = normalize_row(traj, mode="template", template="T")
    assert clean["messages"][0]["content"] == "T"
    assert normalize_row({"question": "q", "gt": "", "messages": []}, mode="template",
                         template="T") == (None, "missing_question_or_gt")


# --------------------------------------------------------------------------- correctness


def test_answer_normalisation_and_scores():
    assert normalize_answer("The  Paul-Beneke!") == "paulbeneke"
    assert exact_match("paul beneke.", "Someone<|answer_split|>Paul Beneke")
    assert f1_score("Paul Beneke of Danzig", "Paul Beneke") == pytest.approx(2 * 0.5 / 1.5)
    assert f1_score("x", "a<|answer_split|>x") == 1.0


def test_em_and_f1_filters(ref_input, tmp_path):
    em = run_clean(CleanOptions(input=ref_input, output_dir=tmp_path / "em", correctness="em",
                                workers=1))
    f1 = run_clean(CleanOptions(input=ref_input, output_dir=tmp_path / "f1", f1_threshold=0.3,
                                workers=1))
    assert f1["correctness"]["mode"] == "f1"  # the default without a judge
    for st in (em, f1):
        kept = st["rows"]["stage3_correct"]
        assert st["drop_reasons"]["incorrect_answer"] == 16 - kept
        assert sum(st["multiplier_distribution"].values()) == kept
    assert em["rows"]["stage3_correct"] == 1 and f1["rows"]["stage3_correct"] == 3


def test_judge_filter_with_cache_and_failures(ref_input, tmp_path, monkeypatch):
    monkeypatch.delenv("DRVENUS_JUDGE_BASE_URL", raising=False)
    with JudgeStub() as stub:
        judge = JudgeConfig.from_options(stub.base_url, "stub-judge", concurrency=4, retries=1)
        opts = CleanOptions(input=ref_input, output_dir=tmp_path, workers=1, judge=judge)
        st = run_clean(opts)
        c = st["correctness"]
        assert c["mode"] == "judge" and c["judge_failed"] == 0
        assert c["judge_calls"] == stub.requests > 0
        assert st["rows"]["stage3_correct"] == c["correct"] >= 2  # more than exact match
        first = stub.requests
        st2 = run_clean(opts)  # all verdicts cached now
        assert stub.requests == first and st2["correctness"]["judge_cached"] == first
        assert st2["rows"] == st["rows"]


def test_judge_failures_are_counted_not_wrong(tmp_path, shared_data):
    traj = load_trajectories()[0]
    rows = []
    for k, ans in enumerate(["FAILJUDGE Paul", "Paul Beneke", "wrong"]):
        r = dict(traj, question=f"{traj['question']} {k}")
        msgs = [dict(m) for m in traj["messages"]]
        msgs[-1] = {"role": "assistant", "content": f"<think>\nt\n</think>\n<answer>\n{ans}\n</answer>"}
        r["messages"] = msgs
        rows.append(r)
    write_clean_parquet(rows, tmp_path / "in" / "train-0.parquet")
    with JudgeStub() as stub:
        judge = JudgeConfig(stub.base_url, "m", retries=1)
        for keep in (False, True):
            st = run_clean(CleanOptions(input=tmp_path / "in", output_dir=tmp_path / f"o{keep}",
                                        judge=judge, keep_judge_failures=keep, workers=1))
            c = st["correctness"]
            assert (c["judge_failed"], c["correct"], c["incorrect"]) == (1, 1, 1)
            assert st["rows"]["stage3_correct"] == (2 if keep else 1)
            assert st["drop_reasons"].get("judge_failed", 0) == (0 if keep else 1)


def test_a_judge_outage_fails_the_run_and_writes_nothing(ref_input, tmp_path):
    """Every judge call failing (a dead endpoint) is not a dataset of exact matches only."""
    from drvenus.data.correctness import JudgeOutage

    judge = JudgeConfig("http://127.0.0.1:9/v1", "gone", retries=0, timeout_s=2)
    out = tmp_path / "o"
    with pytest.raises(JudgeOutage, match=r"failed on (\d+) of \1 rows"):
        run_clean(CleanOptions(input=ref_input, output_dir=out, judge=judge, workers=1))
    assert not (out / "cleaned_resampled.parquet").exists()


# --------------------------------------------------------------------------- robustness, CLI


def test_broken_file_jsonl_and_bad_rows(tmp_path, shared_data):
    trajs = load_trajectories()
    d = tmp_path / "in"
    write_raw_parquet([raw_row(trajs[2], random.Random(0))], d / "train-a.parquet")
    (d / "train-b.parquet").write_bytes(b"not a parquet file")
    lines = [json.dumps(trajs[3]), "{broken json", json.dumps({"x": 1}), ""]
    (d / "train-c.jsonl").write_text("\n".join(lines))
    st = run_clean(CleanOptions(input=d, output_dir=tmp_path / "o", file_pattern="train-*",
                                correctness="off", workers=2))
    assert "train-b.parquet" in st["file_errors"]
    assert st["rows"]["source"] == 4 and st["rows"]["final_resampled"] == 2
    assert st["drop_reasons"] == {"unreadable_row": 1, "missing_question_or_gt": 1}
    (d / "train-a.parquet").unlink()
    (d / "train-c.jsonl").unlink()
    with pytest.raises(NothingReadError):
        run_clean(CleanOptions(input=d, output_dir=tmp_path / "o2", file_pattern="train-*",
                               correctness="off"))


def test_cli_clean_export_stats(ref_input, tmp_path):
    runner = CliRunner()
    out = tmp_path / "out"
    res = runner.invoke(data_app, ["clean", "-i", str(ref_input), "-o", str(out),
                                   "--correctness", "off", "--workers", "2"])
    assert res.exit_code == 0, res.output
    final = out / "cleaned_resampled.parquet"
    for fmt, target in [("verl", tmp_path / "v.parquet"), ("sharegpt", tmp_path / "s.jsonl"),
                        ("swift", tmp_path / "w.jsonl"), ("hf", tmp_path / "hf")]:
        res = runner.invoke(data_app, ["export", "-i", str(final), "-f", fmt, "-o", str(target)])
        assert res.exit_code == 0, res.output
    assert pq.read_table(tmp_path / "v.parquet").num_rows == 21
    conv = json.loads((tmp_path / "s.jsonl").read_text().splitlines()[0])
    assert conv["conversations"][0]["from"] == "human" and "system" in conv
    assert (tmp_path / "hf" / "README.md").read_text().startswith("---\nconfigs:")
    assert pq.read_table(tmp_path / "hf" / "data" / "train-00000-of-00001.parquet").num_rows == 21
    pytest.importorskip("matplotlib")
    res = runner.invoke(data_app, ["stats", "-i", str(final), "--plot", str(tmp_path / "p.png")])
    assert res.exit_code == 0, res.output
    assert "search" in res.output and (tmp_path / "p.png").stat().st_size > 1000
    res = runner.invoke(data_app, ["clean", "-i", str(tmp_path / "nope"), "-o", str(out)])
    assert res.exit_code == 2 and "Traceback" not in res.output


def test_resample_policy():
    p = ResamplePolicy()
    assert [p.multiplier(t) for t in (0, 50, 51, 100, 101)] == [1, 1, 2, 2, 5]
    assert [p.bucket(t) for t in (50, 51, 101)] == ["0-50", "51-100", ">100"]

"""``drvenus data from-runs``: runs (drvenus's results and traces, DR-Venus's output) into
trajectories that ``data clean`` accepts, its correctness filter keeps the right ones, and
``drvenus sft`` trains on them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from drvenus import protocol
from drvenus.agent import AgentConfig, ResearchAgent, TraceWriter
from drvenus.cli import app
from drvenus.data.from_runs import TRAJECTORIES
from scripted import ScriptedModel, ScriptedTools, answer, call

runner = CliRunner()
PROMPT = "You research questions with search and visit, then answer."
HITS = protocol.render_search([("dracula author", [
    {"title": "Dracula", "link": "https://example.org/dracula",
     "snippet": "Dracula is an 1897 novel by Bram Stoker."}])])


def research(question: str, reply: str, *, on_event=None, max_steps: int = 5):
    """One run: a search, then ``reply`` (an answer turn, or more searches)."""
    model = ScriptedModel([call("search", query=["dracula author"]), reply])
    config = AgentConfig(max_steps=max_steps, max_attempts=1, backoff_base=0.0,
                         system_prompt=PROMPT)
    return asyncio.run(ResearchAgent(model, ScriptedTools(HITS), config).run(question, on_event))


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture()
def runs(tmp_path: Path) -> dict[str, Path]:
    right = research("Who wrote Dracula?", answer("Bram Stoker"))
    wrong = research("Who wrote Frankenstein?", answer("Bram Stoker"))
    stuck = research("Who wrote Carmilla?", call("search", query=["carmilla"]), max_steps=2)
    results = write_jsonl(tmp_path / "results.jsonl", [
        {"id": "q1", **right.to_dict(), "answer": "Bram Stoker"},
        {"id": "q2", **wrong.to_dict(), "answer": ["Mary Shelley"]},
        {"id": "q3", **stuck.to_dict(), "answer": "Sheridan Le Fanu"},
        {"id": "q4", **right.to_dict(), "question": "Who wrote Dracula, again?"},  # no gold
        "not a run",
    ])
    # DR-Venus's inference output: its own field names and termination
    dr_venus = write_jsonl(tmp_path / "dr_venus.jsonl", [{
        "question": "Who wrote Dracula?", "answer": "Bram Stoker", "messages": right.messages,
        "prediction": "Bram Stoker", "termination": "answer",
    }])
    trace = tmp_path / "trace.jsonl"
    writer = TraceWriter(str(trace))
    research("Who is the author of Dracula?", answer("Bram Stoker"), on_event=writer)
    writer.close()
    qa = write_jsonl(tmp_path / "qa.jsonl",
                     [{"question": "Who is the author of Dracula?", "answer": "Bram Stoker"}])
    return {"results": results, "dr_venus": dr_venus, "trace": trace, "qa": qa}


def test_runs_become_trajectories_with_their_gold(runs, tmp_path):
    out = tmp_path / "raw"
    res = runner.invoke(app, ["data", "from-runs", str(runs["results"]), str(runs["dr_venus"]),
                              str(runs["trace"]), "--gold", str(runs["qa"]), "-o", str(out)])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in (out / TRAJECTORIES).read_text().splitlines()]
    assert [(r["question"], r["gt"]) for r in rows] == [
        ("Who wrote Dracula?", "Bram Stoker"), ("Who wrote Frankenstein?", "Mary Shelley"),
        ("Who wrote Dracula?", "Bram Stoker"), ("Who is the author of Dracula?", "Bram Stoker"),
    ]
    assert rows[0]["messages"][0] == {"role": "system", "content": PROMPT}
    report = json.loads((out / "from_runs.json").read_text())
    assert report["skipped"] == {"no_answer": 1, "no_gold": 1, "not_a_run": 1}


def test_clean_keeps_the_right_ones_and_sft_trains_on_them(runs, tmp_path, tiny_policy):
    from drvenus.train.sft import SFTConfig, train

    raw, clean = tmp_path / "raw", tmp_path / "clean"
    assert runner.invoke(app, ["data", "from-runs", str(runs["results"]), str(runs["trace"]),
                               "--gold", str(runs["qa"]), "-o", str(raw)]).exit_code == 0
    res = runner.invoke(app, ["data", "clean", "--input", str(raw / TRAJECTORIES),
                              "--output-dir", str(clean), "--correctness", "em",
                              "--system-prompt-mode", "row", "--workers", "1"])
    assert res.exit_code == 0, res.output
    stats = json.loads((clean / "stats.json").read_text())
    assert stats["rows"]["stage2_valid"] == 3 and stats["rows"]["stage3_correct"] == 2
    result = train(SFTConfig(
        train=str(clean / "cleaned_resampled.parquet"), model=str(tiny_policy),
        output=str(tmp_path / "sft"), max_length=512, global_batch_size=2, max_steps=2,
        save_steps=2, logging_steps=1, val_fraction=0.0, warmup_ratio=0.0,
    ))
    assert result.global_step == 2


@pytest.mark.parametrize(("args", "message"), [
    (["nope.jsonl", "-o", "out"], "not found"),
    (["{results}", "-o", "out", "--gold", "nope.jsonl"], "not found"),
    (["{results}", "-o", "out", "--gold", "{trace}"], "no question with an answer"),
])
def test_bad_input_is_one_line_exit_2(runs, tmp_path, args, message):
    args = [a.format(results=runs["results"], trace=runs["trace"]) for a in args]
    args = [str(tmp_path / a) if a == "out" else a for a in args]
    res = runner.invoke(app, ["data", "from-runs", *args])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], res.output


def test_a_heavy_record_counts_as_its_runs(tmp_path):
    from drvenus.agent import HeavyPolicy

    model = ScriptedModel([call("search", query=["dracula author"]), answer("Bram Stoker")])
    config = AgentConfig(max_steps=3, max_attempts=1, backoff_base=0.0, system_prompt=PROMPT,
                         heavy=HeavyPolicy(runs=2, mode="vote"))
    record = asyncio.run(ResearchAgent(model, ScriptedTools(HITS), config).run("Who?"))
    results = write_jsonl(tmp_path / "heavy.jsonl", [{**record.to_dict(), "answer": "x"}])
    res = runner.invoke(app, ["data", "from-runs", str(results), "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    rows = (tmp_path / "out" / TRAJECTORIES).read_text().splitlines()
    assert len(rows) == 2 and all(json.loads(r)["gt"] == "x" for r in rows)


# ------------------------------------------------------------------ its own output (issue 43)
def _results_folder(root: Path, n: int) -> Path:
    right = research("Who wrote Dracula?", answer("Bram Stoker"))
    folder = root / "runs"
    folder.mkdir()
    write_jsonl(folder / "results.jsonl",
                [{"id": f"q{i}", **right.to_dict(), "answer": "Bram Stoker"} for i in range(n)])
    return folder


@settings(max_examples=8, deadline=None)
@given(n=st.integers(1, 4), reruns=st.integers(2, 4),
       sub=st.sampled_from(["self", "a/b", "raw", "."]), other=st.booleans())
def test_an_output_inside_its_input_folder_is_never_read_back(n, reruns, sub, other):
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        folder = _results_folder(Path(tmp), n)
        for i in range(reruns):
            # the same -o each time, or a new one each time (earlier ones stay in the folder)
            out = folder / (f"{sub}{i}" if other else sub)
            res = runner.invoke(app, ["data", "from-runs", str(folder), "-o", str(out)])
            assert res.exit_code == 0, res.output
            rows = (out / TRAJECTORIES).read_text().splitlines()
            assert len(rows) == n  # not 2n, 3n, ...
            report = json.loads((out / "from_runs.json").read_text())
            assert report["files"] == 1 and report["ignored"] == (2 * i if other else
                                                                   2 * min(i, 1))


def test_an_input_that_is_its_own_output_is_refused(tmp_path):
    folder = _results_folder(tmp_path, 2)
    out = tmp_path / "self"
    assert runner.invoke(app, ["data", "from-runs", str(folder), "-o", str(out)]).exit_code == 0
    before = (out / TRAJECTORIES).read_bytes()
    res = runner.invoke(app, ["data", "from-runs", str(out / TRAJECTORIES), "-o", str(out)])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "write over its own input" in lines[0], res.output
    assert (out / TRAJECTORIES).read_bytes() == before


def test_a_folder_of_only_earlier_output_says_so(tmp_path):
    folder = _results_folder(tmp_path, 1)
    out = tmp_path / "raw"
    assert runner.invoke(app, ["data", "from-runs", str(folder), "-o", str(out)]).exit_code == 0
    res = runner.invoke(app, ["data", "from-runs", str(out), "-o", str(tmp_path / "again")])
    assert res.exit_code == 2 and "earlier from-runs output" in res.output


def test_an_output_that_is_the_input_folder_itself(tmp_path):
    folder = _results_folder(tmp_path, 3)
    for _ in range(3):
        res = runner.invoke(app, ["data", "from-runs", str(folder), "-o", str(folder)])
        assert res.exit_code == 0, res.output
        assert len((folder / TRAJECTORIES).read_text().splitlines()) == 3

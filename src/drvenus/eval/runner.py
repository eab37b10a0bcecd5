"""The evaluation runner: every (item, run) pair through the agent, then grading.

The output folder holds ``eval.json`` (what was run), ``results.jsonl`` (one appended row per
(item, run) with its full trajectory, written by :mod:`drvenus.batch`: locked, fsync'd, resumable;
a rerun skips finished pairs and retries failed ones), ``corpus.jsonl`` for benchmarks that bring
their own corpus, the judge's cache, and the report. For encrypted benchmarks no row holds the
question or the ground truth: the question in the trajectory is replaced by a placeholder.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from drvenus.agent import ResearchAgent, ResultRecord
from drvenus.batch import (
    BatchRun,
    BatchSummary,
    OnEvent,
    Plan,
    ResultsFile,
    exception_record,
    iter_jsonl,
    plan,
)
from drvenus.eval.benchmarks import (
    BenchmarkSpec,
    EvalItem,
    get_spec,
    is_set_answer,
    load,
    write_corpus,
)
from drvenus.eval.judges import grade
from drvenus.eval.metrics import RunResult, gold_recall, tool_use
from drvenus.eval.official import OfficialGrader
from drvenus.grading.judge import JudgeClient, JudgeConfig
from drvenus.questions import Question

log = logging.getLogger(__name__)

MANIFEST = "eval.json"
RESULTS = "results.jsonl"
CORPUS = "corpus.jsonl"
JUDGE_CACHE = "judge_cache.sqlite"
REDACTED = "[question of an encrypted benchmark, id {id}: not stored]"


@dataclass
class EvalSetup:
    """A prepared evaluation: the benchmark, its items (after ``limit``) and the output folder."""

    spec: BenchmarkSpec
    items: list[EvalItem]
    runs: int
    out: Path
    data: Path
    corpus: Path | None = None
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def results_path(self) -> Path:
        return self.out / RESULTS

    def pairs(self) -> list[Question]:
        """One batch item per (item, run), run by run (so early runs complete first)."""
        return [
            Question(pair_id(item.id, run), item.question, meta={"item": item.id, "run": run})
            for run in range(self.runs) for item in self.items
        ]


def pair_id(item_id: str, run: int) -> str:
    return f"{item_id}@run{run}"


def prepare(
    benchmark: str, data: Path, out: Path, *, runs: int = 3, limit: int | None = None
) -> EvalSetup:
    """Load the benchmark, check the output folder belongs to it, write its corpus if it has
    one, and record what is run in ``eval.json``. Raises ValueError / OSError."""
    if runs < 1:
        raise ValueError("--runs must be at least 1")
    spec = get_spec(benchmark)
    items = load(spec.name, data)
    if limit is not None:
        items = items[: max(0, limit)]
    if not items:
        raise ValueError(f"no items in {data}")
    if spec.corpus is not None and next(iter(spec.corpus(Path(data))), None) is None:
        raise ValueError(f"{data}: no corpus documents in it for {spec.name} "
                         f"({spec.description}); is it the benchmark's file?")
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / MANIFEST
    old = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.exists() else {}
    if old and old.get("benchmark") != spec.name:
        raise ValueError(f"{out} holds a {old.get('benchmark')} evaluation; use another --out")
    if old.get("data") and old["data"] != str(Path(data).resolve()):
        raise ValueError(f"{out} holds an evaluation of {old['data']}, not of {data}: its results "
                         "would be reused for other items; use another --out")
    setup = EvalSetup(spec, items, runs, out, Path(data))
    if spec.corpus is not None:
        setup.corpus = out / CORPUS
        if not setup.corpus.exists():  # an unchanged file keeps its cached index
            n = write_corpus(spec.corpus(Path(data)), setup.corpus)
            log.info("wrote %d corpus documents to %s", n, setup.corpus)
    setup.manifest = {
        **old, "benchmark": spec.name, "data": str(Path(data).resolve()), "runs": runs,
        "items": len(items), "limit": limit, "encrypted": spec.encrypted,
        "started": old.get("started", time.time()),
    }
    save_manifest(setup)
    return setup


def save_manifest(setup: EvalSetup, **changes: Any) -> None:
    setup.manifest.update(changes)
    path = setup.out / MANIFEST
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(setup.manifest, indent=2, ensure_ascii=False), encoding="utf-8")
    tmp.replace(path)


def load_manifest(out: Path) -> dict[str, Any]:
    path = out / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"no evaluation in {out} (no {MANIFEST})")
    return json.loads(path.read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------- running the agent
class EvalBatchRun(BatchRun):
    """:class:`drvenus.batch.BatchRun` over one or more agents (one per model endpoint: each
    question goes to the next, round-robin) that keeps encrypted questions out of the rows."""

    def __init__(
        self, agents: Sequence[ResearchAgent], *args: Any, redact: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(agents[0], *args, **kwargs)
        self.agents = list(agents)
        self.redact = redact
        self._turn = 0

    async def _research(self, item: Question) -> ResultRecord:
        agent = self.agents[self._turn % len(self.agents)]
        self._turn += 1
        try:
            record = await agent.run(item.question, self.listener(item))
        except Exception as exc:  # one pair's failure is its row, not the evaluation's
            log.exception("pair %s failed", item.id)
            record = exception_record(item.question, exc)
        if self.redact:
            placeholder = REDACTED.format(id=item.meta.get("item", item.id))
            heavy = record.extra.get("heavy")
            record.messages = _redacted(record.messages, item.question, placeholder,
                                        anywhere=heavy is not None)  # the synthesis quotes it
            record.question = placeholder
            record.error = None if record.error is None else record.error.replace(
                item.question, placeholder)
            for run in (heavy or {}).get("runs", []):  # Heavy mode keeps each run's record
                run["messages"] = _redacted(run["messages"], item.question, placeholder)
                run["question"] = placeholder
                if run.get("error"):
                    run["error"] = run["error"].replace(item.question, placeholder)
        return record


def _redacted(messages: list[dict[str, str]], question: str, placeholder: str,
              anywhere: bool = False) -> list[dict[str, str]]:
    """``messages`` with the question message replaced by ``placeholder`` (``anywhere``: the
    question's text replaced wherever it occurs)."""
    out = []
    for m in messages:
        content = m.get("content")
        if content == question:
            m = {**m, "content": placeholder}
        elif anywhere and isinstance(content, str) and question in content:
            m = {**m, "content": content.replace(question, placeholder)}
        out.append(m)
    return out


def pending(setup: EvalSetup, results: ResultsFile) -> Plan:
    """The (item, run) pairs still to do in an open results file."""
    return plan(setup.pairs(), results.state)


async def run_pairs(
    setup: EvalSetup,
    agents: ResearchAgent | Sequence[ResearchAgent],
    todo: Plan,
    results: ResultsFile,
    *,
    workers: int = 4,
    on_done: Callable[[Question, ResultRecord], None] | None = None,
    on_event: OnEvent | None = None,
) -> BatchSummary:
    """Research the pending pairs concurrently (spread over ``agents`` round-robin), appending
    each row to ``results`` (``on_done``, ``on_event``: as :class:`BatchRun`'s)."""
    if isinstance(agents, ResearchAgent):
        agents = [agents]
    runner = EvalBatchRun(agents, todo, results, workers=workers, on_done=on_done,
                          on_event=on_event, redact=setup.spec.encrypted)
    return await runner.run()


# ---------------------------------------------------------------------------- grading
def latest_rows(path: Path) -> dict[str, dict[str, Any]]:
    """The latest row of each (item, run) id in a results file."""
    rows: dict[str, dict[str, Any]] = {}
    if path.exists():
        with path.open("rb") as fh:
            for row in iter_jsonl(fh):
                if row is not None and isinstance(row.get("id"), str):
                    rows[row["id"]] = row
    return rows


def _result(item: EvalItem, run: int, row: dict[str, Any], graded: dict[str, Any]) -> RunResult:
    use = tool_use(row.get("messages") or [])
    usage = row.get("usage") or {}
    gold = item.meta.get("gold_urls")
    return RunResult(
        item_id=item.id, run=run, correct=graded.get("correct"),
        prediction=str(row.get("prediction") or ""), termination=str(row.get("termination")),
        turns=int(row.get("turns") or 0), search_calls=use.search_calls,
        visit_calls=use.visit_calls, prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        elapsed=float(row.get("elapsed_seconds") or 0.0), score=graded.get("score"),
        confidence=graded.get("confidence"), level=item.meta.get("level"),
        is_set=is_set_answer(item.meta),
        recall_visited=gold_recall(gold, use.visited) if gold else None,
        recall_retrieved=gold_recall(gold, use.retrieved + use.visited) if gold else None,
        grade=graded,
    )


async def grade_all(
    setup: EvalSetup,
    judge: JudgeConfig | None,
    *,
    on_done: Callable[[], None] | None = None,
    official: OfficialGrader | None = None,
) -> list[RunResult]:
    """Grade every stored (item, run) row of the setup's items (the judge's verdicts are cached,
    so grading again costs nothing); rows not run yet are left out. ``official``: grade with
    the benchmark's official grader (``--grader official``) instead of ours."""
    rows = latest_rows(setup.results_path)
    client = JudgeClient(judge) if judge is not None else None
    todo = [(item, run, rows[pair_id(item.id, run)]) for run in range(setup.runs)
            for item in setup.items if pair_id(item.id, run) in rows]

    async def one(item: EvalItem, run: int, row: dict[str, Any]) -> RunResult:
        prediction = str(row.get("prediction") or "")
        if official is not None:
            g = await official.grade(item, prediction, client)
        else:
            g = await grade(setup.spec.grader, item, prediction, client)
        if on_done is not None:
            on_done()
        return _result(item, run, row, g.to_dict() | {"correct": g.correct})

    try:
        return list(await asyncio.gather(*(one(*t) for t in todo)))
    finally:
        if client is not None:
            await client.aclose()


def judge_config(out: Path, cfg: JudgeConfig | None) -> JudgeConfig | None:
    """The judge of an evaluation (:meth:`JudgeConfig.from_options`), caching in the output
    folder unless it names its cache; None: none is configured (deterministic scorers then)."""
    if cfg is None or cfg.cache_path is not None:
        return cfg
    return replace(cfg, cache_path=out / JUDGE_CACHE)


__all__ = [
    "CORPUS",
    "MANIFEST",
    "RESULTS",
    "EvalBatchRun",
    "EvalSetup",
    "grade_all",
    "judge_config",
    "latest_rows",
    "load_manifest",
    "pair_id",
    "pending",
    "prepare",
    "run_pairs",
    "save_manifest",
]

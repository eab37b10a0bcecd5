"""Evaluate the embedded agent at each stage of the recipe and print the table (issue #17, §2).

    python recipes/embedded/evaluate.py --data runs/recipe \\
        --stage base= --stage sft=runs/recipe/sft.gguf --stage rl=runs/recipe/rl.gguf \\
        --out runs/recipe/eval-runs

Every stage is the embedded GGUF run in process by ``drvenus eval`` (greedy, one run per
question, one question at a time so that seconds per question are a user's latency); a stage is
``NAME=ADAPTER.gguf``, or ``NAME=`` for the plain base model (``--no-adapter``). Two benchmarks:

- the build's reserved-bucket questions (``eval/dev.jsonl``, or ``--split test``): every two-hop
  and open-QA question of the split and the first ``--single-hop`` single-hop ones in a fixed
  hash order, graded by exact match over the gold aliases; the report breaks accuracy down by
  level (single-hop, two-hop, open-qa) with a 95% Wilson interval;
- the offline HotpotQA-paragraphs benchmark (its own corpus; ``--hotpot`` questions; 0: skip),
  or with ``--hotpot-official FILE`` HotpotQA's official JSON (``--benchmark hotpotqa``, the
  distractor corpus of the file's contexts); the cell is EM with its interval, then F1.

Reruns resume (``drvenus eval`` skips finished questions). Writes ``OUT/table.md`` and
``OUT/table.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

from drvenus.recipe.build import EVAL_LEVELS

log = logging.getLogger("evaluate")

SHARED_HOTPOT = (Path(__file__).resolve().parents[3]
                 / "shared/data/qa/hotpotqa-dev-500-with-paragraphs.jsonl")
LEVELS = ("single-hop", "two-hop", "open-qa")


def _level(row: dict[str, Any]) -> str:
    """The row's level (older builds wrote none: derived from its source the build's way)."""
    if row.get("level"):
        return str(row["level"])
    source = str(row.get("data_source", "")).split(":")[0]
    return EVAL_LEVELS.get(source, source)


def select(split_file: Path, single_hop: int, out: Path, max_items: int | None = None) -> Path:
    """The evaluated subset of a split: all two-hop and open-QA rows, ``single_hop`` single-hop
    rows in sha256(id) order (stable, and not the file's alphabetical order)."""
    rows = [json.loads(x) for x in split_file.read_text(encoding="utf-8").splitlines() if x]
    for r in rows:
        r["level"] = _level(r)
    singles = sorted((r for r in rows if r["level"] == "single-hop"),
                     key=lambda r: hashlib.sha256(r["id"].encode()).hexdigest())
    picked = [r for r in rows if r["level"] != "single-hop"] + singles[:single_hop]
    picked = picked[:max_items] if max_items else picked
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in picked),
                   encoding="utf-8")
    return out


def run_eval(benchmark: str, data: Path, out: Path, adapter: str, limit: int | None,
             extra: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "drvenus", "eval", "--benchmark", benchmark, "--data", str(data),
           "--out", str(out), "--runs", "1", "--workers", "1", *extra]
    cmd += ["--adapter", adapter] if adapter else ["--no-adapter"]
    if limit:
        cmd += ["--limit", str(limit)]
    log.info("running %s", " ".join(cmd[2:]))
    subprocess.run(cmd, check=True)
    return json.loads((out / "report.json").read_text(encoding="utf-8"))


def _metrics(report: dict[str, Any]) -> dict[str, Any]:
    return report["metrics"]


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}"


def _cell(acc: float | None, ci: list[float] | None, n: int | None) -> str:
    if acc is None:
        return "–"
    interval = f" [{_pct(ci[0])}, {_pct(ci[1])}]" if ci else ""
    return f"{_pct(acc)}{interval} (n={n})"


def table(results: dict[str, dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    head = ("| stage | single-hop | two-hop | open-qa | HotpotQA | turns | searches "
            "| visits | s/question |")
    lines = [head, "|" + "---|" * 9]
    rows = []
    for stage, res in results.items():
        m = _metrics(res["recipe"])
        levels = m.get("per_level") or {}
        cells = [_cell(levels.get(lv, {}).get("avg_at_k"), levels.get(lv, {}).get("ci95_items"),
                       levels.get(lv, {}).get("n")) for lv in LEVELS]
        hp = _metrics(res["hotpot"]) if res.get("hotpot") else None
        cells.append(_cell(hp["avg_at_k"], hp.get("ci95_items"), hp["items"]) if hp else "–")
        hp_f1 = ((hp or {}).get("exact_f1") or {}).get("f1")
        if hp_f1 is not None:
            cells[-1] += f", F1 {hp_f1:.3f}"
        cost = m["cost_all"]
        lines.append(f"| {stage} | " + " | ".join(cells) + f" | {cost['turns']:.2f} | "
                     f"{cost['search_calls']:.2f} | {cost['visit_calls']:.2f} | "
                     f"{cost['seconds']:.1f} |")
        rows.append({"stage": stage, "levels": levels, "hotpot": hp and {
            "avg_at_k": hp["avg_at_k"], "ci95_items": hp.get("ci95_items"), "n": hp["items"],
            "f1": hp_f1},
            "cost": cost, "overall": m["avg_at_k"], "ci95": m.get("ci95_items")})
    return "\n".join(lines), rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, default=Path("runs/recipe"), help="build_data.py's --out")
    p.add_argument("--split", default="dev", choices=("dev", "test"))
    p.add_argument("--stage", action="append", default=[], metavar="NAME=ADAPTER",
                   help="a stage to evaluate (repeatable); NAME= for the base model")
    p.add_argument("--single-hop", type=int, default=60, help="single-hop questions (0: all)")
    p.add_argument("--max-items", type=int, default=None, help="cap the subset (a quick run)")
    p.add_argument("--hotpot", type=int, default=30, help="HotpotQA questions (0: skip)")
    p.add_argument("--hotpot-data", type=Path,
                   default=SHARED_HOTPOT if SHARED_HOTPOT.is_file() else None)
    p.add_argument("--hotpot-official", type=Path, default=None, metavar="FILE.json",
                   help="HotpotQA's official JSON, run in place of --hotpot-data")
    p.add_argument("--max-steps", type=int, default=None, help="passed to drvenus eval")
    p.add_argument("--out", type=Path, default=None, help="default: DATA/eval-runs")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    out = args.out or args.data / "eval-runs"
    stages = dict(s.split("=", 1) for s in (args.stage or ["base="]))
    subset = select(args.data / "eval" / f"{args.split}.jsonl", args.single_hop or 10**9,
                    out / f"{args.split}-subset.jsonl", args.max_items)
    extra = ["--max-steps", str(args.max_steps)] if args.max_steps else []
    results: dict[str, dict[str, Any]] = {}
    for name, adapter in stages.items():
        res = {"recipe": run_eval("jsonl", subset, out / name / args.split, adapter, None, extra)}
        if args.hotpot_official and args.hotpot:
            res["hotpot"] = run_eval("hotpotqa", args.hotpot_official,
                                     out / name / "hotpot-official", adapter, args.hotpot, extra)
        elif args.hotpot and args.hotpot_data:
            res["hotpot"] = run_eval("hotpotqa-paragraphs", args.hotpot_data, out / name / "hotpot",
                                     adapter, args.hotpot, extra)
        results[name] = res
    text, rows = table(results)
    (out / "table.md").write_text(text + "\n", encoding="utf-8")
    (out / "table.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

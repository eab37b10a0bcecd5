"""Evaluate the embedded agent at each stage of the recipe and print the table (issue #29).

    python recipes/embedded/evaluate.py --data runs/recipe \\
        --stage base= --stage sft=runs/recipe/sft.gguf --stage rl=runs/recipe/rl.gguf \\
        --out runs/recipe/eval-runs

Every stage is the embedded GGUF run in process by ``drvenus eval`` (greedy, one run per
question, one question at a time so that seconds per question are a user's latency); a stage is
``NAME=ADAPTER.gguf``, or ``NAME=`` for the plain base model (``--no-adapter``). Three
benchmarks, each graded by exact match over the gold aliases with a 95% Wilson interval:

- **natural**: the hand-written natural dev set (``recipes/embedded/natural/dev.jsonl``, or
  ``--split test``): questions as people ask them, over reserved articles; ``--natural`` of them
  in sha256(id) order (0: all), broken down by level (single-hop, two-hop, comparison, yes-no);
- **templated**: the build's reserved questions that name their subject by title
  (``DATA/eval/dev.jsonl``, source ``wiki-single-hop``); ``--templated`` of them, same order;
- **HotpotQA**: the offline HotpotQA-paragraphs benchmark (its own corpus; ``--hotpot``
  questions; 0: skip), or with ``--hotpot-official FILE`` HotpotQA's official JSON
  (``--benchmark hotpotqa``, the distractor corpus of the file's contexts); EM, then F1.

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
NATURAL = Path(__file__).resolve().parent / "natural"
LEVELS = ("single-hop", "two-hop", "comparison", "yes-no")


def _level(row: dict[str, Any]) -> str:
    """The row's level (older builds wrote none: derived from its source the build's way)."""
    if row.get("level"):
        return str(row["level"])
    source = str(row.get("data_source", "")).split(":")[0]
    return EVAL_LEVELS.get(source, source)


def _hashed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` in sha256(id) order: a stable subset, not the file's order."""
    return sorted(rows, key=lambda r: hashlib.sha256(str(r["id"]).encode()).hexdigest())


def select(rows: list[dict[str, Any]], n: int, out: Path) -> Path:
    """The first ``n`` of ``rows`` in sha256(id) order (0: all), written to ``out``."""
    picked = _hashed(rows)[: n or None]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in picked),
                   encoding="utf-8")
    return out


def read_rows(path: Path) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    for r in rows:
        r["level"] = _level(r)
    return rows


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


def _with_f1(cell: str, report: dict[str, Any]) -> str:
    f1 = ((_metrics(report).get("exact_f1") or {}).get("f1"))
    return cell if f1 is None else f"{cell}, F1 {f1:.3f}"


def _overall(report: dict[str, Any] | None) -> str:
    if not report:
        return "–"
    m = _metrics(report)
    return _cell(m["avg_at_k"], m.get("ci95_items"), m["items"])


def table(results: dict[str, dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    head = ("| stage | natural | " + " | ".join(f"natural {lv}" for lv in LEVELS)
            + " | templated | HotpotQA | turns | searches | visits | s/question |")
    lines = [head, "|" + "---|" * (len(LEVELS) + 8)]
    rows = []
    for stage, res in results.items():
        m = _metrics(res["natural"])
        levels = m.get("per_level") or {}
        cells = [_overall(res["natural"])]
        cells += [_cell(levels.get(lv, {}).get("avg_at_k"), levels.get(lv, {}).get("ci95_items"),
                        levels.get(lv, {}).get("n")) for lv in LEVELS]
        cells.append(_overall(res.get("templated")))
        cells.append(_with_f1(_overall(res["hotpot"]), res["hotpot"]) if res.get("hotpot")
                     else "–")
        cost = m["cost_all"]
        lines.append(f"| {stage} | " + " | ".join(cells) + f" | {cost['turns']:.2f} | "
                     f"{cost['search_calls']:.2f} | {cost['visit_calls']:.2f} | "
                     f"{cost['seconds']:.1f} |")
        rows.append({
            "stage": stage, "overall": m["avg_at_k"], "ci95": m.get("ci95_items"),
            "levels": levels, "cost": cost,
            **{name: res[name] and {"avg_at_k": _metrics(res[name])["avg_at_k"],
                                    "ci95_items": _metrics(res[name]).get("ci95_items"),
                                    "n": _metrics(res[name])["items"],
                                    "f1": (_metrics(res[name]).get("exact_f1") or {}).get("f1")}
               for name in ("templated", "hotpot") if name in res},
        })
    return "\n".join(lines), rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, default=Path("runs/recipe"), help="build_data.py's --out")
    p.add_argument("--split", default="dev", choices=("dev", "test"))
    p.add_argument("--stage", action="append", default=[], metavar="NAME=ADAPTER",
                   help="a stage to evaluate (repeatable); NAME= for the base model")
    p.add_argument("--natural", type=int, default=90, help="natural questions (0: all)")
    p.add_argument("--natural-data", type=Path, default=None,
                   help="default: recipes/embedded/natural/SPLIT.jsonl")
    p.add_argument("--templated", type=int, default=36,
                   help="title-named build questions (0: skip)")
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
    natural = select(read_rows(args.natural_data or NATURAL / f"{args.split}.jsonl"),
                     args.natural, out / f"natural-{args.split}.jsonl")
    templated = None
    if args.templated:
        built = [r for r in read_rows(args.data / "eval" / f"{args.split}.jsonl")
                 if r.get("data_source") == "wiki-single-hop"]
        templated = select(built, args.templated, out / f"templated-{args.split}.jsonl")
    extra = ["--max-steps", str(args.max_steps)] if args.max_steps else []
    results: dict[str, dict[str, Any]] = {}
    for name, adapter in stages.items():
        res = {"natural": run_eval("jsonl", natural, out / name / f"natural-{args.split}",
                                   adapter, None, extra)}
        if templated is not None:
            res["templated"] = run_eval("jsonl", templated, out / name / f"templated-{args.split}",
                                        adapter, None, extra)
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

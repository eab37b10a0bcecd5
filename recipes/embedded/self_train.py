"""Rejection-sampling fine-tuning of the embedded agent on its own runs (issue #33).

    python recipes/embedded/self_train.py --data runs/recipe --start runs/recipe/sft/final \\
        --out runs/self-train --questions 400

The recipe of docs/DATA.md ("rejection-sampling fine-tuning on your own runs") on the embedded
model, each step a plain drvenus command (printed as it runs; a rerun skips finished steps and
``drvenus run`` resumes where it stopped):

1. questions: ``--questions`` of the build's RL training questions (``DATA/questions.jsonl``,
   split ``train-rl``) in sha256(id) order, by default only the kinds people ask (described
   subjects, two-hop, comparison, yes/no; ``--sources`` to change), written with their gold
   answers to ``OUT/questions.jsonl``;
2. runs: ``drvenus run`` with the starting adapter (``--start-gguf``, else ``--start`` exported
   with ``drvenus models export-adapter``); ``--samples K`` runs each question K times
   (``--heavy K --heavy-mode vote``: run 0 greedy, the others sampled);
3. ``drvenus data from-runs --gold`` -> ``drvenus data clean --correctness em`` (only the runs
   whose answer matches the gold one are kept, the prompt they used kept with them);
4. ``drvenus sft`` (``sft.yaml``, continuing the starting LoRA adapter) on the kept runs, then
   ``export-adapter`` -> ``OUT/self.gguf``;
5. ``evaluate.py``: the starting adapter against the new one on the natural dev questions
   (``--natural`` of them; ``--templated`` title-named ones), table in ``OUT/eval-runs``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from evaluate import _hashed
from rebuild import drvenus, sh

log = logging.getLogger("self_train")
HERE = Path(__file__).resolve().parent
NATURAL_SOURCES = ("wiki-described", "wiki-two-hop", "wiki-comparison", "wiki-yes-no")


def pick_questions(questions: Path, sources: tuple[str, ...], n: int,
                   split: str = "train-rl") -> list[dict[str, Any]]:
    """``n`` questions of ``split`` whose source is one of ``sources`` (a source's name before
    any ``:``), in sha256(id) order (0: all), as ``drvenus run`` rows with their gold answers."""
    rows = []
    for line in questions.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if row.get("split") != split or str(row.get("source", "")).split(":")[0] not in sources:
            continue
        rows.append({"id": row["id"], "question": row["question"], "answer": row["answer"],
                     "aliases": row.get("aliases") or []})
    rows = _hashed(rows)
    return rows[:n] if n else rows


def kept_rows(clean: Path) -> int:
    """The rows ``data clean`` kept in ``clean`` (0 when it wrote none)."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(clean).metadata.num_rows if clean.is_file() else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="build_data.py's --out")
    p.add_argument("--start", type=Path, required=True,
                   help="the LoRA adapter folder to start from (DATA/sft/final, an RL checkpoint)")
    p.add_argument("--start-gguf", type=Path, default=None,
                   help="that adapter as GGUF (default: exported to OUT/start.gguf)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--questions", type=int, default=400, help="training questions (0: all)")
    p.add_argument("--sources", default=",".join(NATURAL_SOURCES),
                   help="the build sources to take questions from, comma-separated")
    p.add_argument("--samples", type=int, default=1, help="runs of each question")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--natural", type=int, default=90, help="natural dev questions to compare on")
    p.add_argument("--templated", type=int, default=0, help="title-named dev questions too")
    p.add_argument("--eval-out", type=Path, default=None,
                   help="evaluate.py's --out (default: OUT/eval-runs); an evaluation folder that "
                        "already holds the starting adapter's runs under --start-name reuses them")
    p.add_argument("--start-name", default="before", help="the starting adapter's stage name")
    p.add_argument("--sft-args", default="", help="extra drvenus sft options, space-separated")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    qa = out / "questions.jsonl"
    if not qa.is_file():
        sources = tuple(s.strip() for s in args.sources.split(",") if s.strip())
        rows = pick_questions(args.data / "questions.jsonl", sources, args.questions)
        if not rows:
            raise SystemExit(f"{args.data}/questions.jsonl: no train-rl questions from {sources}")
        qa.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                      encoding="utf-8")
        log.info("%d training questions -> %s", len(rows), qa)

    start_gguf = args.start_gguf or out / "start.gguf"
    if not start_gguf.is_file():
        drvenus("models", "export-adapter", str(args.start), "-o", str(start_gguf))

    results = out / "runs" / "results.jsonl"
    results.parent.mkdir(parents=True, exist_ok=True)
    heavy = ["--heavy", str(args.samples), "--heavy-mode", "vote"] if args.samples > 1 else []
    # exit 1 means some question failed (an error row): rerun to retry; the rest are kept
    drvenus("run", str(qa), "-o", str(results), "--workers", str(args.workers),
            "--adapter", str(start_gguf), *heavy, check=False)

    raw = out / "raw"
    clean = out / "clean" / "cleaned_resampled.parquet"
    if not clean.is_file():
        drvenus("data", "from-runs", str(results), "--gold", str(qa), "-o", str(raw))
        drvenus("data", "clean", "--input", str(raw / "trajectories.jsonl"), "--output-dir",
                str(out / "clean"), "--correctness", "em", "--system-prompt-mode", "row")

    kept = kept_rows(clean)
    log.info("%d right runs kept for SFT", kept)
    if not kept:
        raise SystemExit(f"{clean}: no run was right; nothing to fine-tune on")
    sft_dir = out / "sft"
    if not (sft_dir / "final" / "adapter_config.json").is_file():
        drvenus("sft", "--config", str(HERE / "sft.yaml"), "--train", str(clean),
                "--model", str(args.start), "--output", str(sft_dir), "--resume",
                *args.sft_args.split())
    new_gguf = out / "self.gguf"
    if not new_gguf.is_file():
        drvenus("models", "export-adapter", str(sft_dir / "final"), "-o", str(new_gguf))

    sh(sys.executable, str(HERE / "evaluate.py"), "--data", str(args.data),
       "--out", str(args.eval_out or out / "eval-runs"),
       "--stage", f"{args.start_name}={start_gguf}", "--stage", f"self-trained={new_gguf}",
       "--natural", str(args.natural), "--templated", str(args.templated), "--hotpot", "0")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Build the embedded recipe's training data (issue #17, section 1) from scratch.

    python recipes/embedded/build_data.py --out runs/recipe-data

Questions from the built-in corpus (+ the deepresearcher mix when its parquet is given or found),
teacher trajectories over the real local tools, then ``drvenus data clean`` with the EM
correctness filter and ``drvenus data stats``. See recipes/embedded/DATA.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

from drvenus.config import load_settings
from drvenus.recipe.articles import load_articles
from drvenus.recipe.build import DEFAULT_DATE, BuildConfig, build
from drvenus.recipe.tokens import embedded_counter
from drvenus.stack import build_toolbox
from drvenus.tools.toolbox import close_quietly

log = logging.getLogger("build_data")

SHARED_MIX = Path(__file__).resolve().parents[3] / "shared/data/qa/deepresearcher-mix-test.parquet"


def clean(out: Path, date: str, workers: int) -> dict:
    """``drvenus data clean`` (EM correctness filter, strict format) and ``data stats``."""
    raw = out / "raw" / "train-sft.jsonl"
    cmd = [
        sys.executable, "-m", "drvenus", "data", "clean", "--input", str(raw),
        "--output-dir", str(out / "clean"), "--correctness", "em", "--strict-format",
        "--current-date", date, "--workers", str(workers), "--write-jsonl",
    ]
    log.info("running %s", " ".join(cmd[2:]))
    subprocess.run(cmd, check=True)
    stats_cmd = [sys.executable, "-m", "drvenus", "data", "stats", "--input",
                 str(out / "clean" / "cleaned_resampled.parquet")]
    tok = out / "tokenizer" / "tokenizer.json"
    if tok.is_file():
        stats_cmd += ["--tokenizer", str(tok)]
    done = subprocess.run(stats_cmd, check=True, capture_output=True, text=True)
    (out / "clean" / "stats.txt").write_text(done.stdout, encoding="utf-8")
    return json.loads((out / "clean" / "stats.json").read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/recipe-data"))
    p.add_argument("--seed", type=int, default=17)
    p.add_argument("--mix", type=Path, default=SHARED_MIX if SHARED_MIX.is_file() else None,
                   help="deepresearcher-mix parquet (default: the shared copy when present)")
    p.add_argument("--no-mix", action="store_true", help="leave the deepresearcher mix out")
    p.add_argument("--tokenizer", type=Path, default=None,
                   help="GGUF or tokenizer folder (default: the embedded GGUF if on disk)")
    p.add_argument("--current-date", default=DEFAULT_DATE, help="date in the system prompt")
    p.add_argument("--sft-tokens", type=int, default=BuildConfig.sft_tokens,
                   help="SFT token budget")
    p.add_argument("--max-tokens", type=int, default=2048, help="longest trajectory kept")
    p.add_argument("--dev-size", type=int, default=200)
    p.add_argument("--test-size", type=int, default=500)
    p.add_argument("--limit", type=int, default=None, help="questions per source (quick run)")
    p.add_argument("--described", type=float, default=BuildConfig.described,
                   help="share of single-hop questions that describe their subject")
    p.add_argument("--workers", type=int, default=1, help="data clean worker processes")
    p.add_argument("--no-clean", action="store_true", help="skip data clean / stats")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    start = time.monotonic()
    settings = load_settings(search="local", visit="local")
    toolbox = build_toolbox(settings, progress=True)
    counter = embedded_counter(args.tokenizer)
    if counter.tokenizer is not None:
        counter.tokenizer.save_pretrained(str(args.out / "tokenizer"))
    try:
        cfg = BuildConfig(
            out=args.out, seed=args.seed, mix_path=None if args.no_mix else args.mix,
            current_date=args.current_date, sft_tokens=args.sft_tokens,
            max_tokens=args.max_tokens, dev_size=args.dev_size, test_size=args.test_size,
            limit=args.limit, described=args.described,
        )
        result = build(cfg, load_articles(), toolbox, counter)
    finally:
        close_quietly(toolbox)
    report = result.report
    if not args.no_clean and result.sft:
        t = time.monotonic()
        stats = clean(args.out, args.current_date, args.workers)
        report["clean"] = {
            "rows": stats.get("rows"), "drop_reasons": stats.get("drop_reasons"),
            "correctness": stats.get("correctness"), "seconds": round(time.monotonic() - t, 1),
        }
    report["seconds"]["total"] = round(time.monotonic() - start, 1)
    (args.out / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False),
                                          encoding="utf-8")
    log.info("wrote %s", args.out / "report.json")
    print(json.dumps({k: report[k] for k in ("questions", "splits", "teacher", "outputs",
                                             "tokens", "seconds")}, indent=1))
    if "clean" in report:
        print(json.dumps(report["clean"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

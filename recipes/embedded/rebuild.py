"""Rebuild the embedded model's shipped adapter from scratch and print the table (issue #17).

    python recipes/embedded/rebuild.py --out runs/recipe          # the full recipe, ~6 h on 2 cores
    python recipes/embedded/rebuild.py --out /tmp/mini --mini     # a few rows and steps (CI)

Stages, each a plain drvenus command (printed as it runs; a rerun skips finished stages):

1. data: ``build_data.py`` (questions, teacher trajectories, ``drvenus data clean`` + stats);
2. SFT: ``drvenus sft --config sft.yaml`` (LoRA on the embedded GGUF), then
   ``drvenus models export-adapter`` -> ``OUT/sft.gguf``;
3. RL: ``drvenus rl --config rl.yaml`` (IGPO, the SFT adapter trains further) on the RL
   questions, then ``export-adapter`` -> ``OUT/rl.gguf``;
4. evaluation: ``evaluate.py`` for base, SFT and SFT + RL on the natural dev questions, the
   build's title-named dev questions and HotpotQA-paragraphs; the table goes to
   ``OUT/eval-runs/table.md``.

The shipped file is ``OUT/rl.gguf`` (copied to ``src/drvenus/llm/adapters/`` by hand, with the
model card updated from the table).
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
from pathlib import Path

from drvenus.config import load_settings
from drvenus.llm.embedded import embedded_model_path

log = logging.getLogger("rebuild")
HERE = Path(__file__).resolve().parent


def sh(*cmd: str, check: bool = True) -> int:
    """Run ``cmd`` (logged first); its exit code (``check``: raise on a non-zero one)."""
    log.info("$ %s", " ".join(cmd))
    return subprocess.run(cmd, check=check).returncode


def drvenus(*args: str, check: bool = True) -> int:
    return sh(sys.executable, "-m", "drvenus", *args, check=check)


def latest_checkpoint(folder: Path) -> Path:
    from drvenus.train.rl.trainer import checkpoints  # complete ones only, in step order

    found = checkpoints(folder)
    if not found:
        raise SystemExit(f"{folder}: no RL checkpoint")
    return found[-1]


def default_base() -> Path:
    """The embedded GGUF where drvenus keeps it (an installed package's, else the settings'
    models folder, by default under the cache), pulled if need be."""
    return embedded_model_path(load_settings().models_root())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/recipe"))
    p.add_argument("--base", type=Path, default=None,
                   help="the base GGUF (default: the embedded model, pulled if need be)")
    p.add_argument("--mini", action="store_true",
                   help="a miniature run: tiny data, 2 SFT steps, 1 RL step, one natural and one "
                   "templated question a stage, one agent step each")
    p.add_argument("--skip-eval", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    out: Path = args.out
    base = args.base or default_base()
    mini = args.mini

    clean = out / "clean" / "cleaned_resampled.parquet"
    if not clean.is_file():
        sh(sys.executable, str(HERE / "build_data.py"), "--out", str(out), "--tokenizer", str(base),
           *(["--limit", "80", "--sft-tokens", "6000", "--dev-size", "6", "--test-size", "6"]
             if mini else []))

    sft_dir = out / "sft"
    if not (sft_dir / "final" / "adapter_config.json").is_file():
        drvenus("sft", "--config", str(HERE / "sft.yaml"), "--train", str(clean),
                "--model", str(base), "--output", str(sft_dir), "--resume",
                *(["--max-steps", "2", "--global-batch-size", "2", "--eval-steps", "1",
                   "--save-steps", "1"] if mini else []))
    sft_gguf = out / "sft.gguf"
    if not sft_gguf.is_file():
        drvenus("models", "export-adapter", str(sft_dir / "final"), "-o", str(sft_gguf))

    rl_dir = out / "rl"
    rl_gguf = out / "rl.gguf"
    if not rl_gguf.is_file():
        drvenus("rl", "--config", str(HERE / "rl.yaml"), "--train",
                str(out / "rl" / "train-rl.jsonl"), "--model", str(sft_dir / "final"),
                "--output", str(rl_dir / "run"), "--resume",
                *(["--total-steps", "1", "--batch-size", "1", "--n-rollouts", "2",
                   "--max-turns", "2", "--max-response-len", "48"] if mini else []))
        drvenus("models", "export-adapter", str(latest_checkpoint(rl_dir / "run")),
                "-o", str(rl_gguf))

    if not args.skip_eval:
        sh(sys.executable, str(HERE / "evaluate.py"), "--data", str(out),
           "--stage", "base=", "--stage", f"sft={sft_gguf}", "--stage", f"sft+rl={rl_gguf}",
           *(["--natural", "1", "--templated", "1", "--hotpot", "0", "--max-steps", "1"]
             if mini else []))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""LoRA SFT of the embedded model on CPU: fp32 (what ``--precision auto`` gives on a CPU) against
bf16 autocast (``--precision bf16``: the frozen base in bf16, the LoRA weights fp32), as the
embedded recipe trains (recipes/embedded/sft.yaml: rank 16 on every linear layer, global batch 4,
micro batch 1, loss on assistant tokens).

Rows: the recipe's own SFT rows when ``--data`` is given (a ``cleaned_resampled.parquet`` or JSONL
of ``messages``), else the shared DR-Venus trajectories, each cut to at most ``L`` tokens for every
``L`` of ``--lengths``: the cost of a step as rows grow. Reports real (non-padding) tokens per
second of training (tokenisation and loading excluded) and the bf16/fp32 ratio; the last
training loss of each run shows that both learn the same thing.

Usage: ``python benchmarks/bench_sft_precision.py [--model EMBEDDED.gguf] [--data ROWS]
[--lengths 512 1024 2048] [--steps 4] [--batch 4]``. On a CPU without native bf16 (no
AVX512-BF16 / AMX) bf16 is emulated and slower: the table says so.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path

import torch

from _embedded_tokenizer import TEST_MODELS
from drvenus.llm.embedded import embedded_model_path
from drvenus.train.sft import SFTConfig, read_conversations, train

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "trajectories" / "dr-venus-sft"


def native_bf16() -> bool:
    try:
        return bool(torch.backends.mkldnn.is_available()
                    and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def run(model: str, data: Path, out: Path, precision: str, length: int, steps: int,
        batch: int) -> tuple[float, float]:
    """Tokens per second and the last logged training loss of ``steps`` optimiser steps (one
    pass over the ``batch * steps`` rows)."""
    config = SFTConfig(train=str(data), model=model, output=str(out), max_length=length,
                       over_length="truncate", global_batch_size=batch, micro_batch_size=1,
                       max_steps=steps, learning_rate=3e-4, lora=True, lora_r=16,
                       lora_alpha=32, lora_target_modules="all-linear", precision=precision,
                       val_fraction=0.0, save_steps=10_000, logging_steps=1, seed=17,
                       shuffle=False)
    result = train(config)
    history = result.log_history
    runtime = next(e["train_runtime"] for e in history if "train_runtime" in e)
    losses = [e["loss"] for e in history if "loss" in e]
    last = float(losses[-1]) if losses else float("nan")
    return result.data_stats["train"]["tokens"] / runtime, last


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None,
                        help="default: the embedded GGUF (pulled to the test models folder)")
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4, help="rows a step (the recipe's 4)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    model = args.model or str(embedded_model_path(TEST_MODELS))  # as the other benchmarks
    rows = read_conversations(args.data or SHARED)[: args.steps * args.batch]
    print(f"torch threads {torch.get_num_threads()}, native bf16: {native_bf16()}, "
          f"{len(rows)} rows, {args.steps} steps of {args.batch} rows")
    print(f"{'max tokens':>10} {'fp32 tok/s':>11} {'bf16 tok/s':>11} {'ratio':>6} "
          f"{'fp32 loss':>10} {'bf16 loss':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        data = folder / "rows.jsonl"
        data.write_text("".join(json.dumps({"messages": r}) + "\n" for r in rows))
        for length in args.lengths:
            fp32, loss32 = run(model, data, folder / f"fp32-{length}", "fp32", length,
                               args.steps, args.batch)
            bf16, loss16 = run(model, data, folder / f"bf16-{length}", "bf16", length,
                               args.steps, args.batch)
            print(f"{length:>10} {fp32:>11,.0f} {bf16:>11,.0f} {bf16 / fp32:>5.2f}x "
                  f"{loss32:>10.3f} {loss16:>10.3f}")


if __name__ == "__main__":
    main()

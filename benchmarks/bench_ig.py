"""IG scoring of a 30-turn trajectory: KV-cache path versus naive recomputation, against one
forward pass over the trajectory (target: KV-cache <= 1.5x one forward).

The trajectory is a real shared DR-Venus SFT trajectory (first ``--turns`` assistant turns,
ChatML, embedded SmolLM2 tokenizer, each message cut to ``--clip-chars``); the model is a
random Llama of the given size (weights do not change the cost). Every boundary is scored (no
tool filter). Each measurement runs in its own process so its peak memory (RSS on CPU, allocator
peak on CUDA) is its own.
Usage: ``python benchmarks/bench_ig.py [--hidden 256 --layers 4 --clip-chars 1200]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from drvenus.llm.embedded import embedded_model_path
from drvenus.train.rl.ig import boundary_scores, boundary_scores_naive, pseudo_answer

log = logging.getLogger("bench_ig")
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "trajectories" / "dr-venus-sft"
MODES = ("forward", "prefill", "kv", "naive")


def trajectory(tok, turns: int, clip: int) -> tuple[list[int], list[int], str]:
    """Token ids, the boundary before each assistant turn, and the ground truth (every message
    cut to ``clip`` characters)."""
    path = max(SHARED.glob("*.json"), key=lambda p: len(json.loads(p.read_text())["messages"]))
    row = json.loads(path.read_text())
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    ids: list[int] = []
    bounds: list[int] = []
    for m in row["messages"]:
        if m["role"] == "assistant":
            if len(bounds) == turns:
                break
            ids += enc("<|im_start|>assistant\n")
            bounds.append(len(ids))
            ids += enc(m["content"][:clip] + "<|im_end|>\n")
        else:
            ids += enc(f"<|im_start|>{m['role']}\n{m['content'][:clip]}<|im_end|>\n")
    return ids, bounds, row["gt"]


def measure(mode: str, args: argparse.Namespace) -> dict:
    gguf = embedded_model_path(Path(tempfile.gettempdir()) / "drvenus-test-models")
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    ids, bounds, gt = trajectory(tok, args.turns, args.clip_chars)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=args.hidden, num_hidden_layers=args.layers,
        intermediate_size=args.hidden * 3, num_attention_heads=max(1, args.hidden // 64),
        num_key_value_heads=max(1, args.hidden // 128), max_position_embeddings=65536,
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = LlamaForCausalLM(cfg).to(device).eval()
    pseudo, span = pseudo_answer(tok, gt)
    x = torch.tensor([ids], device=device)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    with torch.no_grad():
        if mode == "forward":
            model(input_ids=x, use_cache=False)
        elif mode == "prefill":
            model(input_ids=x, use_cache=False, logits_to_keep=1)
        elif mode == "kv":
            boundary_scores(model, ids, bounds, pseudo, span)
        else:
            boundary_scores_naive(model, ids, bounds, pseudo, span)
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_rss) / 1024
    return {"mode": mode, "seconds": time.perf_counter() - start, "peak_mib": peak,
            "tokens": len(ids), "boundaries": len(bounds), "device": device}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--clip-chars", type=int, default=1200)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--only", choices=MODES)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.only:
        sys.stdout.write(json.dumps(measure(args.only, args)) + "\n")
        return
    res = {}
    for mode in MODES:
        out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--only", mode],
                             check=True, capture_output=True, text=True).stdout
        res[mode] = json.loads(out.strip().splitlines()[-1])
    f = res["forward"]
    log.info("IG scoring, %d tokens, %d boundaries, %s, Llama hidden %d x %d layers",
             f["tokens"], f["boundaries"], f["device"], args.hidden, args.layers)
    log.info("%-8s %9s %10s %12s", "path", "seconds", "peak MiB", "x forward")
    for mode in MODES:
        r = res[mode]
        log.info("%-8s %9.3f %10.1f %12.2f", mode, r["seconds"], r["peak_mib"],
                 r["seconds"] / f["seconds"])
    log.info("kv vs naive: %.1fx faster", res["naive"]["seconds"] / res["kv"]["seconds"])


if __name__ == "__main__":
    main()

"""IG scoring of a 30-turn trajectory: our KV-cache path against the way DR-Venus's rollout IG
scores it, a prompt log-prob request per boundary to the vLLM server, and against one forward
pass over the trajectory.

What DR-Venus sends (``RL/scrl/llm_agent/dr_agent_loop.py``, ``_score_ig_at_turn``, with
``IGPO_ROLLOUT_IG=1``): at every scored turn, the turn's prompt ids (the boundary, generation
header included) + the pseudo answer ``"Now there's enough information to answer\\n</think>\\n
<answer>\\n{gt}\\n</answer><|im_end|>"`` as one request with ``prompt_logprobs=1, max_tokens=1``
(verl's ``vLLMHttpServer.compute_prompt_logprobs``); the score is the mean log-prob of the gt
tokens. The baselines simulate that server with transformers on CPU:

- ``vllm-apc``, the baseline: vLLM with automatic prefix caching reused for these requests, as
  DR-Venus's docstring assumes ("*current_ids* should be a cache hit"). Each request reuses the
  KV blocks (16 tokens, full blocks only) of the longest prefix already computed (the previous
  requests'), runs the rest as chunked prefill (``max_num_batched_tokens`` = 8192, DR-Venus's
  setting) and computes log-softmax over the vocabulary at every computed prompt position (what
  ``prompt_logprobs`` needs). The cost of turning ~16K positions into Python ``Logprob``
  objects per request is not counted.
- ``vllm``: what vLLM really does with these requests: ``SamplingParams`` sets
  ``skip_reading_prefix_cache`` when ``prompt_logprobs`` is asked for (the default DR-Venus's
  call keeps), so every request prefills its whole prompt again.
- ``naive`` (``--modes``, off by default): ``boundary_scores_naive``, the test oracle.

References: ``forward`` (one forward over the trajectory with the full logits, the work of a
``prompt_logprobs`` pass over the finished trajectory) and ``prefill`` (one forward computing
the last token's logits only: the least any forward over the trajectory needs). Ours (``kv``,
``drvenus.train.rl.ig.boundary_scores``): one chunked forward builds the KV cache with no
logits, then each boundary crops it and runs one token + the pseudo answer on top.

The trajectory is a real shared DR-Venus SFT trajectory (first ``--turns`` assistant turns,
ChatML, embedded SmolLM2 tokenizer, each message cut to ``--clip-chars``); the model is a random
Llama of the given size (weights do not change the cost). Every boundary is scored (no tool
filter). Each measurement runs in its own process with ``--threads`` torch threads (default 1:
a shared machine gives unstable multi-thread timings), so its peak memory (RSS on CPU,
allocator peak on CUDA) is its own; on CPU the ratios compare the process's CPU time (one
thread: the work done, which other jobs on the machine barely change, unlike wall time), best
of ``--repeat`` rounds; every path's scores are compared with ours. ``kv-one-chunk``: ours with
the cache built in one forward (``ig_chunk_size`` >= the trajectory; the default 8192 bounds
the memory of a 200K-token trajectory).
Usage: ``python benchmarks/bench_ig.py [--hidden 256 --layers 4 --clip-chars 1200 --threads 1
--repeat 1 --modes ... --chunk-size N]``
(smallest: ``--turns 3 --clip-chars 200 --hidden 64 --layers 1 --same-process``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import math
import os
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, DynamicCache, LlamaConfig, LlamaForCausalLM

from _embedded_tokenizer import embedded_tokenizer_dir
from drvenus.train.rl.config import RLConfig
from drvenus.train.rl.ig import boundary_scores, boundary_scores_naive, pseudo_answer

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "trajectories" / "dr-venus-sft"
MODES = ("forward", "prefill", "kv", "kv-one-chunk", "vllm-apc", "vllm", "naive")
DEFAULT_MODES = "forward,prefill,kv,kv-one-chunk,vllm-apc,vllm"
LABELS = {
    "forward": "one forward, full logits",
    "prefill": "one forward, last-token logits only",
    "kv": "ours: KV cache, pseudo answer per boundary",
    "kv-one-chunk": "ours, the cache built in one forward (ig_chunk_size >= trajectory)",
    "vllm-apc": "baseline: vLLM prompt_logprobs per boundary, prefix cache reused",
    "vllm": "vLLM prompt_logprobs as it runs them (prefix cache not read)",
    "naive": "naive: re-run every prefix (test oracle)",
}
BLOCK = 16  # vLLM's KV block: the prefix cache holds full blocks only
MAX_BATCHED_TOKENS = 8192  # DR-Venus's actor_rollout_ref.rollout.max_num_batched_tokens


def trajectory(tok: Any, turns: int, clip: int) -> tuple[list[int], list[int], str]:
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


class PromptLogprobServer:
    """A vLLM-like engine for ``prompt_logprobs=1`` requests on a transformers model: one KV
    cache holding the last computed prompt, reused up to the longest shared prefix (whole
    blocks) when ``prefix_caching``; chunked prefill; log-softmax at every computed position."""

    def __init__(self, model: Any, prefix_caching: bool) -> None:
        self.model, self.prefix_caching = model, prefix_caching
        self.device = next(model.parameters()).device
        params = inspect.signature(model.forward).parameters
        self.cache_key = "cache" if "cache" in params else "past_key_values"  # transformers 5
        self.cache = DynamicCache(config=model.config)
        self.cached: list[int] = []
        self.computed = 0  # prompt tokens run through the model, all requests

    def _hit(self, prompt: Sequence[int], first_needed: int) -> int:
        """Cached tokens this request may reuse: the longest common prefix with what the cache
        holds, in whole blocks, leaving the positions whose logits are asked for."""
        if not self.prefix_caching:
            return 0
        common = 0
        for a, b in zip(self.cached, prompt, strict=False):
            if a != b:
                break
            common += 1
        return min(common, len(prompt) - 1, first_needed) // BLOCK * BLOCK

    def prompt_logprobs(self, prompt: Sequence[int], first_needed: int) -> list[float | None]:
        """Log-prob of each prompt token given the ones before it (None where not computed:
        the first token and the reused prefix). ``first_needed``: the first position whose
        logits the caller reads (the cache is reused up to it at most)."""
        hit = self._hit(prompt, first_needed)
        if hit == 0:
            self.cache = DynamicCache(config=self.model.config)
        elif self.cache.get_seq_length() > hit:
            self.cache.crop(hit - self.cache.get_seq_length())
        out: list[float | None] = [None] * (hit + 1)
        x = torch.tensor([list(prompt)], dtype=torch.long, device=self.device)
        for i in range(hit, len(prompt), MAX_BATCHED_TOKENS):
            chunk = x[:, i : i + MAX_BATCHED_TOKENS]
            kw = {self.cache_key: self.cache}
            logits = self.model(input_ids=chunk, use_cache=True, **kw).logits
            logp = torch.log_softmax(logits[0].float(), dim=-1)
            logp.topk(1, dim=-1)  # prompt_logprobs=1 also returns each position's top token
            nxt = x[0, i + 1 : i + 1 + chunk.shape[1]]
            out += logp[: len(nxt)].gather(1, nxt.unsqueeze(1)).squeeze(1).tolist()
        self.computed += len(prompt) - hit
        self.cached = list(prompt)
        return out


def vllm_scores(model: Any, ids: list[int], bounds: list[int], pseudo: list[int],
                span: tuple[int, int], prefix_caching: bool) -> tuple[dict[int, float | None], int]:
    """DR-Venus's rollout IG: one request per boundary, in turn order, prompt = the boundary's
    ids + the pseudo answer; the mean log-prob of the gt tokens. Returns the scores and the
    prompt tokens computed."""
    server = PromptLogprobServer(model, prefix_caching)
    lo, hi = span
    scores: dict[int, float | None] = {}
    for b in bounds:
        lps = server.prompt_logprobs(ids[:b] + pseudo, first_needed=b + lo - 1)
        picked = [lps[b + k] for k in range(lo, hi)]
        vals = [v for v in picked if v is not None]
        mean = sum(vals) / len(vals) if vals else math.nan
        scores[b] = mean if math.isfinite(mean) else None
    return scores, server.computed


def measure(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
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
    scores: dict[int, float | None] = {}
    start, cpu = time.perf_counter(), time.process_time()
    with torch.no_grad():
        if mode == "forward":
            model(input_ids=x, use_cache=False)
            computed = len(ids)
        elif mode == "prefill":
            model(input_ids=x, use_cache=False, logits_to_keep=1)
            computed = len(ids)
        elif mode in ("kv", "kv-one-chunk"):
            chunk = len(ids) if mode == "kv-one-chunk" else args.chunk_size
            scores = boundary_scores(model, ids, bounds, pseudo, span, chunk_size=chunk)
            computed = max(bounds) - 1 + len(bounds) * (1 + len(pseudo))
        elif mode == "naive":
            scores = boundary_scores_naive(model, ids, bounds, pseudo, span)
            computed = sum(b + len(pseudo) for b in bounds)
        else:
            scores, computed = vllm_scores(model, ids, bounds, pseudo, span,
                                           prefix_caching=mode == "vllm-apc")
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_rss) / 1024
    return {"mode": mode, "seconds": seconds, "cpu_seconds": cpu, "peak_mib": peak,
            "tokens": len(ids), "boundaries": len(bounds), "computed": computed, "device": device,
            "threads": torch.get_num_threads(), "scores": {str(k): v for k, v in scores.items()}}


def max_diff(a: dict[str, float | None], b: dict[str, float | None]) -> float:
    """Largest absolute score difference (inf if one path scores a boundary the other does not)."""
    worst = 0.0
    for key in a.keys() | b.keys():
        x, y = a.get(key), b.get(key)
        if x is None or y is None:
            if x is not y:
                return math.inf
            continue
        worst = max(worst, abs(x - y))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--clip-chars", type=int, default=1200)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per measurement")
    parser.add_argument("--modes", default=DEFAULT_MODES, help=f"comma-separated among {MODES}")
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds over the modes (in turn, so load drifts hit all); the best "
                        "time of each mode is reported")
    parser.add_argument("--clock", choices=("cpu_seconds", "seconds"), default=None,
                        help="what the ratios compare: the process's CPU time (the default on "
                        "CPU: with one thread, the work done whatever else runs on the machine) "
                        "or wall time (the default on CUDA)")
    parser.add_argument("--chunk-size", type=int, default=None,
                        help="ours: trajectory tokens per forward when building the cache "
                        "(default: RLConfig's ig_chunk_size, 8192)")
    parser.add_argument("--same-process", action="store_true",
                        help="measure every mode in this process (quick; no peak memory)")
    parser.add_argument("--only", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer", help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.only:
        sys.stdout.write(json.dumps(measure(args.only, args)) + "\n")
        return
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}; choose among {MODES}")
    if not SHARED.is_dir():
        raise SystemExit(f"shared trajectories not found: {SHARED}")
    load = os.getloadavg()
    args.clock = args.clock or ("seconds" if torch.cuda.is_available() else "cpu_seconds")
    res: dict[str, dict[str, Any]] = {}
    tok_dir = embedded_tokenizer_dir()
    for _ in range(max(1, args.repeat)):
        for mode in modes:
            if args.same_process:
                args.tokenizer = str(tok_dir)
                r = {**measure(mode, args), "peak_mib": None}
            else:
                cmd = [sys.executable, __file__, *sys.argv[1:], "--only", mode,
                       "--tokenizer", str(tok_dir)]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                r = json.loads(out.strip().splitlines()[-1])
            if mode not in res or r[args.clock] < res[mode][args.clock]:
                res[mode] = r
    first = next(iter(res.values()))
    after = os.getloadavg()
    print(f"IG scoring, {first['tokens']} tokens, {first['boundaries']} boundaries, "
          f"{first['device']}, {first['threads']} torch thread(s), random Llama hidden "
          f"{args.hidden} x {args.layers} layers, ours in chunks of "
          f"{args.chunk_size or RLConfig().ig_chunk_size}; best of {max(1, args.repeat)}; load "
          f"average before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, after {after[0]:.2f}")
    clock = args.clock
    refs = {k: res[k][clock] for k in ("prefill", "forward") if k in res}
    ref_scores = res["kv"]["scores"] if "kv" in res else None
    print(f"ratios on {'CPU' if clock == 'cpu_seconds' else 'wall'} time")
    head = "| path | CPU s | wall s | peak MiB | tokens computed |"
    head += "".join(f" x {'last-token' if k == 'prefill' else 'full-logits'} forward |"
                    for k in refs)
    head += " max abs score diff vs ours |"
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    for mode in modes:
        r = res[mode]
        ratios = "".join(f" {r[clock] / s:.2f} |" for s in refs.values())
        diff = "-"
        if ref_scores is not None and r["scores"]:
            diff = f"{max_diff(r['scores'], ref_scores):.1e}"
        peak = "-" if r["peak_mib"] is None else f"{r['peak_mib']:,.0f}"
        print(f"| {LABELS[mode]} | {r['cpu_seconds']:.2f} | {r['seconds']:.2f} | {peak} | "
              f"{r['computed']:,} |{ratios} {diff} |")
    if "kv" in res:
        kv = res["kv"][clock]
        for other in ("vllm-apc", "vllm", "naive"):
            if other in res:
                print(f"ours vs {other}: {res[other][clock] / kv:.2f}x faster")


if __name__ == "__main__":
    main()

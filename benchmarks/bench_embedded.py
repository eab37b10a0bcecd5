"""The embedded model's speed, and the wall time of `drvenus ask` on the embedded defaults.

Measures SmolLM2-135M (Q4_1 GGUF, llama.cpp in-process): load time, prompt evaluation tokens/s
on the agent's real first prompt, generation tokens/s with and without the protocol grammar,
then runs `python -m drvenus ask "Who wrote the novel Dracula?" --json` end to end.

Usage: python benchmarks/bench_embedded.py [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from drvenus.llm.llamacpp import LlamaCppModel

from drvenus import protocol
from drvenus.llm.base import SamplingParams
from drvenus.llm.embedded import EMBEDDED_GRAMMAR_OPTIONS, embedded_model_path

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "Who wrote the novel Dracula?"


def model_speed(runs: int) -> dict[str, float]:
    t0 = time.perf_counter()
    model = LlamaCppModel(
        embedded_model_path(), grammar_options=dict(EMBEDDED_GRAMMAR_OPTIONS), seed=0
    )
    load = time.perf_counter() - t0
    messages = protocol.initial_messages(QUESTION, protocol.build_system_prompt("2026-11-30"))
    prompt_tps, free_tps, grammar_tps = [], [], []
    for i in range(runs):
        # a fresh first message each run defeats llama.cpp's prompt-prefix cache
        fresh = [{"role": "system", "content": f"Run {i}. " + messages[0]["content"]}, messages[1]]
        t = time.perf_counter()
        one = SamplingParams(max_tokens=1, seed=i)
        g = asyncio.run(model.generate(fresh, one, constrained=False))
        prompt_tps.append(g.prompt_tokens / (time.perf_counter() - t))
        for constrained, sink in ((False, free_tps), ("search", grammar_tps)):
            t = time.perf_counter()
            params = SamplingParams(max_tokens=96, seed=i)
            g = asyncio.run(model.generate(fresh, params, constrained=constrained))
            sink.append(g.completion_tokens / (time.perf_counter() - t))
    asyncio.run(model.aclose())
    return {
        "load_s": load,
        "prompt_tok_s": statistics.median(prompt_tps),
        "gen_tok_s": statistics.median(free_tps),
        "gen_grammar_tok_s": statistics.median(grammar_tps),
    }


def ask_wall_time() -> tuple[float, dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    t = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-m", "drvenus", "ask", QUESTION, "--json"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    wall = time.perf_counter() - t
    return wall, json.loads(r.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    speed = model_speed(args.runs)
    wall, record = ask_wall_time()
    cpu = platform.processor() or platform.machine()
    cores = len(os.sched_getaffinity(0))
    print(f"machine: {cpu}, {cores} cores, python {platform.python_version()}")
    print(f"model load: {speed['load_s']:.2f} s")
    print(f"prompt evaluation: {speed['prompt_tok_s']:.0f} tokens/s")
    print(f"generation: {speed['gen_tok_s']:.0f} tokens/s free, "
          f"{speed['gen_grammar_tok_s']:.0f} tokens/s with the protocol grammar")
    print(f"drvenus ask wall time: {wall:.1f} s (termination {record['termination']}, "
          f"{record['tool_call_count']} tool calls, {record['turns']} turns)")


if __name__ == "__main__":
    main()

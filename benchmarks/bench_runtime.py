"""The embedded runtime: prompt cache per step, and `drvenus run` throughput with parallel slots.

1. Prompt cache: one 10-step research run with the embedded model (SmolLM2-135M Q4_1, llama.cpp
   in process, grammar on), with the KV prompt cache (ours) and with ``cache_prompt: false``
   (the baseline: every step re-evaluates the whole history). Same seed; per step it prints
   prompt tokens, tokens really evaluated and the wall time of the model call.
2. Throughput: the same questions through ``run_batch`` with 4 workers sharing one model
   through 4 slots (ours), and with 1 worker (the baseline: one question at a time).

Usage: python benchmarks/bench_runtime.py [--part cache|throughput|all] [--questions 8]
(smallest: ``--part cache --steps 1 --max-tokens 32``)
Results go to stdout and benchmarks/out/runtime.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from drvenus.agent import ResearchAgent, TraceEvent
from drvenus.batch import run_batch
from drvenus.config import load_settings
from drvenus.llm import embedded
from drvenus.llm.llamacpp import llamacpp_model
from drvenus.questions import Question
from drvenus.small.grammar import GrammarBuilder
from drvenus.small.levers import EMBEDDED_LEVERS
from drvenus.small.preset import EMBEDDED_AGENT
from drvenus.stack import build_stack, build_toolbox

OUT = Path(__file__).resolve().parent / "out"
QUESTION = "Who wrote the novel Dracula?"
QUESTIONS = [
    "Who wrote the novel Dracula?",
    "What is the capital of Sudan?",
    "Who painted the Mona Lisa?",
    "Which planet is known as the Red Planet?",
    "Who wrote the novel Lolita?",
    "What is the largest ocean on Earth?",
    "Who developed the theory of general relativity?",
    "What is the capital of Australia?",
    "Who composed the Ninth Symphony?",
    "In which country is the city of Kyoto?",
    "Who wrote Pride and Prejudice?",
    "What is the chemical symbol for gold?",
]


async def cached_run(cache: bool, steps: int, max_tokens: int | None = None
                     ) -> list[dict[str, float]]:
    """Per-step prompt/evaluated tokens and model seconds of one embedded run."""
    settings = load_settings()
    path = embedded.embedded_model_path(settings.models_root())
    model = llamacpp_model(
        path,
        name=embedded.EMBEDDED_NAME,
        window=embedded.EMBEDDED_WINDOW,
        grammar_builder=GrammarBuilder(EMBEDDED_LEVERS),
        extra_body=None if cache else {"cache_prompt": False},
    )
    config = replace(EMBEDDED_AGENT, max_steps=steps, max_context_tokens=7000, time_limit=900)
    if max_tokens:
        config = replace(config, sampling=replace(config.sampling, max_tokens=max_tokens))
    agent = ResearchAgent(model, build_toolbox(settings), config)
    rows: list[dict[str, float]] = []
    last = [time.perf_counter()]

    def on_event(event: TraceEvent) -> None:
        if event.type == "step_started":
            last[0] = time.perf_counter()
        if event.type == "model_output":
            prompt = event.data.get("prompt_tokens") or 0
            cached = event.data.get("cached_tokens") or 0
            rows.append({
                "step": event.step,
                "prompt_tokens": prompt,
                "evaluated": prompt - cached,
                "seconds": round(time.perf_counter() - last[0], 3),
            })
            last[0] = time.perf_counter()

    try:
        await agent.run(QUESTION, on_event)
    finally:
        await agent.tools.aclose()
        await model.aclose()
    return rows


def part_cache(steps: int, max_tokens: int | None = None) -> dict:
    result = {}
    for label, cache in (("ours (prompt cache)", True), ("baseline (no cache)", False)):
        rows = asyncio.run(cached_run(cache, steps, max_tokens))
        result[label] = rows
        print(f"\n{label}")
        print(f"{'call':>4} {'step':>4} {'prompt':>7} {'evaluated':>9} {'seconds':>8}")
        for i, r in enumerate(rows):
            print(f"{i:>4} {r['step']:>4} {r['prompt_tokens']:>7} {r['evaluated']:>9} "
                  f"{r['seconds']:>8.2f}")
        total_eval = sum(r["evaluated"] for r in rows)
        total_prompt = sum(r["prompt_tokens"] for r in rows)
        print(f"evaluated {total_eval} of {total_prompt} prompt tokens; "
              f"model time {sum(r['seconds'] for r in rows):.1f}s")
    return result


async def batch(workers: int, questions: list[str]) -> float:
    settings = load_settings()
    stack = build_stack(settings, parallel=workers)
    items = [Question(f"q{i}", q) for i, q in enumerate(questions)]
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        try:
            await run_batch(stack.agent, items, Path(tmp) / "out.jsonl", workers=workers)
        finally:
            await stack.aclose()
        return time.perf_counter() - start


def part_throughput(n: int) -> dict:
    questions = (QUESTIONS * (n // len(QUESTIONS) + 1))[:n]
    result = {}
    for label, workers in (("ours: 4 workers, 4 slots, one model", 4), ("baseline: 1 worker", 1)):
        seconds = asyncio.run(batch(workers, questions))
        result[label] = {"questions": n, "seconds": round(seconds, 1),
                         "questions_per_minute": round(60 * n / seconds, 2)}
        print(f"{label}: {n} questions in {seconds:.1f}s ({60 * n / seconds:.2f}/min)")
    ours, base = result.values()
    print(f"ratio: {ours['questions_per_minute'] / base['questions_per_minute']:.2f}x")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["cache", "throughput", "all"], default="all")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="tokens per model call in the cache part (default: the embedded "
                    "agent's; smoke runs)")
    args = ap.parse_args()
    report: dict = {"machine": f"{platform.machine()} {platform.processor()}".strip()}
    if args.part in ("cache", "all"):
        report["cache"] = part_cache(args.steps, args.max_tokens)
    if args.part in ("throughput", "all"):
        report["throughput"] = part_throughput(args.questions)
    OUT.mkdir(exist_ok=True)
    (OUT / "runtime.json").write_text(json.dumps(report, indent=2))
    medians = {
        k: statistics.median(r["evaluated"] for r in rows[1:]) if len(rows) > 1 else None
        for k, rows in report.get("cache", {}).items()
    }
    if medians:
        print(f"median evaluated tokens per later call: {medians}")


if __name__ == "__main__":
    main()

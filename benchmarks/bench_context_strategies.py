"""Context strategies on a small window: steps reached, prompt size, and re-prefilled tokens.

A scripted model that never stops searching (short turns, a unique query each time) reads
search results of ``--page-tokens`` tokens in a ``--window``-token context, up to ``--steps``
tool calls. The model stands in for a server with one prompt-cache slot (llama.cpp's slots,
vLLM's prefix cache): each request re-evaluates only what follows the longest prefix it shares
with the previous request and its reply. It reports that in its usage (``cached_tokens``), so
"evaluated" below is the agent's own token accounting (``usage.prompt_tokens_evaluated``).
"Re-prefilled" is the part of it the model had already evaluated once (messages that were in
the cache slot, evaluated again because something before them changed): the price a strategy
pays in prompt-cache misses, beyond the new pages every strategy must read.

Each strategy runs as drvenus does it (compaction only past 75% of the budget, freeing all it
can at once) and, as the baseline, compacting at every step (keep-last-k as MiroThinker applies
it, a summary every step): the same strategy, paying a prompt-cache miss every step.
``none`` is DR-Venus's behaviour: the forced answer when the budget fills.

Usage: python benchmarks/bench_context_strategies.py [--window 16384] [--page-tokens 2000]
       [--steps 200] [--keep-last 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter
from dataclasses import dataclass

from drvenus import protocol
from drvenus.agent import AgentConfig, ContextPolicy, ResearchAgent
from drvenus.llm.base import Generation, SamplingParams

CHARS_PER_TOKEN = 4
OVERHEAD = 4  # tokens a chat template adds per message
REPORT = ("Found so far: the candidate pages for the question, none conclusive yet. "
          "Next: search for the remaining clues.")


def tokens(text: str) -> int:
    return len(text) // CHARS_PER_TOKEN


def prompt_size(messages: list[dict[str, str]]) -> int:
    return sum(tokens(m["content"]) + OVERHEAD for m in messages)


def shared_prefix(a: list[dict[str, str]], b: list[dict[str, str]]) -> int:
    """Tokens of the longest common prefix of two conversations."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x == y:
            n += tokens(x["content"]) + OVERHEAD
            continue
        if x["role"] == y["role"]:
            common = 0
            for cx, cy in zip(x["content"], y["content"], strict=False):
                if cx != cy:
                    break
                common += 1
            n += common // CHARS_PER_TOKEN
        break
    return n


class EndlessSearcher:
    """Never stops searching; answers when told the limit is reached; writes a report when
    asked. Holds one cache slot: the previous prompt and its reply."""

    name = "endless-searcher"

    def __init__(self, window: int) -> None:
        self.window = window
        self.slot: list[dict[str, str]] = []
        self.queries = 0
        self.max_prompt = 0
        self.reprefilled = 0

    async def generate(self, messages, params: SamplingParams, *, grammar=None, state=None,
                       timeout=None):
        last = messages[-1]["content"]
        if last == protocol.SUMMARY_REQUEST:
            text = REPORT
        elif protocol.notice_kind(protocol.unwrap_tool_response(last) or "") in (
            "context_limit", "step_limit"
        ):
            text = protocol.render_answer_turn("Out of room.", "best guess")
        else:
            self.queries += 1
            body = json.dumps({"name": "search", "arguments": {"query": [f"q{self.queries}"]}})
            text = protocol.render_tool_call_turn("Search on.", body)
        prompt = prompt_size(messages)
        self.max_prompt = max(self.max_prompt, prompt)
        cached = shared_prefix(messages, self.slot)
        seen = Counter((m["role"], m["content"]) for m in self.slot)
        new = sum(tokens(c) + OVERHEAD for (_, c), n in
                  (Counter((m["role"], m["content"]) for m in messages) - seen).items()
                  for _ in range(n))
        self.reprefilled += max(0, prompt - cached - new)
        self.slot = [*messages, {"role": "assistant", "content": text}]
        return Generation(text, prompt_tokens=prompt, completion_tokens=tokens(text),
                          cached_tokens=cached)

    def count_tokens(self, text: str) -> int:
        return tokens(text)

    async def context_window(self) -> int | None:
        return self.window

    async def aclose(self) -> None:
        return None


class Pages:
    def __init__(self, page_tokens: int) -> None:
        self.body = "x" * (page_tokens * CHARS_PER_TOKEN)

    async def call(self, tool_call) -> str:
        return self.body


@dataclass
class Row:
    label: str
    termination: str
    tool_calls: int
    max_prompt: int
    budget: int
    compactions: int
    evaluated: int
    model_calls: int
    reprefilled: int

    @property
    def per_step(self) -> float:
        return self.reprefilled / max(1, self.tool_calls)


def run(label: str, policy: ContextPolicy, args: argparse.Namespace) -> Row:
    model = EndlessSearcher(args.window)
    config = AgentConfig(max_steps=args.steps, max_attempts=1, backoff_base=0.0, context=policy)
    agent = ResearchAgent(model, Pages(args.page_tokens), config)
    record = asyncio.run(agent.run("Which page says it?"))
    fitted = agent._fitted or config
    assert model.max_prompt + fitted.sampling.max_tokens <= args.window, "prompt outgrew window"
    return Row(label, record.termination, record.tool_call_count, model.max_prompt,
               fitted.max_context_tokens, record.extra.get("compactions", 0),
               record.usage["prompt_tokens_evaluated"], record.usage["calls"], model.reprefilled)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=int, default=16_384)
    ap.add_argument("--page-tokens", type=int, default=2_000)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--keep-last", type=int, default=2)
    args = ap.parse_args()
    every_step = 1e-6  # compact_at: past any context at all, i.e. at every step
    k = args.keep_last
    pairs = [
        ("keep-last-k", ContextPolicy("keep-last-k", keep_last=k),
         ContextPolicy("keep-last-k", keep_last=k, compact_at=every_step)),
        ("summarise", ContextPolicy("summarise"),
         ContextPolicy("summarise", compact_at=every_step)),
    ]
    print(f"window {args.window} tokens, pages of {args.page_tokens} tokens, "
          f"up to {args.steps} tool calls, keep-last-k k={k}")
    rows = [run("none (DR-Venus)", ContextPolicy("none"), args)]
    ratios = []
    for name, ours, baseline in pairs:
        a, b = run(f"{name} (ours)", ours, args), run(f"{name}, every step", baseline, args)
        rows += [a, b]
        ratios.append((name, a, b))
    print("| strategy | termination | tool calls | max prompt / budget | compactions "
          "| model calls | evaluated tokens per step | re-prefilled tokens per step |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.label} | {r.termination} | {r.tool_calls} | {r.max_prompt} / {r.budget} "
              f"| {r.compactions} | {r.model_calls} | {r.evaluated / max(1, r.tool_calls):.0f} "
              f"| {r.per_step:.0f} |")
    for name, a, b in ratios:
        misses = (f"{b.per_step / a.per_step:.1f}x" if a.per_step
                  else f"{b.per_step:.0f} vs 0 tokens")
        print(f"{name}, every step / ours: re-prefilled per step {misses}, "
              f"compactions {b.compactions / max(1, a.compactions):.1f}x, "
              f"model calls {b.model_calls / max(1, a.model_calls):.2f}x")


if __name__ == "__main__":
    main()

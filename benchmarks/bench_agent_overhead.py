"""Agent-loop overhead per step at long context, ours vs re-tokenising the whole history.

A 200-step synthetic trajectory grows to about 200K tokens. The model and the tools are instant
(scripted); what is timed is the harness: parsing, repair, token accounting, events, message
bookkeeping. Time spent inside the simulated server and tools is subtracted. Token counts use a
real BPE tokenizer (the embedded SmolLM2 GGUF's vocabulary, loaded vocab-only).

- ours (server usage): the backend reports prompt/completion tokens, as vLLM, SGLang,
  llama-server and llama.cpp in-process do; the loop tokenises nothing.
- ours (local tokenizer): no usage numbers; each new message is tokenised once.
- baseline: before every generation the whole history is rendered with a ChatML template and
  tokenised again (what DR-Venus's reference inference does every step).

Usage: python benchmarks/bench_agent_overhead.py [--steps 200] [--tokens-per-result 700]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import statistics
import time

from drvenus import protocol
from drvenus.agent import AgentConfig, ResearchAgent
from drvenus.llm.base import Generation, SamplingParams

WORDS = (
    "history novel author castle vampire count letter journey london whitby ship storm "
    "professor blood garlic diary asylum doctor wife friend coffin earth transylvania carpathian "
    "1897 gothic horror irish theatre manager lyceum published constable archibald first edition "
    "research evidence source archive museum library university record census parish 1847 dublin"
).split()


def load_tokenizer():
    """SmolLM2's real BPE tokenizer: llama.cpp's own, through the in-process engine's
    ``/tokenize`` route on its loopback port (a few hundred microseconds of HTTP per call)."""
    import httpx

    from drvenus.config import load_settings
    from drvenus.llm.embedded import embedded_model_path
    from drvenus.llm.llamacpp import LlamaCppServer

    server = LlamaCppServer(embedded_model_path(load_settings().models_root()), window=512)
    engine = server._server
    key = server.api_key
    client = httpx.Client(
        base_url=engine.listening_address, headers={"Authorization": f"Bearer {key}"}
    )

    def tokenize(text: str, _server: LlamaCppServer = server) -> int:
        # ``_server`` keeps the engine alive: it shuts down when its server object is freed
        reply = client.post("/tokenize", json={"content": text, "add_special": False})
        return len(reply.json()["tokens"])

    return tokenize


def chatml(messages: list[dict[str, str]]) -> str:
    parts = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
    return "".join(parts) + "<|im_start|>assistant\n"


class InstantModel:
    """A new search call each step (the answer at the end). In ``usage`` mode it reports token
    usage like a server, computed on the "server side" (timed separately, not harness time)."""

    name = "instant"

    def __init__(self, tokenize, steps: int, mode: str) -> None:
        self.tokenize, self.steps, self.mode = tokenize, steps, mode
        self.n = 0
        self.server_seconds = 0.0
        self._server_cache: dict[int, int] = {}

    def _server_usage(self, messages: list[dict[str, str]]) -> int:
        t0 = time.perf_counter()
        total = 0
        for i, m in enumerate(messages):  # a server tokenises each message (cached by position)
            key = hash((i, m["content"]))
            if key not in self._server_cache:
                self._server_cache[key] = self.tokenize(m["content"]) + 4
            total += self._server_cache[key]
        self.server_seconds += time.perf_counter() - t0
        return total

    async def generate(self, messages, params: SamplingParams, **kw) -> Generation:
        if self.mode == "baseline":
            self.tokenize(chatml(messages))  # the harness re-counts the whole history
        self.n += 1
        if self.n > self.steps:
            text = "<think>\nEnough.\n</think>\n<answer>\nBram Stoker\n</answer>"
        else:
            call = {"name": "search", "arguments": {"query": [f"dracula author {self.n}"]}}
            think = f"Step {self.n}: I should look for more sources about the author of Dracula."
            text = f"<think>\n{think}\n</think>\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
        if self.mode == "usage":
            prompt = self._server_usage(messages)
            return Generation(text, prompt_tokens=prompt, completion_tokens=len(text) // 4)
        return Generation(text)

    def count_tokens(self, text: str) -> int:
        return self.tokenize(text)

    async def context_window(self) -> int | None:
        return None

    async def aclose(self) -> None:
        return None


class InstantTools:
    def __init__(self, tokens_per_result: int, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.words_per_hit = max(1, int(tokens_per_result * 0.6) // 10)

    async def call(self, tool_call: protocol.ToolCall) -> str:
        hits = []
        for i in range(10):
            snippet = " ".join(self.rng.choice(WORDS) for _ in range(self.words_per_hit))
            url = f"https://example.org/{i}"
            hits.append({"title": f"Result {i}", "url": url, "snippet": snippet})
        return protocol.render_search([(q, hits) for q in tool_call.arguments["query"]])


def run_once(tokenize, steps: int, tokens_per_result: int, mode: str):
    model = InstantModel(tokenize, steps, mode)
    config = AgentConfig(
        max_steps=steps + 1, max_context_tokens=10**9, backoff_base=0.0, current_date="2026-11-30"
    )
    agent = ResearchAgent(model, InstantTools(tokens_per_result), config)
    marks: list[tuple[float, float]] = []  # (wall time, server time so far) at each step start

    def on_event(event) -> None:
        if event.type == "step_started" and event.step >= 0:
            marks.append((time.perf_counter(), model.server_seconds))

    t0 = time.perf_counter()
    record = asyncio.run(agent.run("Who wrote the novel Dracula?", on_event))
    total = time.perf_counter() - t0 - model.server_seconds
    per_step = [(b[0] - a[0]) - (b[1] - a[1]) for a, b in zip(marks, marks[1:], strict=False)]
    return record, per_step, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--tokens-per-result", type=int, default=700)
    args = ap.parse_args()

    tokenize = load_tokenizer()
    runs = {
        mode: run_once(tokenize, args.steps, args.tokens_per_result, mode)
        for mode in ("usage", "local", "baseline")
    }
    exact = tokenize(chatml(runs["usage"][0].messages))
    cpu = platform.processor() or platform.machine()
    print(f"machine: {cpu}, python {platform.python_version()}, steps: {args.steps}")
    print(f"final context: {exact} tokens (full re-tokenisation); running counts: "
          + ", ".join(f"{m} {r[0].final_token_count}" for m, r in runs.items()))
    print(f"{'harness':28}{'median ms/step':>16}{'p90 ms/step':>14}{'total s':>10}")
    labels = {
        "usage": "ours (server usage)", "local": "ours (local tokenizer)", "baseline": "baseline"
    }
    for mode, (_, xs, tot) in runs.items():
        p90 = statistics.quantiles(xs, n=10)[-1]
        print(f"{labels[mode]:28}{statistics.median(xs) * 1e3:16.2f}{p90 * 1e3:14.2f}{tot:10.2f}")
    base = statistics.median(runs["baseline"][1])
    for mode in ("usage", "local"):
        ours = statistics.median(runs[mode][1])
        verdict = "met" if ours <= 0.005 and base / ours >= 20 else "NOT met"
        print(f"ratio baseline / {labels[mode]}: {base / ours:.0f}x  (target <=5 ms and >=20x: "
              f"{verdict})")


if __name__ == "__main__":
    main()

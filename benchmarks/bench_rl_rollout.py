"""IGPO rollouts: throughput with concurrent agents against a local server of bounded capacity,
and the cost of building each turn's prompt.

Part ``throughput``: a local HTTP server in its own process speaks vLLM's token-in/token-out
``/v1/completions`` (``return_token_ids``) and stands in for a GPU server with a real batch
size: at most ``--max-num-seqs`` sequences decode at once (vLLM's ``max_num_seqs``; the others
wait in its queue), each at ``--ms-per-token`` per sampled token whatever the batch (decoding
is memory-bound; prefill is free, as with a warm prefix cache). The policy's turns are scripted
(search, visit, visit, answer, each with ``--think-tokens`` of thinking); the tools are the real
offline toolbox over the built-in corpus. For each capacity in ``--max-num-seqs``:

- ours (:func:`drvenus.train.rl.collect.run_rollouts`: agent loop + token recorder) with
  ``--concurrency`` trajectories in flight (``rollout_concurrency``), and with every
  trajectory of the batch in flight;
- DR-Venus's way (``RL/scrl/llm_agent/dr_agent_loop.py`` under verl's ``AgentLoopWorker``):
  every trajectory of the batch an asyncio task at once (``max_concurrent_samples`` unset, the
  default), each turn re-rendering the conversation with the chat template and re-tokenising it
  in the default thread pool, one token-in/token-out request, decode and parse, the tool call
  awaited, and at the end the whole conversation rendered and tokenised again (its prompt /
  response split). One worker process here (DR-Venus spreads a batch over 8).

Plus ours one trajectory at a time (the capacity does not matter for it). Rows: trajectories
per minute, the ratio to one at a time, the server's peak running sequences and mean queue wait.

Part ``prompt``: the prompt of every turn of a long trajectory (the longest shared DR-Venus SFT
trajectory, its turns repeated up to ``--turns``), built by our recorder (the new messages only)
versus re-rendering and re-tokenising the whole conversation each turn (what DR-Venus's rollout
loop does, and a re-tokenising recorder would do). Both produce the prompt ids; the table gives
the total seconds over all turns and the ratio.

Usage: python benchmarks/bench_rl_rollout.py [--part throughput,prompt] [--trajectories 32]
[--max-num-seqs 8,32] (smallest: ``--trajectories 2 --concurrency 2 --max-num-seqs 2
--think-tokens 10 --turns 5``).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "trajectories" / "dr-venus-sft"
QUESTION = ("Who wrote Dracula?", "Bram Stoker")
DATE = "2026-11-30"

SERVER = r'''
import json, sys, time, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
port, ms, capacity = int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[5])
turns = json.loads(sys.argv[4])
eos = tok.convert_tokens_to_ids("<|im_end|>")
start_id = tok.convert_tokens_to_ids("<|im_start|>")
encoded = [tok.encode(t, add_special_tokens=False) + [eos] for t in turns]
slots = threading.Semaphore(capacity)  # vLLM's max_num_seqs: the rest wait in the queue
lock = threading.Lock()
stats = {"requests": 0, "running": 0, "peak_running": 0, "wait_s": 0.0}
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def _send(self, body):
        data = json.dumps(body).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data))); self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path.endswith("/reset"):
            with lock:
                stats["peak_running"] = stats["running"]
        if self.path.endswith(("/stats", "/reset")):
            with lock:
                return self._send(dict(stats))
        self._send({"data": [{"id": "policy"}]})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["prompt"]
        k = min(prompt.count(start_id) // 2 - 1, len(turns) - 1)
        ids = encoded[max(k, 0)]
        queued = time.perf_counter()
        with slots:
            with lock:
                stats["requests"] += 1
                stats["wait_s"] += time.perf_counter() - queued
                stats["running"] += 1
                stats["peak_running"] = max(stats["peak_running"], stats["running"])
            time.sleep(len(ids) * ms / 1000.0)
            with lock:
                stats["running"] -= 1
        self._send({"choices": [{"text": turns[max(k, 0)], "token_ids": ids,
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": len(prompt)}})
ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer.request_queue_size = 1024
ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tokenizer_dir() -> Path:
    from _embedded_tokenizer import embedded_tokenizer_dir

    return embedded_tokenizer_dir()


def scripted_turns(think_tokens: int) -> list[str]:
    from drvenus.protocol import render_answer_turn, render_tool_call_turn

    thought = " ".join(["reasoning"] * think_tokens)
    calls = [{"name": "search", "arguments": {"query": ["Bram Stoker Dracula novel"]}},
             {"name": "visit", "arguments": {"url": ["https://en.wikipedia.org/wiki/Dracula"],
                                             "goal": "who wrote it"}},
             {"name": "visit", "arguments": {"url": ["https://en.wikipedia.org/wiki/Bram_Stoker"],
                                             "goal": "author"}}]
    turns = [render_tool_call_turn(thought, json.dumps(c)) for c in calls]
    return turns + [render_answer_turn(thought, "Bram Stoker")]


async def collect_ours(url: str, tok: Any, tools: Any, n: int, concurrency: int) -> float:
    from drvenus.train.rl.collect import RolloutConfig, run_rollouts
    from drvenus.train.rl.engine import ServerEngine

    engine = ServerEngine(url, tok, window=32768)
    cfg = RolloutConfig.from_rl(None, n=n, max_turns=10, max_turns_jitter=0,
                                concurrency=concurrency, current_date=DATE)
    start = time.perf_counter()
    out = await run_rollouts([QUESTION], engine, tools, cfg)
    seconds = time.perf_counter() - start
    await engine.aclose()
    bad = [r for r in out if r.tokens is None or r.result.termination != "answered"]
    if bad:
        raise SystemExit(f"{len(bad)} rollouts did not finish: {bad[0].result.error}")
    return seconds


async def collect_drvenus_style(url: str, tok: Any, tools: Any, n: int) -> float:
    """DR-Venus's agent loop's way of issuing requests (see the module doc), with our protocol
    (system prompt, turn parsing, tool-response wrapping) and the same tools and server."""
    import httpx

    from drvenus.protocol import (
        build_system_prompt,
        initial_messages,
        parse_turn,
        repair_turn,
        wrap_tool_response,
    )

    loop = asyncio.get_running_loop()
    system = build_system_prompt(DATE)
    client = httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=n + 4))

    def render(messages: list[dict[str, str]], generation: bool) -> str:
        return tok.apply_chat_template(messages, add_generation_prompt=generation,
                                       tokenize=False)

    def encode(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    async def one() -> bool:
        messages = initial_messages(QUESTION[0], system)
        answered = False
        for _ in range(10):
            text = await loop.run_in_executor(None, functools.partial(render, messages, True))
            ids = await loop.run_in_executor(None, functools.partial(encode, text))
            reply = await client.post(f"{url}/completions", json={
                "model": "policy", "prompt": ids, "max_tokens": 8192, "temperature": 1.0,
                "top_p": 0.95, "logprobs": 0, "return_token_ids": True})
            sampled = reply.json()["choices"][0]["token_ids"]
            raw = await loop.run_in_executor(
                None, functools.partial(tok.decode, sampled, skip_special_tokens=False))
            turn = parse_turn(repair_turn(raw.replace("<|im_end|>", "")))
            messages.append({"role": "assistant", "content": turn.content})
            if turn.kind != "tool_call" or turn.tool_call is None:
                answered = turn.kind == "answer"
                break
            result = await tools.call(turn.tool_call)
            messages.append({"role": "user", "content": wrap_tool_response(result)})
        # the end of a trajectory: prompt and whole conversation rendered and tokenised again
        prompt_text = await loop.run_in_executor(None, functools.partial(render, messages[:2],
                                                                         True))
        full_text = await loop.run_in_executor(None, functools.partial(render, messages, False))
        await loop.run_in_executor(None, functools.partial(encode, prompt_text))
        await loop.run_in_executor(None, functools.partial(encode, full_text[len(prompt_text):]))
        return answered

    start = time.perf_counter()
    done = await asyncio.gather(*(one() for _ in range(n)))  # the whole batch at once
    seconds = time.perf_counter() - start
    await client.aclose()
    if not all(done):
        raise SystemExit(f"{done.count(False)} DR-Venus-style rollouts did not answer")
    return seconds


class Server:
    """The simulated policy server (its own process) at one capacity."""

    def __init__(self, folder: Path, args: argparse.Namespace, capacity: int) -> None:
        import httpx

        self.capacity = capacity
        port = free_port()
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, str(folder), str(port),
                                      str(args.ms_per_token),
                                      json.dumps(scripted_turns(args.think_tokens)),
                                      str(capacity)])
        self.url = f"http://127.0.0.1:{port}/v1"
        for _ in range(300):
            if self.proc.poll() is not None:
                raise SystemExit("the simulated server died")
            try:
                httpx.get(f"{self.url}/models", timeout=1.0)
                return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise SystemExit("the simulated server did not start")

    def stats(self, reset: bool = False) -> dict[str, float]:
        """Requests, queue wait and peak running sequences (``reset``: the peak from now)."""
        import httpx

        return httpx.get(f"{self.url}/{'reset' if reset else 'stats'}", timeout=10).json()

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def part_throughput(args: argparse.Namespace) -> list[tuple[str, ...]]:
    from transformers import AutoTokenizer

    from drvenus.tools.toolbox import offline_toolbox

    folder = tokenizer_dir()
    tok = AutoTokenizer.from_pretrained(folder)
    n = args.trajectories
    tools = offline_toolbox(top_k=5)
    rows: list[tuple[str, ...]] = []
    one_s: float | None = None
    for capacity in [int(c) for c in args.max_num_seqs.split(",") if c.strip()]:
        server = Server(folder, args, capacity)
        try:
            asyncio.run(collect_ours(server.url, tok, tools, 2, 2))  # warm: index, connections
            runs: list[tuple[str, Any]] = []
            if one_s is None:
                runs.append(("ours, one trajectory at a time", lambda u: collect_ours(
                    u, tok, tools, n, 1)))
            runs += [
                (f"ours, {args.concurrency} in flight (`rollout_concurrency`)",
                 lambda u: collect_ours(u, tok, tools, n, args.concurrency)),
                (f"ours, all {n} in flight", lambda u: collect_ours(u, tok, tools, n, n)),
                (f"DR-Venus's loop: all {n} in flight, re-tokenising each turn",
                 lambda u: collect_drvenus_style(u, tok, tools, n)),
            ]
            for name, run in runs:
                before = server.stats(reset=True)
                seconds = asyncio.run(run(server.url))
                after = server.stats()
                if one_s is None:
                    one_s = seconds
                reqs = after["requests"] - before["requests"]
                wait = (after["wait_s"] - before["wait_s"]) / max(reqs, 1) * 1e3
                rows.append((str(capacity), name, f"{seconds:.1f}", f"{n / seconds * 60:.1f}",
                             f"{one_s / seconds:.1f}x", str(after["peak_running"]),
                             f"{wait:.0f}"))
        finally:
            server.close()
    asyncio.run(tools.aclose())
    return rows


def long_messages(turns: int) -> list[dict[str, str]]:
    path = max(SHARED.glob("*.json"), key=lambda p: len(json.loads(p.read_text())["messages"]))
    msgs = json.loads(path.read_text())["messages"]
    head, body = msgs[:2], msgs[2:]
    pairs = [body[i:i + 2] for i in range(0, len(body) - 1, 2)
             if body[i]["role"] == "assistant" and body[i + 1]["role"] == "user"]
    out = list(head)
    while len(out) < 2 + 2 * turns:
        out += pairs[(len(out) // 2) % len(pairs)]
    return out[: 2 + 2 * turns]


def part_prompt(args) -> list[tuple[str, str]]:
    from transformers import AutoTokenizer

    from drvenus.train.rl.recorder import ChatTemplateParts

    tok = AutoTokenizer.from_pretrained(tokenizer_dir())
    parts = ChatTemplateParts(tok)
    msgs = long_messages(args.turns)
    # the engine's sampled ids for each assistant turn (given, not timed)
    sampled = [tok.encode(msgs[2 + 2 * k]["content"], add_special_tokens=False)
               for k in range(args.turns)]
    start = time.perf_counter()
    ids = parts.prompt(msgs[:2])
    for k in range(args.turns - 1):
        ids = ids + sampled[k] + parts.closing(sampled[k]) + parts.continuation([msgs[3 + 2 * k]])
    ours = time.perf_counter() - start
    start = time.perf_counter()
    for k in range(args.turns):
        text = tok.apply_chat_template(msgs[: 2 + 2 * k], add_generation_prompt=True,
                                       tokenize=False)
        full = tok.encode(text, add_special_tokens=False)
    rerender = time.perf_counter() - start
    return [(f"re-render + re-tokenise every turn ({args.turns} turns, {len(full)} tokens at "
             "the end)", f"{rerender:.2f} s"),
            ("ours: append the new messages' ids", f"{ours:.3f} s, {rerender / ours:.0f}x")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", default="throughput,prompt")
    ap.add_argument("--trajectories", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-num-seqs", default="8,32",
                    help="server capacities (sequences decoding at once), comma-separated")
    ap.add_argument("--ms-per-token", type=float, default=2.0)
    ap.add_argument("--think-tokens", type=int, default=150)
    ap.add_argument("--turns", type=int, default=200)
    args = ap.parse_args()
    load = os.getloadavg()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, load average before "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for part in args.part.split(","):
        print(f"\n## {part}")
        if part == "throughput":
            print(f"{args.trajectories} trajectories, {args.ms_per_token} ms per sampled token, "
                  f"{args.think_tokens} thinking tokens a turn")
            print("| server max_num_seqs | collector | seconds | trajectories/min | vs one at a "
                  "time | peak running | mean queue wait ms |")
            print("|---|---|---|---|---|---|---|")
            for row in part_throughput(args):
                print("| " + " | ".join(row) + " |")
        else:
            for name, value in part_prompt(args):
                print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()

"""IGPO rollouts: throughput with concurrent agents against a local server, and the cost of
building each turn's prompt.

Part ``throughput``: a local HTTP server in its own process speaks vLLM's token-in/token-out
``/v1/completions`` (``return_token_ids``) and stands in for a GPU server: every request takes
``--ms-per-token`` per sampled token and requests run concurrently (a GPU server batches them).
The policy's turns are scripted (search, visit, visit, answer, each with ``--think-tokens`` of
thinking); the tools are the real offline toolbox over the built-in corpus. Our collector
(:func:`drvenus.train.rl.collect.run_rollouts`, agent loop + token recorder) runs the same
trajectories one at a time and with ``--concurrency`` in flight; rows report trajectories per
minute and the ratio.

Part ``prompt``: the prompt of every turn of a long trajectory (the longest shared DR-Venus SFT
trajectory, its turns repeated up to ``--turns``), built by our recorder (the new messages only)
versus re-rendering and re-tokenising the whole conversation each turn (what DR-Venus's rollout
loop does, and a re-tokenising recorder would do). Both produce the prompt ids; the table gives
the total seconds over all turns and the ratio.

Usage: python benchmarks/bench_rl_rollout.py [--part throughput,prompt] [--trajectories 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "trajectories" / "dr-venus-sft"

SERVER = r'''
import json, sys, time, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
port, ms = int(sys.argv[2]), float(sys.argv[3])
turns = json.loads(sys.argv[4])
eos = tok.convert_tokens_to_ids("<|im_end|>")
encoded = [tok.encode(t, add_special_tokens=False) + [eos] for t in turns]
lock = threading.Lock()
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def _send(self, body):
        data = json.dumps(body).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data))); self.end_headers()
        self.wfile.write(data)
    def do_GET(self): self._send({"data": [{"id": "policy"}]})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["prompt"]
        k = min(prompt.count(tok.convert_tokens_to_ids("<|im_start|>")) // 2 - 1, len(turns) - 1)
        ids = encoded[max(k, 0)]
        time.sleep(len(ids) * ms / 1000.0)
        self._send({"choices": [{"text": turns[max(k, 0)], "token_ids": ids,
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": len(prompt)}})
ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tokenizer_dir() -> Path:
    from transformers import AutoTokenizer

    from drvenus.llm.embedded import embedded_model_path

    gguf = embedded_model_path(Path(tempfile.gettempdir()) / "drvenus-test-models")
    folder = Path(tempfile.gettempdir()) / "drvenus-bench-tokenizer"
    if not (folder / "tokenizer_config.json").is_file():
        AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(folder)
    return folder


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


async def collect(url: str, tok, n: int, concurrency: int) -> float:
    from drvenus.tools.toolbox import offline_toolbox
    from drvenus.train.rl.collect import RolloutConfig, run_rollouts
    from drvenus.train.rl.engine import ServerEngine

    engine = ServerEngine(url, tok, window=32768)
    tools = offline_toolbox(top_k=5)
    cfg = RolloutConfig.from_rl(None, n=n, max_turns=10, max_turns_jitter=0,
                                concurrency=concurrency, current_date="2026-11-30")
    start = time.perf_counter()
    out = await run_rollouts([("Who wrote Dracula?", "Bram Stoker")], engine, tools, cfg)
    seconds = time.perf_counter() - start
    await engine.aclose()
    bad = [r for r in out if r.tokens is None or r.result.termination != "answered"]
    if bad:
        raise SystemExit(f"{len(bad)} rollouts did not finish: {bad[0].result.error}")
    return seconds


def part_throughput(args) -> list[tuple[str, str]]:
    from transformers import AutoTokenizer

    folder = tokenizer_dir()
    tok = AutoTokenizer.from_pretrained(folder)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(folder), str(port),
                             str(args.ms_per_token), json.dumps(scripted_turns(args.think_tokens))])
    url = f"http://127.0.0.1:{port}/v1"
    try:
        for _ in range(100):
            try:
                import httpx

                httpx.get(url.removesuffix("/v1") + "/v1/models", timeout=1.0)
                break
            except Exception:
                time.sleep(0.2)
        asyncio.run(collect(url, tok, 2, 2))  # warm: index, connections
        rows = []
        one = asyncio.run(collect(url, tok, args.trajectories, 1))
        many = asyncio.run(collect(url, tok, args.trajectories, args.concurrency))
        per_min = lambda s: args.trajectories / s * 60  # noqa: E731
        rows.append(("sequential (1 in flight)", f"{one:.1f} s, {per_min(one):.1f} traj/min"))
        rows.append((f"ours ({args.concurrency} in flight)",
                     f"{many:.1f} s, {per_min(many):.1f} traj/min, {one / many:.1f}x"))
        return rows
    finally:
        proc.terminate()
        proc.wait()


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
    ap.add_argument("--ms-per-token", type=float, default=2.0)
    ap.add_argument("--think-tokens", type=int, default=150)
    ap.add_argument("--turns", type=int, default=200)
    args = ap.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}")
    for part in args.part.split(","):
        rows = part_throughput(args) if part == "throughput" else part_prompt(args)
        print(f"\n## {part}")
        for name, value in rows:
            print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()

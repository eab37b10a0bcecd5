"""Tool server throughput: 32 concurrent clients sending repeated searches over loopback.

The server (``drvenus.tools.server.serve`` over the built-in corpus, one uvicorn worker) runs in
its own process; the clients are 32 httpx async tasks in this process, sending N searches drawn
in turn from a pool of distinct queries (so most are repeats, as in RL rollouts and batch runs
that share questions). Every answer is checked against the in-process ``Toolbox.call`` text;
a non-200 status or a different text counts as an error.

Rows, side by side in the same run:

- in-process, sequential: ``Toolbox.call`` one after another (one agent with its own tools).
- in-process, 32 concurrent: 32 asyncio tasks on one ``Toolbox`` (one process, no HTTP).
- server, no cache: the same server with ``cache_size=0`` (every request runs the search), one
  client sending one request at a time (what a request costs: the search plus HTTP), then the
  32 clients.
- server: the shipped defaults (response cache on), the same two ways.

Then what the server costs per request (its CPU time per request; one client's latency over the
in-process call's) and what it saves: the memory one process pays to hold its own toolbox (a
fresh process: RSS after loading the offline toolbox and answering each distinct query once,
less before), against the one server holding it for every client process.

Usage: python benchmarks/bench_tool_server.py [--requests 3000] [--clients 32] [--distinct 50]
[--processes 4] (smallest: ``--requests 40 --clients 4 --processes 1 --distinct 8``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from drvenus.protocol import ToolCall

SERVE = """
import sys
from drvenus.config import load_settings
from drvenus.tools.server import serve
from drvenus.tools.toolbox import offline_toolbox
toolbox = offline_toolbox(cache_dir=load_settings().cache_root())
serve(toolbox, "127.0.0.1", int(sys.argv[1]), None, cache_size=int(sys.argv[2]))
"""
TOPICS = (
    "Bram Stoker Dracula", "capital of France", "Jane Austen novel", "speed of light",
    "Python programming language", "Mount Everest height", "Roman Empire fall", "photosynthesis",
    "Isaac Newton gravity", "Great Wall of China", "World War II", "Albert Einstein relativity",
    "Amazon river", "William Shakespeare plays", "Moon landing 1969", "DNA double helix",
    "French Revolution", "Leonardo da Vinci", "Pacific Ocean depth", "Beethoven symphony",
)


@dataclass
class Row:
    name: str
    seconds: float
    latencies: list[float]
    errors: int
    server_cpu_ms: float | None = None  # server process CPU time per request

    def markdown(self) -> str:
        lat = sorted(self.latencies)
        p50 = statistics.median(lat) * 1e3
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3
        rps = len(lat) / self.seconds
        cpu = "-" if self.server_cpu_ms is None else f"{self.server_cpu_ms:.2f}"
        return (f"| {self.name} | {len(lat)} | {rps:,.0f} | {p50:.2f} | {p99:.2f} | {cpu} "
                f"| {self.errors} |")


def queries(distinct: int) -> list[str]:
    return [f"{TOPICS[i % len(TOPICS)]} {i // len(TOPICS) or ''}".strip() for i in range(distinct)]


async def expected_answers(toolbox, pool: list[str]) -> dict[str, str]:
    return {q: await toolbox.call(ToolCall("search", {"query": [q]})) for q in pool}


async def in_process(toolbox, pool, n: int, clients: int, expect: dict[str, str]) -> Row:
    latencies: list[float] = []
    errors = 0
    counter = iter(range(n))

    async def worker() -> None:
        nonlocal errors
        for i in counter:
            q = pool[i % len(pool)]
            t = time.perf_counter()
            body = await toolbox.call(ToolCall("search", {"query": [q]}))
            latencies.append(time.perf_counter() - t)
            errors += body != expect[q]

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    name = "in-process, sequential" if clients == 1 else f"in-process, {clients} concurrent"
    return Row(name, time.perf_counter() - start, latencies, errors)


class Agents:
    """``clients`` agents sending searches, each with its own httpx client (one connection)."""

    def __init__(self, url: str, pool: list[str], expect: dict[str, str], clients: int) -> None:
        self.pool, self.expect = pool, expect
        self.sessions = [httpx.AsyncClient(base_url=url, timeout=60) for _ in range(clients)]
        self.latencies: list[float] = []
        self.errors = 0

    async def _agent(self, client: httpx.AsyncClient, counter) -> None:
        for i in counter:
            q = self.pool[i % len(self.pool)]
            t = time.perf_counter()
            try:
                r = await client.post("/search", json={"query": [q]})
                ok = r.status_code == 200 and r.json()["content"] == self.expect[q]
            except httpx.HTTPError:
                ok = False
            self.latencies.append(time.perf_counter() - t)
            self.errors += not ok

    async def run(self, indices: range) -> None:
        counter = iter(indices)  # shared: each request is sent by whichever agent is free
        await asyncio.gather(*(self._agent(c, counter) for c in self.sessions))

    async def aclose(self) -> None:
        for c in self.sessions:
            await c.aclose()


def client_process(url, pool, expect, start, n, clients, barrier, results) -> None:
    """One process of client agents: warm up, wait for the others, run, report."""

    async def go() -> None:
        agents = Agents(url, pool, expect, clients)
        await agents.run(range(start, start + 2 * clients))  # open the connections
        agents.latencies.clear()
        agents.errors = 0
        barrier.wait()
        t0 = time.time()
        await agents.run(range(start, start + n))
        results.put((t0, time.time(), agents.latencies, agents.errors))
        await agents.aclose()

    asyncio.run(go())


def over_http(name: str, url: str, pool, expect, args: argparse.Namespace) -> Row:
    """``args.clients`` agents in ``args.processes`` processes against the server at ``url``."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    procs = args.processes
    barrier, results = ctx.Barrier(procs), ctx.Queue()
    share = args.requests // procs
    workers = [
        ctx.Process(target=client_process, args=(
            url, pool, expect, i * share, share, args.clients // procs, barrier, results))
        for i in range(procs)
    ]
    for w in workers:
        w.start()
    parts = [results.get(timeout=600) for _ in workers]
    for w in workers:
        w.join(60)
    latencies = [x for part in parts for x in part[2]]
    seconds = max(p[1] for p in parts) - min(p[0] for p in parts)
    return Row(name, seconds, latencies, sum(p[3] for p in parts))


def one_client(url: str, pool: list[str], expect: dict[str, str], n: int) -> Row:
    """One agent, one connection, one request at a time (after a warm-up request)."""

    async def go() -> Row:
        agents = Agents(url, pool, expect, 1)
        await agents.run(range(1))
        agents.latencies.clear()
        agents.errors = 0
        start = time.perf_counter()
        await agents.run(range(n))
        seconds = time.perf_counter() - start
        await agents.aclose()
        return Row("", seconds, agents.latencies, agents.errors)

    return asyncio.run(go())


TOOLBOX_RSS = """
import asyncio, sys
from drvenus.config import load_settings
from drvenus.protocol import ToolCall
from drvenus.tools.toolbox import offline_toolbox
def rss():
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("VmRSS:"))
before = rss()
toolbox = offline_toolbox(cache_dir=load_settings().cache_root())
async def go():
    for q in sys.argv[1:]:
        await toolbox.call(ToolCall("search", {"query": [q]}))
asyncio.run(go())
print((rss() - before) / 1024)
"""


def toolbox_rss_mib(pool: list[str]) -> float:
    """What one process pays in memory to hold its own offline toolbox (a fresh process that
    loads it and answers each query of the pool once)."""
    out = subprocess.run([sys.executable, "-c", TOOLBOX_RSS, *pool], check=True,
                         capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def peak_rss_mib(pid: int) -> float:
    """Peak resident memory of a process (Linux ``VmHWM``)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("VmHWM:")) / 1024


def start_server(cache_size: int) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src}
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(port), str(cache_size)], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server died: {proc.stderr.read().decode() if proc.stderr else ''}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("server did not start")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_rows(name: str, cache_size: int, pool, args, expect) -> tuple[list[Row], float]:
    """One client, then ``args.clients`` clients, against one server; and its peak RSS."""
    proc, url = start_server(cache_size)
    try:
        before = cpu_seconds(proc.pid)
        single = one_client(url, pool, expect, args.requests)
        single.name = f"{name}, 1 client, sequential"
        single.server_cpu_ms = (cpu_seconds(proc.pid) - before) / (len(single.latencies) + 1) * 1e3
        before = cpu_seconds(proc.pid)
        row = over_http(f"{name}, {args.clients} clients", url, pool, expect, args)
        warm = 2 * (args.clients // args.processes) * args.processes
        row.server_cpu_ms = (cpu_seconds(proc.pid) - before) / (len(row.latencies) + warm) * 1e3
        return [single, row], peak_rss_mib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)


def run_all(args: argparse.Namespace) -> tuple[list[Row], float]:
    """Every row, and the server's peak RSS (MiB, defaults)."""
    from drvenus.config import load_settings
    from drvenus.tools.toolbox import offline_toolbox

    pool = queries(args.distinct)

    async def local() -> tuple[list[Row], dict[str, str]]:
        toolbox = offline_toolbox(cache_dir=load_settings().cache_root())  # builds the index
        expect = await expected_answers(toolbox, pool)
        rows = [await in_process(toolbox, pool, args.requests, 1, expect),
                await in_process(toolbox, pool, args.requests, args.clients, expect)]
        await toolbox.aclose()
        return rows, expect

    rows, expect = asyncio.run(local())
    uncached, _ = server_rows("server, no cache", 0, pool, args, expect)
    cached, server_rss = server_rows("server (defaults)", 4096, pool, args, expect)
    return rows + uncached + cached, server_rss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--distinct", type=int, default=50, help="distinct queries in the pool")
    ap.add_argument("--processes", type=int, default=4, help="client processes (clients split)")
    args = ap.parse_args()
    load = os.getloadavg()
    rows, server_rss = run_all(args)
    own_rss = toolbox_rss_mib(queries(args.distinct))
    print(f"machine: {platform.machine()} x{os.cpu_count()}, python {platform.python_version()}, "
          f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{args.requests} searches, {args.clients} clients in {args.processes} processes "
          f"(each client its own connection), {args.distinct} distinct queries")
    print("| mode | requests | req/s | p50 ms | p99 ms | server CPU ms/req | errors |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(row.markdown())
    by = {r.name: r for r in rows}
    base = rows[0]

    def rps(row: Row) -> float:
        return len(row.latencies) / row.seconds

    def p50(row: Row) -> float:
        return statistics.median(row.latencies) * 1e3

    many = by[f"server (defaults), {args.clients} clients"]
    print(f"server ({args.clients} clients, defaults) / in-process sequential: "
          f"{rps(many) / rps(base):.2f}x; server, no cache, {args.clients} clients / in-process "
          f"sequential: {rps(by[f'server, no cache, {args.clients} clients']) / rps(base):.2f}x "
          "(goal: >= 300 req/s, 0 errors)")
    for name in ("server, no cache", "server (defaults)"):
        one = by[f"{name}, 1 client, sequential"]
        print(f"cost per request, {name}: {p50(one) - p50(base):+.2f} ms p50 latency for one "
              f"client over the in-process call ({p50(one):.2f} vs {p50(base):.2f} ms), "
              f"{one.server_cpu_ms:.2f} ms of server CPU")
    print(f"memory: one process holding its own toolbox pays {own_rss:,.0f} MiB; the server "
          f"(peak RSS {server_rss:,.0f} MiB) holds one index and one cache for all "
          f"{args.processes} client processes")


if __name__ == "__main__":
    main()

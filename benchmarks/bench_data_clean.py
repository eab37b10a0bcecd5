"""Benchmark ``drvenus data clean`` against single-process, load-everything baselines.

Input: ``--rows`` raw REDSearcher rows (Serper markdown, legacy tool calls, duplicates,
disallowed tools, malformed turns, some long trajectories) built from the shared DR-Venus
trajectories, in parquet shards of 1,000 rows. Variants, each in a fresh process:

- ``naive``: load every shard into memory, run the stages in one process with this
  benchmark's own slow per-row code (json5 for every tool call, no per-row parse cache,
  per-string surrogate round trip: :func:`use_slow_paths`; the product has no switch for it),
  build the output table in memory (the shape of DR-Venus's released script).
- ``single``: the same load-everything baseline with our fast per-row code.
- ``ours``: ``run_clean`` streaming with ``--workers`` processes.

Prints wall time, peak RSS (main process + largest worker) and speed-up, checks every variant
writes identical rows, and prints a markdown row for docs/BENCHMARKS.md.

    python benchmarks/bench_data_clean.py --rows 10000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def build_input(directory: Path, n_rows: int, shard: int = 1000) -> None:
    from data_fixtures import load_trajectories, long_turns, raw_row, write_raw_parquet

    trajs = load_trajectories()
    rng = random.Random(0)
    bases = []
    for k in range(40):  # 40 distinct raw rows: faults, lengths, ~1% JSON5-only calls
        t = trajs[k % len(trajs)]
        extra = long_turns(trajs, [0, 0, 40, 80][k % 4], rng) if k % 3 == 0 else None
        bases.append(raw_row(t, rng, duplicates=k % 4, disallowed=k % 3 == 1,
                             malformed=k % 5 == 2, extra_turns=extra, json5_rate=0.05))
    directory.mkdir(parents=True, exist_ok=True)
    for s in range(0, n_rows, shard):
        rows = []
        for i in range(s, min(n_rows, s + shard)):
            base = bases[rng.randrange(len(bases))]
            row = {**base, "meta": {**base["meta"], "question": base["meta"]["question"] +
                                    f" (variant {i})"}}
            msgs = list(base["messages"])
            msgs[0] = {"role": "user", "content": row["meta"]["question"]}
            row["messages"] = msgs
            rows.append(row)
        write_raw_parquet(rows, directory / f"train-{s // shard:05d}.parquet")


def digest(path: Path) -> str:
    h = hashlib.sha256()
    for batch in pq.ParquetFile(path).iter_batches(batch_size=512):
        for r in batch.to_pylist():
            h.update(json.dumps([r["question"], r["messages"][1:], r["gt"]]).encode())
    return h.hexdigest()


def use_slow_paths() -> None:
    """Swap this benchmark process's per-row helpers for the plain, slow ones of the naive
    baseline. Outputs stay identical; only speed changes. Fails loudly when a helper moved."""
    import json5

    from drvenus.data import normalize, rows
    from drvenus.protocol import legacy

    def slow_fix_surrogates(text: str) -> str:  # the round trip on every string
        try:
            return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
        except UnicodeError:
            return text.encode("utf-8", "ignore").decode("utf-8")

    for module, name, value in [
        (normalize, "loads_json5", json5.loads),  # no C JSON decoder first
        (legacy, "loads_json5", json5.loads),
        (normalize, "fix_surrogates", slow_fix_surrogates),
        (rows, "cached_call_reader", lambda: legacy.tool_call_objects),  # parse per use
    ]:
        if not hasattr(module, name):
            raise SystemExit(f"benchmark out of date: {module.__name__}.{name} is gone")
        setattr(module, name, value)


def run_baseline(inp: Path, out: Path, fast: bool) -> None:
    """Load everything, process in this process, write once."""
    from drvenus.data.reading import list_input_files
    from drvenus.data.resample import ResamplePolicy
    from drvenus.data.rows import RowOptions, process_rows
    from drvenus.data.shuffle import legacy_permutation
    from drvenus.protocol import build_system_prompt

    if not fast:
        use_slow_paths()
    opts = RowOptions("template", build_system_prompt("2026-03-01"), frozenset({"search", "visit"}))
    files = list_input_files(inp, "train-*.parquet")
    rows = pa.concat_tables([pq.read_table(f) for f in files]).to_pylist()
    valid = process_rows(rows, opts).valid
    policy = ResamplePolicy()
    final = []
    for _, r in valid:
        for _ in range(policy.multiplier(r["_turns"])):
            final.append({"question": r["question"], "messages": r["messages"], "gt": r["gt"]})
    final = [final[k] for k in legacy_permutation(len(final), 42)]
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(final), out / "cleaned_resampled.parquet")


def run_ours(inp: Path, out: Path, workers: int) -> None:
    from drvenus.data.pipeline import CleanOptions, run_clean

    run_clean(CleanOptions(input=inp, output_dir=out, correctness="off", shuffle=True, seed=42,
                           current_date="2026-03-01", workers=workers))


def child(variant: str, inp: Path, out: Path, workers: int) -> None:
    t0 = time.perf_counter()
    if variant == "ours":
        run_ours(inp, out, workers)
    else:
        run_baseline(inp, out, fast=variant == "single")
    wall = time.perf_counter() - t0
    me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps({"wall": wall, "rss_mib": (me + kids) / 1024}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10000)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--dir", type=Path, default=ROOT / "benchmarks" / "out" / "data_clean")
    ap.add_argument("--variants", default="naive,single,ours")
    ap.add_argument("--child", nargs=3, metavar=("VARIANT", "INPUT", "OUTPUT"))
    args = ap.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]), Path(args.child[2]), args.workers)
        return
    inp = args.dir / f"input-{args.rows}"
    if not inp.exists():
        t0 = time.perf_counter()
        build_input(inp, args.rows)
        print(f"built {args.rows} rows in {time.perf_counter() - t0:.1f}s")
    size = sum(f.stat().st_size for f in inp.glob("*.parquet")) / 2**20
    results = {}
    path = f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    env = {**os.environ, "PYTHONPATH": path}
    for variant in args.variants.split(","):
        out = args.dir / f"out-{variant}"
        cmd = [sys.executable, __file__, "--workers", str(args.workers), "--child", variant,
               str(inp), str(out)]
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        results[variant] = json.loads(res.stdout.strip().splitlines()[-1])
        results[variant]["digest"] = digest(out / "cleaned_resampled.parquet")
        print(f"{variant:>7}: {results[variant]['wall']:7.1f} s  "
              f"{results[variant]['rss_mib']:7.0f} MiB", flush=True)
    same = len({r["digest"] for r in results.values()}) == 1
    print(f"\ninput: {args.rows} rows, {size:.0f} MiB parquet; workers={args.workers}; "
          f"identical output: {same}")
    print("| variant | wall s | peak RSS MiB | speed-up vs naive |")
    print("|---|---|---|---|")
    base = results.get("naive", next(iter(results.values())))["wall"]
    for v, r in results.items():
        print(f"| {v} | {r['wall']:.1f} | {r['rss_mib']:.0f} | {base / r['wall']:.2f}x |")
    if "ours" in results:
        o = results["ours"]
        parts = [f"{v} {r['wall']:.1f} s / {r['rss_mib']:.0f} MiB" for v, r in results.items()]
        print(f"\n| data clean ({args.rows} raw rows, {size:.0f} MiB, {os.cpu_count()} cores, "
              f"{args.workers} workers) | {'; '.join(parts)} | "
              f"{base / o['wall']:.2f}x faster than naive, identical output: {same} |")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()

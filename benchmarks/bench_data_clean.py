"""Benchmark ``drvenus data clean`` against DR-Venus's own script and load-everything baselines.

Input: ``--rows`` raw REDSearcher rows (Serper markdown, legacy tool calls, duplicates,
disallowed tools, malformed turns, some long trajectories) built from the shared DR-Venus
trajectories, in parquet shards of 1,000 rows (about 70 MB per 1,000 rows). ``--rows`` takes a
list of sizes (``2000,10000,20000,100000``): each size runs every variant, each in a fresh
process, one after the other. Variants:

- ``official``: DR-Venus's ``SFT/data_clean/prepare_trajectories.py``, run unmodified (its
  SHA-256 is checked) with ``--current-date 2026-03-01 --shuffle --seed 42`` in a scratch
  virtualenv outside this repository (pandas, numpy, pyarrow, json5). ``--official-script``
  names a copy of it, ``--official-python`` the virtualenv's python; without them the script is
  cloned from GitHub at the pinned commit and the virtualenv is made under the temp folder.
  It is never copied into this repository. It loads every row into pandas (about 1.6 GiB per
  1,000 rows), so it is skipped above ``--official-max-rows`` and killed when its RSS passes
  ``--memory-limit-mib`` (the machine has no swap).
- ``naive``: load every shard into memory, run the stages in one process with this
  benchmark's own slow per-row code (json5 for every tool call, no per-row parse cache,
  per-string surrogate round trip: :func:`use_slow_paths`; the product has no switch for it),
  build the output table in memory (the shape of DR-Venus's released script).
- ``single``: the same load-everything baseline with our fast per-row code.
- ``ours``: ``run_clean`` streaming with ``--workers`` processes.

Prints wall time, CPU time (user + system, all processes: the fairer number when other work
shares the cores), peak RSS (ours: main process + largest worker; the others are one process)
and speed-up against ``official`` (else the first variant), checks every variant writes
identical rows (``messages[0]``, the system prompt, left out: the script's is not ours), and
prints markdown rows for docs/BENCHMARKS.md. Outputs are deleted after each size unless
``--keep-outputs``.

    python benchmarks/bench_data_clean.py --rows 2000,10000 --variants official,ours
    nice python benchmarks/bench_data_clean.py --rows 20000,100000 --variants ours
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

OFFICIAL_REPO = "https://github.com/inclusionAI/DR-Venus"
OFFICIAL_COMMIT = "6dfa2c24785ff057687b1c3641adba2b2c60bcc6"  # as in tests/test_data_clean.py
OFFICIAL_PATH = "SFT/data_clean/prepare_trajectories.py"
OFFICIAL_SHA256 = "498b41049834595563972b42f5c7edc852843c26a194b1162021a843e35e860e"
OFFICIAL_PACKAGES = ["pandas", "numpy", "pyarrow", "json5"]
OFFICIAL_ARGS = ["--current-date", "2026-03-01", "--shuffle", "--seed", "42"]


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
    """SHA-256 of the output rows (question, messages after the system prompt, gt) in order."""
    import orjson

    h = hashlib.sha256()
    pf = pq.ParquetFile(path, buffer_size=4 * 2**20)  # a row group at a time, not whole chunks
    for batch in pf.iter_batches(batch_size=256, columns=["question", "messages", "gt"]):
        for r in batch.to_pylist():
            h.update(orjson.dumps([r["question"], r["messages"][1:], r["gt"]],
                                  option=orjson.OPT_SORT_KEYS))
    return h.hexdigest()


def official_setup(script: Path | None, python: Path | None) -> tuple[Path, Path]:
    """DR-Venus's script (cloned at the pinned commit unless given) and a scratch virtualenv's
    python with its dependencies (made unless given), both outside this repository; the
    script's SHA-256 must be the pinned one (it runs unmodified)."""
    scratch = Path(tempfile.gettempdir())
    if script is None:
        checkout = scratch / f"DR-Venus-{OFFICIAL_COMMIT[:7]}"
        if not checkout.exists():
            subprocess.run(["git", "clone", "-q", OFFICIAL_REPO, str(checkout)], check=True)
            subprocess.run(["git", "-C", str(checkout), "checkout", "-q", OFFICIAL_COMMIT],
                           check=True)
        script = checkout / OFFICIAL_PATH
    if hashlib.sha256(script.read_bytes()).hexdigest() != OFFICIAL_SHA256:
        raise SystemExit(f"{script}: not the pinned prepare_trajectories.py (SHA-256 differs)")
    if script.resolve().is_relative_to(ROOT):
        raise SystemExit("the official script must live outside this repository")
    if python is None:
        venv = scratch / "drvenus-official-venv"
        python = venv / "bin" / "python"
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run([str(python), "-m", "pip", "install", "-q", *OFFICIAL_PACKAGES],
                           check=True)
    return script, python


def run_measured(cmd: list[str], env: dict[str, str], limit_mib: int) -> dict:
    """Run ``cmd``; wall time, peak RSS of the process (ru_maxrss from wait4), and whether it
    was killed for passing ``limit_mib`` of RSS (polled every 0.2 s, with its children)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    killed = {"at_mib": None}

    def watch() -> None:
        while proc.poll() is None:
            rss = _tree_rss_mib(proc.pid)
            if rss > limit_mib:
                killed["at_mib"] = rss
                os.killpg(proc.pid, signal.SIGKILL)
                return
            time.sleep(0.2)

    threading.Thread(target=watch, daemon=True).start()
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    return {"wall": wall, "rc": proc.returncode, "stdout": out, "stderr": err,
            "killed_at_mib": killed["at_mib"]}


def _tree_rss_mib(pid: int) -> float:
    """VmRSS of ``pid`` and its direct children, MiB (0 once it is gone)."""
    total = 0
    pids = [pid]
    try:
        pids += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        pass
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


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
        (normalize, "loads_tool_call", json5.loads),
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


def run_official(inp: Path, out: Path) -> None:
    """DR-Venus's script, unmodified, in its scratch virtualenv (see :func:`official_setup`)."""
    python, script = json.loads(os.environ["DRVENUS_BENCH_OFFICIAL"])[::-1]
    subprocess.run([python, script, "--input", str(inp), "--output-dir", str(out),
                    *OFFICIAL_ARGS], check=True, stdout=subprocess.DEVNULL)


def child(variant: str, inp: Path, out: Path, workers: int) -> None:
    t0 = time.perf_counter()
    if variant == "official":
        run_official(inp, out)
    elif variant == "ours":
        run_ours(inp, out, workers)
    else:
        run_baseline(inp, out, fast=variant == "single")
    wall = time.perf_counter() - t0
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    # This process's own peak is VmHWM: ru_maxrss would carry over the peak of the benchmark
    # process it was forked from (Linux keeps it across exec). Children: the largest worker
    # (forked from this process, so its peak counts the pages it shares with it), or, for
    # official, the script (this wrapper only waits for it).
    main = _vm_hwm_kib()
    rss = kids.ru_maxrss if variant == "official" else main + kids.ru_maxrss
    print(json.dumps({"wall": wall, "cpu_s": cpu, "rss_mib": rss / 1024,
                      "rss_main_mib": main / 1024, "rss_child_mib": kids.ru_maxrss / 1024}))


def _vm_hwm_kib() -> int:
    """Peak resident memory of this process (Linux), in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run_variant(variant: str, inp: Path, out: Path, args: argparse.Namespace,
                env: dict[str, str], official: tuple[Path, Path] | None) -> dict:
    if out.exists():
        shutil.rmtree(out)
    cmd = [sys.executable, __file__, "--workers", str(args.workers), "--child", variant,
           str(inp), str(out)]
    if variant == "official":
        assert official is not None
        env = {**env, "DRVENUS_BENCH_OFFICIAL": json.dumps([str(p) for p in official])}
    res = run_measured(cmd, env, args.memory_limit_mib)
    if res["rc"] == 0:
        res.update(json.loads(res["stdout"].strip().splitlines()[-1]))
    if res["killed_at_mib"] is not None:
        res["status"] = f"killed at {res['killed_at_mib']:.0f} MiB RSS"
    elif res["rc"] != 0:
        res["status"] = f"failed (exit {res['rc']}): {res['stderr'].strip()[-300:]}"
    else:
        res["status"] = "ok"
        res["digest"] = digest(out / "cleaned_resampled.parquet")
    return res


def bench_size(rows: int, args: argparse.Namespace, official: tuple[Path, Path] | None) -> dict:
    inp = args.dir / f"input-{rows}"
    if not inp.exists():
        t0 = time.perf_counter()
        build_input(inp, rows)
        print(f"built {rows} rows in {time.perf_counter() - t0:.1f}s", flush=True)
    size = sum(f.stat().st_size for f in inp.glob("*.parquet")) / 2**20
    load = os.getloadavg()[0]
    path = f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    env = {**os.environ, "PYTHONPATH": path}
    results: dict[str, dict] = {}
    for variant in args.variants.split(","):
        if variant == "official" and rows > args.official_max_rows:
            print(f"{variant:>8}: skipped ({rows} rows > --official-max-rows "
                  f"{args.official_max_rows}: it holds every row in pandas)", flush=True)
            continue
        out = args.dir / f"out-{variant}"
        r = results[variant] = run_variant(variant, inp, out, args, env, official)
        shown = (f"{r['wall']:7.1f} s  {r.get('cpu_s', 0):7.1f} CPU s  {r['rss_mib']:7.0f} MiB "
                 f"(main {r.get('rss_main_mib', 0):.0f}, largest child "
                 f"{r.get('rss_child_mib', 0):.0f})" if r["status"] == "ok"
                 else f"{r['wall']:7.1f} s  {r['status']}")
        print(f"{variant:>8}: {shown}", flush=True)
        if not args.keep_outputs:
            shutil.rmtree(out, ignore_errors=True)
    ok = {v: r for v, r in results.items() if r["status"] == "ok"}
    same = len({r["digest"] for r in ok.values()}) == 1
    print(f"\ninput: {rows} rows, {size:.0f} MiB parquet; workers={args.workers}; "
          f"load average at start {load:.1f}; identical output: {same}")
    base_name = "official" if "official" in ok else next(iter(ok), None)
    print(f"| variant | wall s | CPU s | peak RSS MiB | speed-up vs {base_name} (wall; CPU) |")
    print("|---|---|---|---|---|")
    for v, r in results.items():
        if r["status"] != "ok":
            print(f"| {v} | {r['wall']:.1f} | | {r['status']} | |")
            continue
        b = ok[base_name]
        print(f"| {v} | {r['wall']:.1f} | {r['cpu_s']:.1f} | {r['rss_mib']:.0f} | "
              f"{b['wall'] / r['wall']:.2f}x; {b['cpu_s'] / r['cpu_s']:.2f}x |")
    if "ours" in ok:
        o = ok["ours"]
        parts = [f"{v} {r['wall']:.1f} s / {r['rss_mib']:.0f} MiB" if r["status"] == "ok"
                 else f"{v} {r['status']}" for v, r in results.items()]
        ratio = (f"{ok[base_name]['wall'] / o['wall']:.2f}x faster than {base_name}, "
                 if base_name != "ours" else "")
        print(f"\n| data clean ({rows} raw rows, {size:.0f} MiB, {os.cpu_count()} cores, "
              f"{args.workers} workers, load {load:.1f}) | {'; '.join(parts)} | "
              f"{ratio}identical output: {same} |", flush=True)
    return {"rows": rows, "mib": size, "load": load, "same": same,
            "results": {v: {k: r.get(k) for k in ("wall", "cpu_s", "rss_mib", "rss_main_mib",
                                                  "rss_child_mib", "status")}
                        for v, r in results.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="10000", help="one size or a comma-separated list")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--dir", type=Path,
                    default=Path(tempfile.gettempdir()) / "drvenus-bench-data-clean",
                    help="inputs and outputs (100,000 rows take ~7 GB in, ~30 GB out)")
    ap.add_argument("--variants", default="official,ours")
    ap.add_argument("--official-script", type=Path, help="a copy of prepare_trajectories.py")
    ap.add_argument("--official-python", type=Path, help="python of a scratch virtualenv")
    ap.add_argument("--official-max-rows", type=int, default=10000)
    ap.add_argument("--memory-limit-mib", type=int, default=20480,
                    help="kill a variant whose RSS passes this (the machine has no swap)")
    ap.add_argument("--keep-outputs", action="store_true")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--child", nargs=3, metavar=("VARIANT", "INPUT", "OUTPUT"))
    args = ap.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]), Path(args.child[2]), args.workers)
        return
    official = None
    if "official" in args.variants.split(","):
        official = official_setup(args.official_script, args.official_python)
    args.dir.mkdir(parents=True, exist_ok=True)
    summary = []
    for rows in (int(r) for r in args.rows.split(",")):
        summary.append(bench_size(rows, args, official))
        if args.json:
            args.json.write_text(json.dumps(summary, indent=2))
    if not all(s["same"] for s in summary):
        sys.exit(1)


if __name__ == "__main__":
    main()

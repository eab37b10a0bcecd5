"""The README's first command on a fresh machine: install, then `drvenus ask`, timed.

Creates a new virtual environment, installs the project with pip's cache bypassed
(``PIP_NO_CACHE_DIR=1``), then runs ``drvenus ask "Who wrote the novel Dracula?" --json`` with an
empty drvenus cache (so it includes fetching the embedded model and building the index), and
reports wall time and peak memory of each part. ``--baseline`` also times what the previous
default dependency needed on the same machine: building ``llama-cpp-python`` from source in
its own fresh venv (about 11-13 minutes on 2 cores; off by default).

Usage: python benchmarks/bench_fresh_install.py [--baseline]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(__file__).resolve().parent / "out"
MEASURE = (
    "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
    "print('RC', r.returncode, 'MAXRSS_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,"
    " file=sys.stderr)"
)


def timed(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    """Wall seconds, exit code and peak RSS (MiB) of ``cmd`` and its children."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, *cmd], env=env, capture_output=True, text=True
    )
    seconds = time.perf_counter() - start
    tail = [ln for ln in done.stderr.splitlines() if ln.startswith("RC ")][-1].split()
    if int(tail[1]) != 0 or not done.stdout.strip():
        sys.stderr.write(done.stderr[-3000:])
    return {"seconds": round(seconds, 1), "rc": int(tail[1]), "peak_mib": int(tail[3]) // 1024,
            "stdout": done.stdout[-20000:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", action="store_true")
    args = ap.parse_args()
    report: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="drvenus-fresh-") as tmp:
        venv = Path(tmp) / "venv"
        env = {**os.environ, "PIP_NO_CACHE_DIR": "1", "DRVENUS_CACHE_DIR": str(Path(tmp) / "c")}
        env.pop("DRVENUS_MODELS_DIR", None)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip, drvenus = str(venv / "bin" / "pip"), str(venv / "bin" / "drvenus")
        report["install"] = timed([pip, "install", "-q", "-e", str(ROOT)], env)
        report["ask"] = timed([drvenus, "ask", "Who wrote the novel Dracula?", "--json"], env)
        if report["ask"]["rc"] == 0 and report["ask"]["stdout"].strip():
            record = json.loads(report["ask"]["stdout"])
            report["ask"]["termination"] = record["termination"]
            report["ask"]["prediction"] = record["prediction"]
            report["ask"]["tool_calls"] = record["tool_call_count"]
        report["ask_again"] = timed([drvenus, "ask", "Who wrote the novel Dracula?", "--json"], env)
        if args.baseline:
            base = Path(tmp) / "base"
            subprocess.run([sys.executable, "-m", "venv", str(base)], check=True)
            report["baseline_llama_cpp_python_install"] = timed(
                [str(base / "bin" / "pip"), "install", "-q", "llama-cpp-python"], env
            )
    for part in report.values():
        part.pop("stdout", None)
    total = report["install"]["seconds"] + report["ask"]["seconds"]
    for name, part in report.items():
        print(f"{name:36} {part}")
    print(f"README first command, fresh: {total:.0f}s in total")
    OUT.mkdir(exist_ok=True)
    (OUT / "fresh_install.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

"""``drvenus data clean``: stream input shards through the per-row stages in worker processes,
filter by answer correctness, resample by turn count, and write DR-Venus's output files.

Flow: the main process reads record batches (pyarrow ``iter_batches``; JSONL in line chunks),
ships them to a process pool with a bounded number in flight, and appends the valid rows, in
input order, to a temporary Arrow IPC file. The correctness filter then reads only the small
answer columns; resampling and the optional shuffle are an index list over that file, which is
memory-mapped and written out in slices. Memory stays bounded by the chunks in flight, and the
output is the same for any number of workers.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from drvenus.data import normalize as _normalize
from drvenus.data.judge import JudgeConfig, judge_many
from drvenus.data.rows import ChunkStats, RowOptions, process_rows
from drvenus.data.shuffle import legacy_permutation
from drvenus.data.stages import ResamplePolicy
from drvenus.protocol import _json as _protocol_json
from drvenus.protocol import build_system_prompt, load_system_prompt

try:
    import orjson as _orjson

    _loads: Any = _orjson.loads
except ImportError:  # pragma: no cover - orjson is optional
    _loads = json.loads

log = logging.getLogger(__name__)

FINAL_PARQUET = "cleaned_resampled.parquet"
FINAL_JSONL = "cleaned_resampled.jsonl"
STAGE1_PARQUET = "stage1_normalized.parquet"
STAGE2_PARQUET = "stage2_deduped.parquet"
STATS_JSON = "stats.json"
CORRECTNESS_MODES = ("off", "em", "f1", "judge")
INPUT_COLUMNS = ("meta", "messages", "system_prompt", "question", "gt")

ProgressFn = Callable[[int, int | None], None]


class NothingReadError(RuntimeError):
    """No input file could be found or read."""


@dataclass
class CleanOptions:
    """Options of ``drvenus data clean`` (defaults are DR-Venus's)."""

    input: Path
    output_dir: Path
    file_pattern: str = "train-*.parquet"
    system_prompt_mode: str = "template"
    current_date: str | None = None
    system_prompt_file: Path | None = None
    allowed_tools: tuple[str, ...] = ("search", "visit")
    policy: ResamplePolicy = field(default_factory=ResamplePolicy)
    correctness: str | None = None  # None: judge when configured, else f1
    f1_threshold: float = 0.5
    judge: JudgeConfig | None = None
    keep_judge_failures: bool = False
    strict_format: bool = False
    shuffle: bool = False
    seed: int = 42
    keep_intermediate: bool = False
    keep_metadata: bool = False
    write_jsonl: bool = False
    workers: int | None = None
    chunk_rows: int = 32
    fast_paths: bool = True


# --------------------------------------------------------------------------- inputs


def list_input_files(path: Path, pattern: str) -> list[Path]:
    """The file itself, or the sorted files matching ``pattern`` in the directory."""
    if path.is_file():
        return [path]
    return sorted(p for p in path.glob(pattern) if p.is_file())


def _is_parquet(path: Path) -> bool:
    return path.suffix.lower() in (".parquet", ".pq")


def _message_type(files: list[Path]) -> pa.DataType:
    """The output ``messages`` element type: role and content, then any extra message fields
    found in the inputs' schemas (kept as DR-Venus keeps them for clean rows)."""
    fields: dict[str, pa.Field] = {
        "role": pa.field("role", pa.string()),
        "content": pa.field("content", pa.string()),
    }
    for path in files:
        if not _is_parquet(path):
            continue
        try:
            schema = pq.read_schema(path)
        except Exception:  # noqa: BLE001 - reported when the file is read
            continue
        if "messages" not in schema.names:
            continue
        t = schema.field("messages").type
        if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
            continue
        item = t.value_type
        if not pa.types.is_struct(item):
            continue
        for f in item:
            if f.name not in fields:
                fields[f.name] = f.with_nullable(True)
            elif f.name not in ("role", "content") and fields[f.name].type != f.type:
                log.warning("message field %r has conflicting types; dropping it", f.name)
                fields[f.name] = pa.field(f.name, pa.null())
    return pa.struct([f for f in fields.values() if f.type != pa.null()])


def _schemas(message_type: pa.DataType) -> tuple[pa.Schema, pa.Schema]:
    base = [
        pa.field("question", pa.string()),
        pa.field("messages", pa.list_(message_type)),
        pa.field("gt", pa.string()),
        pa.field("_source_file", pa.string()),
        pa.field("_source_row", pa.int64()),
    ]
    stage1 = pa.schema(base)
    stage2 = pa.schema(
        base
        + [
            pa.field("_turns", pa.int64()),
            pa.field("_tool_names", pa.list_(pa.string())),
            pa.field("_answer", pa.string()),
            pa.field("_em", pa.bool_()),
            pa.field("_f1", pa.float64()),
        ]
    )
    return stage1, stage2


def _ipc_bytes(batch: pa.RecordBatch) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def _ipc_batch(buf: Any) -> pa.RecordBatch:
    return pa.ipc.open_stream(buf).read_next_batch()


@dataclass
class _Chunk:
    file: str
    start: int
    kind: str  # "arrow" | "lines"
    payload: Any


def _read_chunks(
    path: Path, chunk_rows: int, on_error: Callable[[str], None]
) -> Iterator[_Chunk]:
    """Chunks of one file; a read error ends the file (reported), rows before it still count."""
    name = path.name
    start = 0
    try:
        if _is_parquet(path):
            pf = pq.ParquetFile(path)
            cols = [c for c in INPUT_COLUMNS if c in pf.schema_arrow.names]
            for batch in pf.iter_batches(batch_size=chunk_rows, columns=cols):
                yield _Chunk(name, start, "arrow", _ipc_bytes(batch))
                start += batch.num_rows
            return
        with path.open("rb") as fh:
            head = fh.read(1).lstrip()
            fh.seek(0)
            if path.suffix.lower() == ".json" and head in (b"{", b"["):
                data = _loads(fh.read())
                rows = data if isinstance(data, list) else [data]
                lines = [json.dumps(r, ensure_ascii=False).encode("utf-8") for r in rows]
                for i in range(0, len(lines), chunk_rows):
                    yield _Chunk(name, i, "lines", lines[i : i + chunk_rows])
                return
            buf: list[bytes] = []
            for line in fh:
                if not line.strip():
                    continue
                buf.append(line)
                if len(buf) >= chunk_rows:
                    yield _Chunk(name, start, "lines", buf)
                    start += len(buf)
                    buf = []
            if buf:
                yield _Chunk(name, start, "lines", buf)
    except Exception as exc:  # noqa: BLE001 - a broken file never stops the run
        on_error(f"{type(exc).__name__}: {exc}")


def _count_rows(path: Path) -> int | None:
    if _is_parquet(path):
        try:
            return pq.ParquetFile(path).metadata.num_rows
        except Exception:  # noqa: BLE001
            return 0
    return None


# --------------------------------------------------------------------------- workers

_WORKER: dict[str, Any] = {}


def _init_worker(opts: RowOptions, stage1: pa.Schema, stage2: pa.Schema) -> None:
    _WORKER.update(opts=opts, stage1=stage1, stage2=stage2)
    _protocol_json.FAST_PATH = opts.fast_paths
    _normalize.SURROGATE_FAST_PATH = opts.fast_paths


def _decode_lines(lines: list[bytes]) -> list[Any]:
    rows: list[Any] = []
    for line in lines:
        try:
            rows.append(_loads(line))
        except Exception as exc:  # noqa: BLE001 - counted as an unreadable row
            rows.append(ValueError(str(exc)))
    return rows


def _to_batch(records: list[dict], schema: pa.Schema, stats: ChunkStats | None) -> pa.RecordBatch:
    try:
        return pa.RecordBatch.from_pylist(records, schema=schema)
    except (pa.ArrowException, UnicodeError, TypeError, ValueError, OverflowError):
        good = []
        for r in records:  # find the rows Arrow cannot hold (odd types, lone surrogates)
            try:
                pa.RecordBatch.from_pylist([r], schema=schema)
                good.append(r)
            except (pa.ArrowException, UnicodeError, TypeError, ValueError, OverflowError):
                if stats is not None:
                    stats.stage2_rows -= 1
                    stats.dropped["unwritable_row"] += 1
        return pa.RecordBatch.from_pylist(good, schema=schema)


def _work(chunk: _Chunk) -> tuple[Any, Any, ChunkStats]:
    opts: RowOptions = _WORKER["opts"]
    if chunk.kind == "arrow":
        rows = _ipc_batch(chunk.payload).to_pylist()
    else:
        rows = _decode_lines(chunk.payload)
    stage1, valid, stats = process_rows(rows, opts)
    for i, r in stage1:
        r["_source_file"], r["_source_row"] = chunk.file, chunk.start + i
    for i, r in valid:
        r["_source_file"], r["_source_row"] = chunk.file, chunk.start + i
    batch2 = _to_batch([r for _, r in valid], _WORKER["stage2"], stats)
    batch1 = _to_batch([r for _, r in stage1], _WORKER["stage1"], None) if stage1 else None
    return (
        _ipc_bytes(batch1) if batch1 is not None else None,
        _ipc_bytes(batch2),
        stats,
    )


class _InlinePool:
    """The pool interface, run in this process (``--workers 1``)."""

    def submit(self, fn, *args) -> Future:
        fut: Future = Future()
        try:
            fut.set_result(fn(*args))
        except Exception as exc:  # noqa: BLE001
            fut.set_exception(exc)
        return fut

    def shutdown(self) -> None:
        pass


# --------------------------------------------------------------------------- the run


def resolve_correctness(opts: CleanOptions) -> str:
    """The correctness mode: as given, else ``judge`` with a configured judge, else ``f1``."""
    if opts.correctness is not None:
        if opts.correctness not in CORRECTNESS_MODES:
            raise ValueError(f"--correctness must be one of {', '.join(CORRECTNESS_MODES)}")
        if opts.correctness == "judge" and opts.judge is None:
            raise ValueError(
                "--correctness judge needs --judge-base-url and --judge-model "
                "(or DRVENUS_JUDGE_BASE_URL / DRVENUS_JUDGE_MODEL)"
            )
        return opts.correctness
    return "judge" if opts.judge is not None else "f1"


def _system_prompt(opts: CleanOptions) -> tuple[str, str | None]:
    if opts.system_prompt_file is not None:
        return load_system_prompt(opts.system_prompt_file), opts.current_date
    date = opts.current_date or time.strftime("%Y-%m-%d")
    return build_system_prompt(date), date


def run_clean(opts: CleanOptions, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Run the whole pipeline; returns the stats written to ``stats.json``.

    Raises :class:`NothingReadError` when no input file could be found or read, ``ValueError``
    on inconsistent options.
    """
    t0 = time.perf_counter()
    mode = resolve_correctness(opts)
    input_path = Path(opts.input).expanduser().resolve()
    out_dir = Path(opts.output_dir).expanduser().resolve()
    files = list_input_files(input_path, opts.file_pattern)
    if not files:
        raise NothingReadError(
            f"no input files found under {input_path} with pattern {opts.file_pattern!r}"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    allowed = frozenset(t.lower() for t in opts.allowed_tools)
    system_prompt, current_date = _system_prompt(opts)
    row_opts = RowOptions(
        system_prompt_mode=opts.system_prompt_mode,
        system_prompt=system_prompt,
        allowed_tools=allowed,
        strict_format=opts.strict_format,
        keep_stage1=opts.keep_intermediate,
        fast_paths=opts.fast_paths,
    )
    if opts.system_prompt_mode not in ("template", "row"):
        raise ValueError("--system-prompt-mode must be 'template' or 'row'")
    if opts.shuffle and not 0 <= opts.seed <= 0xFFFFFFFF:
        raise ValueError("--seed must be between 0 and 2**32 - 1")
    workers = max(1, opts.workers or os.cpu_count() or 1)
    log.info("data clean: %d file(s), %d worker(s), correctness=%s", len(files), workers, mode)

    msg_type = _message_type(files)
    stage1_schema, stage2_schema = _schemas(msg_type)
    counts = [_count_rows(p) for p in files]
    total = None if any(c is None for c in counts) else sum(c or 0 for c in counts)

    tmp_path = out_dir / f".stage2-{os.getpid()}.arrow"
    per_file: dict[str, ChunkStats] = {}
    file_errors: dict[str, str] = {}
    totals = ChunkStats()
    stage1_writer: pq.ParquetWriter | None = None
    pool: Any
    if workers > 1:
        pool = ProcessPoolExecutor(
            max_workers=workers,
            initializer=_init_worker,
            initargs=(row_opts, stage1_schema, stage2_schema),
        )
    else:
        _init_worker(row_opts, stage1_schema, stage2_schema)
        pool = _InlinePool()

    def chunks() -> Iterator[_Chunk]:
        for path in files:
            per_file.setdefault(path.name, ChunkStats())

            def on_error(msg: str, name: str = path.name) -> None:
                file_errors[name] = msg
                log.error("cannot read %s: %s", name, msg)

            yield from _read_chunks(path, opts.chunk_rows, on_error)

    done_rows = 0
    try:
        with pa.OSFile(str(tmp_path), "wb") as sink, pa.ipc.new_file(
            sink, stage2_schema
        ) as writer:
            window: list[tuple[_Chunk, Future]] = []
            limit = 2 * workers + 1

            def drain(keep: int) -> None:
                nonlocal done_rows, stage1_writer
                while len(window) > keep:
                    chunk, fut = window.pop(0)
                    try:
                        b1, b2, stats = fut.result()
                    except Exception as exc:  # noqa: BLE001 - e.g. a worker died
                        log.error("chunk %s@%d failed: %r", chunk.file, chunk.start, exc)
                        n = _chunk_len(chunk)
                        stats = ChunkStats(source_rows=n)
                        stats.dropped["row_error"] += n
                        b1 = b2 = None
                    per_file[chunk.file].add(stats)
                    totals.add(stats)
                    if b2 is not None:
                        batch = _ipc_batch(b2)
                        if batch.num_rows:
                            writer.write_batch(batch)
                    if b1 is not None:
                        if stage1_writer is None:
                            stage1_writer = pq.ParquetWriter(
                                out_dir / STAGE1_PARQUET, stage1_schema
                            )
                        stage1_writer.write_batch(_ipc_batch(b1))
                    done_rows += stats.source_rows
                    if progress:
                        progress(done_rows, total)

            for chunk in chunks():
                window.append((chunk, pool.submit(_work, chunk)))
                drain(limit)
            drain(0)
    finally:
        pool.shutdown()
        if stage1_writer is not None:
            stage1_writer.close()

    try:
        if totals.source_rows == 0 and len(file_errors) == len(files):
            raise NothingReadError(
                "no input file could be read: "
                + "; ".join(f"{k}: {v}" for k, v in file_errors.items())
            )
        stats = _finish(
            opts, mode, tmp_path, out_dir, input_path, files, per_file, file_errors, totals,
            current_date, stage1_schema,
        )
    finally:
        tmp_path.unlink(missing_ok=True)
    stats["timing"] = {"elapsed_s": round(time.perf_counter() - t0, 3), "workers": workers}
    (out_dir / STATS_JSON).write_text(
        json.dumps(stats, ensure_ascii=False, indent=2), encoding="utf-8"
    )
    log.info(
        "data clean: %d source -> %d normalized -> %d valid -> %d final rows (correctness=%s)",
        stats["rows"]["source"], stats["rows"]["stage1_normalized"],
        stats["rows"]["stage2_valid"], stats["rows"]["final_resampled"], mode,
    )
    return stats


def _chunk_len(chunk: _Chunk) -> int:
    if chunk.kind == "lines":
        return len(chunk.payload)
    return _ipc_batch(chunk.payload).num_rows


def _correctness(
    opts: CleanOptions, mode: str, table: pa.Table, out_dir: Path
) -> tuple[list[bool], dict[str, Any], Counter]:
    """Keep mask over the valid rows, the correctness stats block, extra drop reasons."""
    n = table.num_rows
    drops: Counter = Counter()
    info: dict[str, Any] = {"mode": mode}
    if mode == "off":
        return [True] * n, info, drops
    answers = table.column("_answer").to_pylist()
    correct = failed = 0
    no_answer = sum(1 for a in answers if not a)
    if mode == "em":
        keep = table.column("_em").to_pylist()
    elif mode == "f1":
        info["f1_threshold"] = opts.f1_threshold
        keep = [f >= opts.f1_threshold for f in table.column("_f1").to_pylist()]
    else:
        assert opts.judge is not None
        cfg = opts.judge
        if cfg.cache_path is None:
            cfg = JudgeConfig(**{**cfg.__dict__, "cache_path": out_dir / "judge_cache.sqlite"})
        ems = table.column("_em").to_pylist()
        questions = table.column("question").to_pylist()
        gts = table.column("gt").to_pylist()
        ask = [i for i in range(n) if answers[i] and not ems[i]]
        verdicts = judge_many([(questions[i], answers[i], gts[i]) for i in ask], cfg)
        keep = [bool(answers[i]) and bool(ems[i]) for i in range(n)]
        for i, v in zip(ask, verdicts, strict=True):
            if v.correct is None:
                failed += 1
                keep[i] = opts.keep_judge_failures
            else:
                keep[i] = v.correct
                correct += v.correct
        correct += sum(1 for i in range(n) if answers[i] and ems[i])
        info.update(
            judge_model=cfg.model,
            judge_calls=sum(1 for v in verdicts if not v.cached),
            judge_cached=sum(1 for v in verdicts if v.cached),
            judge_failed=failed,
            judge_failures_kept=opts.keep_judge_failures,
        )
        if failed and not opts.keep_judge_failures:
            drops["judge_failed"] = failed
    if mode != "judge":
        correct = sum(keep)
    incorrect = n - correct - failed
    if incorrect:
        drops["incorrect_answer"] = incorrect
    info.update(checked=n, correct=correct, incorrect=incorrect, no_answer=no_answer,
                kept=sum(keep))
    return keep, info, drops


def _finish(
    opts: CleanOptions,
    mode: str,
    tmp_path: Path,
    out_dir: Path,
    input_path: Path,
    files: list[Path],
    per_file: dict[str, ChunkStats],
    file_errors: dict[str, str],
    totals: ChunkStats,
    current_date: str | None,
    stage1_schema: pa.Schema,
) -> dict[str, Any]:
    policy = opts.policy
    with pa.memory_map(str(tmp_path), "r") as source:
        table = pa.ipc.open_file(source).read_all()
        if opts.keep_intermediate:
            cols = [*stage1_schema.names, "_turns"]
            pq.write_table(table.select(cols), out_dir / STAGE2_PARQUET)
        keep, correctness, extra_drops = _correctness(opts, mode, table, out_dir)
        turns = table.column("_turns").to_pylist()
        names = table.column("_tool_names").to_pylist()
        files_col = table.column("_source_file").to_pylist()

        tool_counter: Counter = Counter()
        original: dict[str, int] = defaultdict(int)
        resampled: dict[str, int] = defaultdict(int)
        multipliers: Counter = Counter()
        stage3_per_file: Counter = Counter()
        index: list[int] = []
        copies: list[int] = []
        mults: list[int] = []
        for i in range(table.num_rows):
            if not keep[i]:
                continue
            stage3_per_file[files_col[i]] += 1
            tool_counter.update(names[i])
            m = policy.multiplier(turns[i])
            bucket = policy.bucket(turns[i])
            original[bucket] += 1
            multipliers[str(m)] += 1
            for c in range(m):
                index.append(i)
                copies.append(c)
                mults.append(m)
                resampled[bucket] += 1
        order = legacy_permutation(len(index), opts.seed) if opts.shuffle else None
        final_rows = _write_final(opts, table, out_dir, index, copies, mults, order)

    drop_reasons = Counter(totals.dropped)
    drop_reasons.update(extra_drops)
    rows = {
        "source": totals.source_rows,
        "stage1_normalized": totals.stage1_rows,
        "stage2_valid": totals.stage2_rows,
        "final_resampled": final_rows,
    }
    if mode != "off":
        rows = {**dict(list(rows.items())[:3]), "stage3_correct": sum(keep),
                "final_resampled": final_rows}
    per_file_out: dict[str, Any] = {}
    for name, st in per_file.items():
        entry: dict[str, Any] = {
            "source_rows": st.source_rows,
            "stage1_rows": st.stage1_rows,
            "stage2_rows": st.stage2_rows,
            "dropped": dict(st.dropped),
            "pruned_tool_turns_removed": st.pruned_tool_turns_removed,
            "pruned_tool_response_turns_removed": st.pruned_tool_response_turns_removed,
            "duplicate_tool_turns_removed": st.duplicate_tool_turns_removed,
        }
        if mode != "off":
            entry["stage3_rows"] = stage3_per_file[name]
        if name in file_errors:
            entry["error"] = file_errors[name]
        per_file_out[name] = entry
    return {
        "input": str(input_path),
        "files": [str(p) for p in files],
        "output_dir": str(out_dir),
        "system_prompt_mode": opts.system_prompt_mode,
        "allowed_tools": sorted({t.lower() for t in opts.allowed_tools}),
        "turn_formula": "(len(messages) - 1) / 2",
        "resample_policy": policy.as_dict(),
        "rows": rows,
        "pruned_tool_turns_removed": totals.pruned_tool_turns_removed,
        "pruned_tool_response_turns_removed": totals.pruned_tool_response_turns_removed,
        "pruned_tool_name_counts": dict(totals.pruned_tool_names),
        "duplicate_tool_turns_removed": totals.duplicate_tool_turns_removed,
        "drop_reasons": dict(drop_reasons),
        "tools_after_cleaning": dict(tool_counter),
        "turn_buckets": {"original": dict(original), "resampled": dict(resampled)},
        "multiplier_distribution": dict(multipliers),
        "per_file": per_file_out,
        "artifacts": {
            "final_parquet": str(out_dir / FINAL_PARQUET),
            "final_jsonl": str(out_dir / FINAL_JSONL) if opts.write_jsonl else None,
            "stage1_parquet": str(out_dir / STAGE1_PARQUET) if opts.keep_intermediate else None,
            "stage2_parquet": str(out_dir / STAGE2_PARQUET) if opts.keep_intermediate else None,
        },
        "correctness": correctness,
        "current_date": current_date,
        "shuffle": {"enabled": opts.shuffle, "seed": opts.seed},
        "file_errors": file_errors,
    }


def _write_final(
    opts: CleanOptions,
    table: pa.Table,
    out_dir: Path,
    index: list[int],
    copies: list[int],
    mults: list[int],
    order: list[int] | None,
    slice_rows: int = 256,
) -> int:
    cols = ["question", "messages", "gt"]
    if opts.keep_metadata:
        cols += ["_source_file", "_source_row", "_turns"]
    base = table.select(cols)
    schema = base.schema
    if opts.keep_metadata:
        schema = schema.append(pa.field("_resample_multiplier", pa.int64())).append(
            pa.field("_sample_copy", pa.int64())
        )
    if order is not None:
        index = [index[k] for k in order]
        copies = [copies[k] for k in order]
        mults = [mults[k] for k in order]
    jsonl = (out_dir / FINAL_JSONL).open("w", encoding="utf-8") if opts.write_jsonl else None
    try:
        with pq.ParquetWriter(out_dir / FINAL_PARQUET, schema) as writer:
            for s in range(0, len(index), slice_rows):
                part = base.take(pa.array(index[s : s + slice_rows], pa.int64()))
                if opts.keep_metadata:
                    part = part.append_column(
                        "_resample_multiplier", pa.array(mults[s : s + slice_rows], pa.int64())
                    ).append_column(
                        "_sample_copy", pa.array(copies[s : s + slice_rows], pa.int64())
                    )
                writer.write_table(part)
                if jsonl is not None:
                    for rec in part.to_pylist():
                        jsonl.write(json.dumps(_plain_messages(rec), ensure_ascii=False) + "\n")
    finally:
        if jsonl is not None:
            jsonl.close()
    return len(index)


def _plain_messages(rec: dict[str, Any]) -> dict[str, Any]:
    """Drop null extra message fields that only exist because another input had them."""
    msgs = rec.get("messages")
    if isinstance(msgs, list):
        rec["messages"] = [
            {k: v for k, v in m.items() if v is not None or k in ("role", "content")}
            for m in msgs
        ]
    return rec

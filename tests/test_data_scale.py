"""drvenus data clean at scale: memory that does not grow with the input, and output that does
not depend on how it is cut (chunks, row groups, parts of the final write).

Needs no shared data: the rows are made here.
"""

from __future__ import annotations

import functools
import hashlib
import json
import mmap
import random
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from drvenus.data import pipeline
from drvenus.data.normalize import loads_tool_call
from drvenus.data.pipeline import CleanOptions, run_clean
from drvenus.data.reading import read_chunks
from drvenus.data.resample import Resampled, ResamplePolicy, Resampler, resample
from drvenus.data.scratch import ValidRows
from drvenus.data.writing import LazyParquetWriter, OutputFiles, write_final
from drvenus.protocol._json import loads_json5

ANSWER = "<think>\ndone\n</think>\n<answer>\nA{k}\n</answer>"
LINUX_MADVISE = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and hasattr(mmap, "MADV_DONTNEED")),
    reason="resident-page accounting is Linux's /proc",
)


def _call(k: int, t: int) -> str:
    return ('<think>\nlook it up\n</think>\n<tool_call>\n{"name": "search", "arguments": '
            f'{{"query": ["q{k}-{t}"]}}}}\n</tool_call>')


def clean_row(k: int, turns: int, pad: int = 0) -> dict:
    """An already-clean valid row with ``turns`` distinct search turns (so turn-count copies
    of 1, 2 and 5 all occur) and ``pad`` extra characters in each tool response."""
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": f"Q{k}?"}]
    for t in range(turns):
        msgs.append({"role": "assistant", "content": _call(k, t)})
        msgs.append({"role": "user",
                     "content": f"<tool_response>\n[{k}, {t}] {'x' * pad}\n</tool_response>"})
    msgs.append({"role": "assistant", "content": ANSWER.format(k=k)})
    return {"question": f"Q{k}?", "gt": f"A{k}", "messages": msgs}


@pytest.fixture(scope="module")
def varied_input(tmp_path_factory) -> Path:
    """Three files of rows with 0 to 120 turns and uneven sizes (plus two invalid rows)."""
    folder = tmp_path_factory.mktemp("varied")
    rng = random.Random(3)
    k = 0
    for f in range(3):
        rows = []
        for _ in range(17 + 5 * f):
            rows.append(clean_row(k, rng.choice([0, 1, 3, 55, 120]), pad=rng.randrange(2000)))
            k += 1
        rows.append({"question": "bad", "gt": "x", "messages": [{"role": "user",
                                                                 "content": "hi"}]})
        pq.write_table(pa.Table.from_pylist(rows), folder / f"train-{f:05d}.parquet",
                       row_group_size=9)
    return folder


def _run(inp: Path, out: Path, **kw) -> dict:
    stats = run_clean(CleanOptions(
        input=inp, output_dir=out, correctness="off", current_date="2026-03-01", shuffle=True,
        seed=7, keep_metadata=True, write_jsonl=True, keep_intermediate=True,
        **{"workers": 1, **kw}))
    for key in ("timing", "output_dir", "artifacts", "options"):
        stats.pop(key, None)  # where and how it ran, not what it found
    return stats


def _rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


# --------------------------------------------------------------------------- end to end


def test_output_is_the_same_for_any_chunk_size_part_size_and_worker_count(
    varied_input, tmp_path, monkeypatch
):
    """Chunks of 1 to 32 rows, 1 or 2 workers, final parts of 3 rows or of the default size:
    the same rows in the same order in every output, and the same stats."""
    base = _run(varied_input, tmp_path / "base", chunk_rows=32)
    final = tmp_path / "base" / "cleaned_resampled.parquet"
    assert {"x1", "x2", "x5"} <= {f"x{m}" for m in
                                  pq.read_table(final).column("_resample_multiplier").to_pylist()}
    runs = {"chunk1": {"chunk_rows": 1}, "chunk7w2": {"chunk_rows": 7, "workers": 2}}
    for name, kw in runs.items():
        stats = _run(varied_input, tmp_path / name, **kw)
        assert stats == base
        for out in ("cleaned_resampled.parquet", "stage1_normalized.parquet",
                    "stage2_deduped.parquet", "cleaned_resampled.jsonl"):
            # The same row groups too: the files are byte for byte the same.
            assert (tmp_path / name / out).read_bytes() == (tmp_path / "base" / out).read_bytes()
    monkeypatch.setattr(pipeline, "write_final",
                        functools.partial(write_final, max_rows=3, max_bytes=10**9))
    _run(varied_input, tmp_path / "small-parts", chunk_rows=5)
    small = tmp_path / "small-parts" / "cleaned_resampled.parquet"
    assert _rows(small) == _rows(final)
    meta = pq.read_metadata(small)
    assert {meta.row_group(i).num_rows for i in range(meta.num_row_groups - 1)} == {3}
    assert ((tmp_path / "small-parts" / "cleaned_resampled.jsonl").read_text()
            == (tmp_path / "base" / "cleaned_resampled.jsonl").read_text())


def test_final_parts_are_bounded_by_bytes(varied_input, tmp_path, monkeypatch):
    """A part ends at the row that reaches ``max_bytes``: long rows make short row groups."""
    _run(varied_input, tmp_path / "base")
    monkeypatch.setattr(pipeline, "write_final",
                        functools.partial(write_final, max_rows=1000, max_bytes=20_000))
    _run(varied_input, tmp_path / "bytes")
    meta = pq.read_metadata(tmp_path / "bytes" / "cleaned_resampled.parquet")
    sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert len(set(sizes)) > 1 and max(sizes) < 1000
    assert (_rows(tmp_path / "bytes" / "cleaned_resampled.parquet")
            == _rows(tmp_path / "base" / "cleaned_resampled.parquet"))


# --------------------------------------------------------------------------- the writer


def _batches(n: int, sizes: list[int]) -> list[pa.RecordBatch]:
    """Rows 0..n-1 (id, text of varying length) cut into batches of ``sizes`` rows."""
    ids = list(range(n))
    table = pa.table({"id": ids, "text": [f"row {i} " + "y" * (i % 50) for i in ids]})
    out, start = [], 0
    for size in sizes:
        out.append(pa.RecordBatch.from_pylist(table.slice(start, size).to_pylist(),
                                              schema=table.schema))
        start += size
    assert start == n
    return out


def test_writer_never_holds_more_than_one_row_group(tmp_path):
    sizes = [3, 7, 1, 25, 0, 4, 12, 1, 1, 6]
    writer = LazyParquetWriter(tmp_path / "a.parquet", _batches(60, sizes)[0].schema, max_rows=10)
    for batch in _batches(60, sizes):
        writer.write(batch)
        assert writer._pending_rows < 10 and writer.pending_batches <= 10
    writer.close()
    meta = pq.read_metadata(tmp_path / "a.parquet")
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [10] * 6
    assert pq.read_table(tmp_path / "a.parquet").column("id").to_pylist() == list(range(60))


def test_writer_row_groups_do_not_depend_on_the_batches_written(tmp_path):
    files = []
    for k, sizes in enumerate([[60], [1] * 60, [3, 7, 1, 25, 0, 4, 12, 8]]):
        w = LazyParquetWriter(tmp_path / f"{k}.parquet", _batches(60, sizes)[0].schema,
                              max_rows=16)
        for b in _batches(60, sizes):
            w.write(b)
        w.close()
        files.append((tmp_path / f"{k}.parquet").read_bytes())
    assert files[0] == files[1] == files[2]


def test_writer_flushes_when_the_bytes_bound_is_reached(tmp_path):
    batches = _batches(60, [1] * 30 + [5] * 6)
    w = LazyParquetWriter(tmp_path / "b.parquet", batches[0].schema, max_rows=16, max_bytes=300)
    for b in batches:
        w.write(b)
        assert w._pending_bytes < 300  # written as soon as the bound is reached
    w.close()
    meta = pq.read_metadata(tmp_path / "b.parquet")
    groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert sum(groups) == 60 and max(groups) < 16  # the bytes bound cut every group short
    assert pq.read_table(tmp_path / "b.parquet").column("id").to_pylist() == list(range(60))


def test_writer_without_rows_writes_no_file(tmp_path):
    w = LazyParquetWriter(tmp_path / "none.parquet", pa.schema([("id", pa.int64())]))
    w.write(pa.RecordBatch.from_pylist([], schema=w.schema))
    w.close()
    assert not (tmp_path / "none.parquet").exists()


# --------------------------------------------------------------------------- the mapping


def _rss_file_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no RssFile in /proc/self/status")


def _valid_file(path: Path, batches: int, rows: int, width: int) -> list[int]:
    """A scratch file shaped like the valid rows (question, messages, gt), ids in order."""
    msg = pa.struct([("role", pa.string()), ("content", pa.string())])
    schema = pa.schema([("question", pa.string()), ("messages", pa.list_(msg)),
                        ("gt", pa.string())])
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema) as out:
        for b in range(batches):
            ids = range(b * rows, (b + 1) * rows)
            out.write_batch(pa.RecordBatch.from_pylist([
                {"question": f"{i:08d}", "gt": str(i),
                 "messages": [{"role": "user", "content": f"{i:08d}" + "z" * width}]}
                for i in ids], schema=schema))
    return list(range(batches * rows))


@LINUX_MADVISE
def test_release_drops_the_pages_read_through_the_mapping(tmp_path):
    _valid_file(tmp_path / "valid.arrow", batches=64, rows=16, width=32_000)  # ~32 MB
    with ValidRows(tmp_path / "valid.arrow") as valid:
        before = _rss_file_mib()
        for batch in valid.batches:  # read every byte of the message text
            content = batch.column("messages").flatten().field("content")
            hashlib.sha256(memoryview(content.buffers()[2])).digest()
        touched = _rss_file_mib() - before
        valid.release()
        after = _rss_file_mib() - before
        assert touched > 24 and after < 4, (touched, after)
        first = valid.batches[0].column("question")[0].as_py()  # read again after release
        assert first == "00000000"


@LINUX_MADVISE
def test_final_write_keeps_at_most_one_part_resident(tmp_path, monkeypatch):
    """The final write walks the rows in resample order; the mapped pages it reads are
    released after each part, so resident pages stay near one part, not the file."""
    ids = _valid_file(tmp_path / "valid.arrow", batches=64, rows=16, width=32_000)
    order = ids * 2
    random.Random(1).shuffle(order)
    sample = Resampled(index=order, copies=[0] * len(order), multipliers=[2] * len(order))
    resident: list[float] = []
    with OutputFiles(tmp_path / "out") as out, ValidRows(tmp_path / "valid.arrow") as valid:
        real = valid.release

        def release() -> None:
            resident.append(_rss_file_mib())
            real()

        monkeypatch.setattr(valid, "release", release)
        base = _rss_file_mib()
        write_final(valid, sample, out, keep_metadata=False, write_jsonl=False, max_rows=8,
                    max_bytes=200_000)
        out.commit()
    meta = pq.read_metadata(tmp_path / "out" / "cleaned_resampled.parquet")
    groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert len(resident) == len(groups)  # released after every part
    assert max(groups) == 7  # 200 KB: the 7th row of 32 KB reaches it (8 rows would be allowed)
    assert max(resident) - base < 12, max(resident) - base  # the file is ~32 MB
    got = pq.read_table(tmp_path / "out" / "cleaned_resampled.parquet")
    assert [int(q) for q in got.column("question").to_pylist()] == order


# --------------------------------------------------------------------------- reading


def test_one_row_group_parquet_is_read_in_bounded_memory(tmp_path):
    """A file written as one big row group (pandas' default) is read a few MB at a time,
    and the chunks hold exactly the file's rows."""
    rows = [{"question": f"Q{k}", "gt": f"A{k}",
             "messages": [{"role": "user", "content": f"{k}.{m} " + "w" * 2_000}
                          for m in range(20)]} for k in range(600)]
    path = tmp_path / "one.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, compression="none",
                   row_group_size=len(rows))
    assert pq.read_metadata(path).num_row_groups == 1  # ~24 MB of messages in one chunk
    del rows

    def peak(chunks) -> tuple[int, list]:
        base, most, got = pa.total_allocated_bytes(), 0, []
        for chunk in chunks:
            most = max(most, pa.total_allocated_bytes() - base)
            got.extend(r["question"] for r in chunk.decode())
        return most, got

    unbuffered = pq.ParquetFile(path)  # the control: the column chunk is read whole
    control, _ = peak(type("C", (), {"decode": lambda s, b=b: b.to_pylist()})()
                      for b in unbuffered.iter_batches(batch_size=32))
    assert control > 20 * 2**20
    most, got = peak(read_chunks(path, 32, pytest.fail))
    assert most < 12 * 2**20, most
    assert got == [f"Q{k}" for k in range(600)]


# --------------------------------------------------------------------------- resample


@pytest.mark.parametrize("seed", [None, 42])
def test_resampler_fed_in_pieces_matches_resample(seed):
    rng = random.Random(11)
    n = 500
    keep = [rng.random() < 0.8 for _ in range(n)]
    turns = [rng.choice([0, 10, 50, 51, 100, 101, 300]) for _ in range(n)]
    tools = [[rng.choice(["search", "visit"]) for _ in range(rng.randrange(4))] for _ in range(n)]
    files = [f"f{i // 120}" for i in range(n)]
    policy = ResamplePolicy()
    whole = resample(keep, turns, tools, files, policy, shuffle_seed=seed)
    sampler = Resampler(policy)
    start = 0
    while start < n:
        end = min(n, start + rng.randrange(0, 40))
        sampler.add(keep[start:end], turns[start:end], tools[start:end], files[start:end])
        start = end
    pieces = sampler.result(seed)
    assert pieces == whole
    assert list(pieces.tools.items()) == list(whole.tools.items())  # stats.json order too


# --------------------------------------------------------------------------- tool calls


CALLS = [
    '{"name": "search", "arguments": {"query": ["a", "b"]}}',
    "{'name': 'search', 'arguments': {'query': ['it\\'s', \"a 'b'\"]}}",
    "{'name': 'search', 'arguments': {'query': ['say \"hi\"', 'x']}}",
    "{'name': 'visit', 'arguments': {'url': 'http://a.b/c?d=1&e=f', 'goal': 'g'}}",
    "{name: 'x', 'a': [1, 2,],}",
    "{'a': Infinity, 'b': NaN}",
    "{'a': 0x1F, 'b': +1, 'c': .5}",
    "{'a': 'tab\there', 'b': 'new\nline'}",
    '{"a": "q\\"x", \'b\': \'c\'}',
    "{'a': '\u00e9\u4e2d\u2028'}",
    "{'a': 1e5, 'b': -0.5, 'c': true, 'd': null, 'e': 12345678901234567890123}",
    "{'a': 'unclosed}",
    "{'a': \"unclosed}",
    "{'a': '\\u0041', 'b': '\\x41'}",
    "['a', \"b\", 'c\"d', \"e'f\"]",
    "// comment\n{'a': 1}",
    "{'a': 'b' 'c'}",
    "not json at all",
    "",
]


def _outcome(fn, text):
    try:
        return ("ok", fn(text))
    except Exception:
        return ("error", None)


@pytest.mark.parametrize("text", CALLS)
def test_tool_call_fast_path_decodes_as_json5_does(text):
    got, want = _outcome(loads_tool_call, text), _outcome(loads_json5, text)
    assert json.dumps(got, default=str) == json.dumps(want, default=str)


def test_tool_call_fast_path_matches_json5_on_random_texts():
    rng = random.Random(5)
    pieces = ["{", "}", "[", "]", ",", ":", " ", "'", '"', "\\", "a", "1", "é", "'k'", '"v"',
              "\\'", '\\"', "true", "null", "\n", "\t", "'x y'", '"x\'y"', "'x\"y'"]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 12)))
        got, want = _outcome(loads_tool_call, text), _outcome(loads_json5, text)
        assert json.dumps(got, default=str) == json.dumps(want, default=str), text

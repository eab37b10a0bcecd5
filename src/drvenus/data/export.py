"""Export a cleaned SFT parquet to the formats other trainers read.

- ``verl``: verl's multi-turn SFT parquet (``messages`` column, plus ``data_source``,
  ``extra_info`` {index, question, ground_truth}).
- ``sharegpt``: JSONL of ``{"conversations": [{"from", "value"}], "system"}``
  (LLaMA-Factory / ShareGPT).
- ``swift``: ms-swift JSONL ``{"messages": [{"role", "content"}]}``.
- ``hf``: a folder ``datasets.load_dataset(folder)`` reads: ``data/train-00000-of-00001.parquet``,
  ``README.md`` with the YAML card, ``dataset_info.json``.

All exports stream the input in record batches.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from drvenus.data.reading import DataInputError, open_cleaned_parquet
from drvenus.protocol import ANSWER_SPLIT, TRAJECTORY_LAYOUT

EXPORT_FORMATS = ("verl", "sharegpt", "swift", "hf")
HF_DATA = "data/train-00000-of-00001.parquet"
HF_FILES = (HF_DATA, "README.md", "dataset_info.json")
_ROLE_TO_SHAREGPT = {"system": "system", "user": "human", "assistant": "gpt", "tool": "observation"}


def _batches(path: Path, batch_rows: int = 256) -> Iterator[list[dict[str, Any]]]:
    pf = open_cleaned_parquet(path)
    cols = [c for c in ("question", "messages", "gt") if c in pf.schema_arrow.names]
    for batch in pf.iter_batches(batch_size=batch_rows, columns=cols):
        yield batch.to_pylist()


def _plain(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def _sharegpt(row: dict[str, Any]) -> dict[str, Any]:
    msgs = _plain(row["messages"])
    out: dict[str, Any] = {}
    if msgs and msgs[0]["role"] == "system":
        out["system"] = msgs[0]["content"]
        msgs = msgs[1:]
    out["conversations"] = [
        {"from": _ROLE_TO_SHAREGPT.get(m["role"], m["role"]), "value": m["content"]} for m in msgs
    ]
    return out


def _write_jsonl(src: Path, dst: Path, convert) -> int:
    n = 0
    with dst.open("w", encoding="utf-8") as fh:
        for rows in _batches(src):
            for row in rows:
                fh.write(json.dumps(convert(row), ensure_ascii=False) + "\n")
                n += 1
    return n


_VERL_SCHEMA = pa.schema([
    pa.field("data_source", pa.string()),
    pa.field("messages", pa.list_(pa.struct([pa.field("role", pa.string()),
                                             pa.field("content", pa.string())]))),
    pa.field("extra_info", pa.struct([pa.field("index", pa.int64()),
                                      pa.field("question", pa.string()),
                                      pa.field("ground_truth", pa.string())])),
])


def _write_verl(src: Path, dst: Path, data_source: str) -> int:
    n = 0
    with pq.ParquetWriter(dst, _VERL_SCHEMA) as writer:
        for rows in _batches(src):
            recs = []
            for row in rows:
                recs.append({
                    "data_source": data_source,
                    "messages": _plain(row["messages"]),
                    "extra_info": {"index": n, "question": row.get("question"),
                                   "ground_truth": row.get("gt")},
                })
                n += 1
            writer.write_table(pa.Table.from_pylist(recs, schema=_VERL_SCHEMA))
    return n


def _write_hf(src: Path, out_dir: Path, name: str) -> int:
    pf = open_cleaned_parquet(src)
    target = out_dir / HF_DATA
    target.parent.mkdir(parents=True, exist_ok=True)
    cols = [c for c in ("question", "messages", "gt") if c in pf.schema_arrow.names]
    schema = pf.schema_arrow
    schema = pa.schema([schema.field(c) for c in cols])
    n = 0
    with _atomic(target) as tmp, pq.ParquetWriter(tmp, schema) as writer:
        for batch in pf.iter_batches(batch_size=256, columns=cols):
            writer.write_batch(batch)
            n += batch.num_rows
    features = {
        "question": {"dtype": "string", "_type": "Value"},
        "messages": [{"role": {"dtype": "string", "_type": "Value"},
                      "content": {"dtype": "string", "_type": "Value"}}],
        "gt": {"dtype": "string", "_type": "Value"},
    }
    info = {"dataset_name": name, "features": features,
            "splits": {"train": {"name": "train", "num_examples": n}}}
    (out_dir / "dataset_info.json").write_text(json.dumps(info, indent=2), encoding="utf-8")
    card = (
        "---\n"
        "configs:\n- config_name: default\n  data_files:\n  - split: train\n"
        "    path: data/train-*.parquet\n"
        "dataset_info:\n  features:\n  - name: question\n    dtype: string\n"
        "  - name: messages\n    list:\n    - name: role\n      dtype: string\n"
        "    - name: content\n      dtype: string\n  - name: gt\n    dtype: string\n"
        f"  splits:\n  - name: train\n    num_examples: {n}\n"
        "---\n\n"
        f"# {name}\n\nDR-Venus-format deep-research SFT trajectories exported by "
        f"`drvenus data export`: `question`, `messages` ({TRAJECTORY_LAYOUT}), "
        "`gt` (ground truth; several accepted answers joined by "
        f"`{ANSWER_SPLIT}`).\n"
    )
    (out_dir / "README.md").write_text(card, encoding="utf-8")
    return n


def export_dataset(src: Path, fmt: str, output: Path, *, name: str = "drvenus-sft") -> int:
    """Write ``src`` (a cleaned parquet) as ``fmt`` to ``output`` (a file; a folder for
    ``hf``). Returns the number of rows written. Raises ``ValueError`` for an unknown format
    and :class:`~drvenus.data.reading.DataInputError` for an unusable ``src``."""
    if fmt not in EXPORT_FORMATS:
        choices = ", ".join(EXPORT_FORMATS)
        raise ValueError(f"unknown export format {fmt!r}; choose one of {choices}")
    open_cleaned_parquet(src)  # bad input fails here, before any output exists
    targets = [output / p for p in HF_FILES] if fmt == "hf" else [output]
    if any(_same_file(src, t) for t in targets):
        raise DataInputError(f"{output}: the export would write over its input {src}; "
                             "choose another output")
    if fmt == "hf":
        return _write_hf(src, output, name)
    output.parent.mkdir(parents=True, exist_ok=True)
    with _atomic(output) as tmp:
        if fmt == "verl":
            return _write_verl(src, tmp, name)
        if fmt == "sharegpt":
            return _write_jsonl(src, tmp, _sharegpt)
        return _write_jsonl(src, tmp, lambda row: {"messages": _plain(row["messages"])})


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


@contextmanager
def _atomic(path: Path) -> Iterator[Path]:
    """A temporary file next to ``path``, renamed onto it when the block completes (removed
    when it fails): an interrupted export leaves the previous ``path``, never half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)

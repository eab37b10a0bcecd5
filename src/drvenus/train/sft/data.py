"""SFT data: read conversations, tokenise them with assistant-only masks, batch them.

Inputs: a parquet file, a JSONL file (``.gz`` too), a JSON file (one object or a list of
objects), or a folder of such files (an HF dataset folder's ``data/*.parquet`` included). A row
has ``messages`` (list of {role, content}) or ShareGPT ``conversations`` (list of {from,
value}, optional ``system``).

Every batch carries ``input_ids``, ``labels`` (-100 off the assistant tokens),
``row_index`` (which row of the batch each token belongs to, -1 on padding: the per-row loss
mean of :mod:`drvenus.train.sft.loss` needs it once rows are packed) and
``position_ids`` that restart at 0 for each row, and no attention mask: transformers reads row
boundaries from ``position_ids`` when the mask is absent (a block-causal mask for sdpa / eager /
flex attention, variable-length kernels for flash attention), so a packed sequence and a batch
padded to one length both attend only within each row. Padding is a segment of its own with
labels -100. The first token of every row gets label -100, so no row is trained to predict
the next row's first token.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drvenus.train.sft.pack import PackedSequence, pack_rows
from drvenus.train.sft.tokenize import IGNORE_INDEX, OverLength, TokenizedRow, TokenizeStats
from drvenus.train.sft.tokenize import tokenize_rows as _tokenize_rows

log = logging.getLogger(__name__)

Conversation = list[dict[str, Any]]
_SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "observation": "user",
                   "system": "system", "function_call": "assistant", "tool": "user"}
_SUFFIXES = (".parquet", ".pq", ".jsonl", ".jsonl.gz", ".json")


class SFTDataError(ValueError):
    """Training data that cannot be used; the message is one line."""


# --------------------------------------------------------------------------- reading


def _conversation(row: dict[str, Any], where: str) -> Conversation:
    if row.get("messages") is not None:
        return [{"role": m["role"], "content": m["content"]} for m in row["messages"]]
    if row.get("conversations") is not None:
        msgs = [{"role": "system", "content": row["system"]}] if row.get("system") else []
        for turn in row["conversations"]:
            msgs.append({"role": _SHAREGPT_ROLES.get(turn["from"], turn["from"]),
                         "content": turn["value"]})
        return msgs
    found = ", ".join(row) or "none"
    raise SFTDataError(f"{where}: no messages (or conversations) column (found: {found})")


def _rows(path: Path) -> Iterator[dict[str, Any]]:
    from drvenus.records import RecordsError, iter_trajectories, parquet_columns

    try:
        if path.suffix.lower() in (".parquet", ".pq"):
            names = parquet_columns(path)
            if not {"messages", "conversations"} & set(names):
                found = ", ".join(names) or "none"
                raise SFTDataError(
                    f"{path}: no messages (or conversations) column (found: {found})"
                )
        for row in iter_trajectories(path, ["messages", "conversations", "system"]):
            if not isinstance(row, dict):
                raise SFTDataError(f"{path}: expected a JSON object or a list of objects")
            yield row
    except RecordsError as exc:
        raise SFTDataError(str(exc)) from None


def data_files(path: Path) -> list[Path]:
    """The file itself, or the data files of a folder (searched recursively, sorted)."""
    if not path.exists():
        raise SFTDataError(f"{path}: no such file or folder")
    if path.is_file():
        return [path]
    files = sorted(p for p in path.rglob("*") if p.is_file() and
                   p.name.lower().endswith(_SUFFIXES) and p.name != "dataset_info.json")
    if not files:
        raise SFTDataError(f"{path}: no parquet / JSONL / JSON files in the folder")
    return files


def read_conversations(path: str | Path) -> list[Conversation]:
    """All conversations of a file or folder; :class:`SFTDataError` for unusable input."""
    rows: list[Conversation] = []
    for file in data_files(Path(path)):
        for i, row in enumerate(_rows(file)):
            try:
                rows.append(_conversation(row, str(file)))
            except (KeyError, TypeError) as exc:
                raise SFTDataError(f"{file}: row {i}: malformed message ({exc})") from None
    if not rows:
        raise SFTDataError(f"{path}: no rows")
    return rows


def split_validation(
    rows: Sequence[Conversation], fraction: float, seed: int
) -> tuple[list[Conversation], list[Conversation]]:
    """A seeded random ``fraction`` of ``rows`` (at least one) held out for validation."""
    if not fraction:
        return list(rows), []
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    n_val = max(1, round(fraction * len(rows)))
    if n_val >= len(rows):
        raise SFTDataError(f"--val-fraction {fraction} leaves no training rows of {len(rows)}")
    held = set(order[:n_val])
    return ([r for i, r in enumerate(rows) if i not in held],
            [r for i, r in enumerate(rows) if i in held])


# --------------------------------------------------------------------------- tokenised dataset


@dataclass
class Example:
    """One training sequence: one row, or several packed rows (``seq_lens``)."""

    input_ids: list[int]
    loss_mask: list[int]
    seq_lens: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class SFTData:
    """A tokenised split: the sequences and what tokenisation kept, cut and skipped."""

    examples: list[Example]
    stats: TokenizeStats = field(default_factory=TokenizeStats)
    rows: int = 0

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> Example:
        return self.examples[i]

    @property
    def tokens(self) -> int:
        return sum(len(e) for e in self.examples)


def tokenize_dataset(
    conversations: Iterable[Conversation],
    tokenizer: Any,
    max_length: int,
    *,
    over_length: OverLength = "truncate",
    packing: bool = False,
    train_after_end_of_turn: bool = False,
) -> SFTData:
    """Tokenise (skipping and counting unmaskable rows), then pack if asked.
    ``train_after_end_of_turn``: see :mod:`drvenus.train.sft.tokenize`."""
    stats = TokenizeStats()
    rows: list[TokenizedRow] = list(_tokenize_rows(
        conversations, tokenizer, max_length, over_length=over_length, stats=stats,
        train_after_end_of_turn=train_after_end_of_turn))
    if packing:
        packed: Iterable[PackedSequence] = pack_rows(rows, max_length)
        examples = [Example(p.input_ids, p.loss_mask, p.seq_lens) for p in packed]
    else:
        examples = [Example(r.input_ids, r.loss_mask, [len(r)]) for r in rows]
    if not examples:
        raise SFTDataError(f"no trainable rows ({stats.rows} read, skipped: {dict(stats.skipped)})")
    return SFTData(examples, stats, len(rows))


# --------------------------------------------------------------------------- collator


@dataclass
class SFTCollator:
    """Batches :class:`Example` s: pads to the longest with ``pad_token_id`` (labels -100,
    positions of their own), adds per-row ``position_ids``, ``row_index`` (the row each token
    belongs to, numbered 0.. over the batch, packed rows counted one by one; -1 on padding) and
    ``real_tokens`` (non-padding tokens in the batch, for throughput logs). The trainer removes
    ``row_index`` and ``real_tokens`` before the forward."""

    pad_token_id: int = 0

    def __call__(self, batch: Sequence[Example]) -> dict[str, Any]:
        import torch

        width = max(len(e) for e in batch)
        ids, labels, positions, rows = [], [], [], []
        row = 0
        for e in batch:
            row_labels = [t if m else IGNORE_INDEX for t, m in zip(e.input_ids, e.loss_mask,
                                                                   strict=True)]
            row_pos: list[int] = []
            row_ids: list[int] = []
            for n in e.seq_lens:
                row_labels[len(row_pos)] = IGNORE_INDEX
                row_pos += range(n)
                row_ids += [row] * n
                row += 1
            pad = width - len(e)
            ids.append(e.input_ids + [self.pad_token_id] * pad)
            labels.append(row_labels + [IGNORE_INDEX] * pad)
            positions.append(row_pos + list(range(pad)))
            rows.append(row_ids + [-1] * pad)
        return {
            "input_ids": torch.tensor(ids, dtype=torch.long),
            "labels": torch.tensor(labels, dtype=torch.long),
            "position_ids": torch.tensor(positions, dtype=torch.long),
            "row_index": torch.tensor(rows, dtype=torch.long),
            "real_tokens": torch.tensor(sum(len(e) for e in batch), dtype=torch.long),
        }


__all__ = ["Example", "SFTCollator", "SFTData", "SFTDataError", "data_files",
           "read_conversations", "split_validation", "tokenize_dataset"]

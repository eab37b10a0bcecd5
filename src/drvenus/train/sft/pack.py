"""Packing: several short tokenised rows in one sequence, each row attending only to itself.

A packed sequence carries ``position_ids`` that restart at 0 for every row and the row lengths
(``seq_lens``). Attention kernels that take variable-length batches (flash attention through
transformers' packed-sequence support) read the boundaries from ``position_ids``; for the
others :func:`block_causal_mask` builds the equivalent 4-D mask (causal inside a row, nothing
across rows). Rows are placed first-fit in arrival order, so packing streams and is
deterministic; a row longer than ``max_length`` must be cut or dropped before packing.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from drvenus.train.sft.tokenize import TokenizedRow


@dataclass
class PackedSequence:
    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    position_ids: list[int] = field(default_factory=list)
    seq_lens: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.input_ids)

    def add(self, row: TokenizedRow) -> None:
        self.input_ids += row.input_ids
        self.loss_mask += row.loss_mask
        self.position_ids += range(len(row))
        self.seq_lens.append(len(row))


def pack_rows(
    rows: Iterable[TokenizedRow], max_length: int, *, open_bins: int = 64
) -> Iterator[PackedSequence]:
    """Pack ``rows`` into sequences of at most ``max_length`` tokens (first fit among the
    ``open_bins`` most recent unfinished sequences; the fullest is emitted when more are
    needed). Raises ``ValueError`` for a row longer than ``max_length``."""
    if max_length < 1:
        raise ValueError("max_length must be positive")
    bins: list[PackedSequence] = []
    for row in rows:
        if len(row) > max_length:
            raise ValueError(f"a row of {len(row)} tokens does not fit max_length {max_length}")
        target = next((b for b in bins if len(b) + len(row) <= max_length), None)
        if target is None:
            if len(bins) >= open_bins:
                fullest = max(bins, key=len)
                bins.remove(fullest)
                yield fullest
            target = PackedSequence()
            bins.append(target)
        target.add(row)
        if len(target) == max_length:
            bins.remove(target)
            yield target
    yield from bins


def padding_efficiency(lengths: Sequence[int], max_length: int) -> float:
    """Fraction of real (non-padding) tokens when every sequence is padded to ``max_length``."""
    return sum(lengths) / (len(lengths) * max_length) if lengths else 0.0


def block_causal_mask(seq_lens: Sequence[int], total: int | None = None):  # -> torch.Tensor
    """A boolean ``[1, 1, T, T]`` mask (True = may attend): causal within each row of a packed
    sequence, no attention across rows; padding after the rows attends to nothing."""
    import torch

    length = sum(seq_lens)
    total = length if total is None else total
    segment = torch.full((total,), -1, dtype=torch.long)
    start = 0
    for i, n in enumerate(seq_lens):
        segment[start : start + n] = i
        start += n
    same = (segment[:, None] == segment[None, :]) & (segment[:, None] >= 0)
    causal = torch.ones(total, total, dtype=torch.bool).tril()
    return (same & causal)[None, None]


__all__ = ["PackedSequence", "block_causal_mask", "pack_rows", "padding_efficiency"]

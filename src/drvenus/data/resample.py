"""Stage 7 of ``drvenus data clean``, resample: copy each kept trajectory by its turn count
(DR-Venus's rule), optionally shuffled in DR-Venus's order."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import Field, model_validator
from pydantic.dataclasses import dataclass as options_dataclass

from drvenus.data.shuffle import legacy_permutation

_Turns = Annotated[int, Field(ge=0)]
_Copies = Annotated[int, Field(ge=0)]


@options_dataclass(frozen=True)
class ResamplePolicy:
    """Turn-aware resampling: ``turns <= short_max`` x short, ``<= medium_max`` x medium, else
    x long."""

    short_max_turns: Annotated[_Turns, Field(description="Most turns of a short trajectory.")] = 50
    medium_max_turns: Annotated[
        _Turns, Field(description="Most turns of a medium trajectory (longer ones are long).")
    ] = 100
    short_multiplier: Annotated[_Copies, Field(description="Copies of a short trajectory.")] = 1
    medium_multiplier: Annotated[_Copies, Field(description="Copies of a medium trajectory.")] = 2
    long_multiplier: Annotated[_Copies, Field(description="Copies of a long trajectory.")] = 5

    @model_validator(mode="after")
    def _ordered(self) -> ResamplePolicy:
        if self.medium_max_turns < self.short_max_turns:
            raise ValueError("medium_max_turns must be at least short_max_turns")
        return self

    def multiplier(self, turns: int) -> int:
        if turns <= self.short_max_turns:
            return self.short_multiplier
        if turns <= self.medium_max_turns:
            return self.medium_multiplier
        return self.long_multiplier

    def bucket(self, turns: int) -> str:
        if turns <= self.short_max_turns:
            return f"0-{self.short_max_turns}"
        if turns <= self.medium_max_turns:
            return f"{self.short_max_turns + 1}-{self.medium_max_turns}"
        return f">{self.medium_max_turns}"

    def as_dict(self) -> dict[str, int]:
        return {
            "short_max_turns": self.short_max_turns,
            "medium_max_turns": self.medium_max_turns,
            "short_multiplier": self.short_multiplier,
            "medium_multiplier": self.medium_multiplier,
            "long_multiplier": self.long_multiplier,
        }


@dataclass
class Resampled:
    """The final rows as positions in the valid-row table, and the counts ``stats.json`` reports.

    ``index[k]`` is the valid row of final row ``k``, ``copies[k]`` its copy number and
    ``multipliers[k]`` the number of copies made of it (in output order, shuffled or not).
    """

    index: list[int] = field(default_factory=list)
    copies: list[int] = field(default_factory=list)
    multipliers: list[int] = field(default_factory=list)
    kept_per_file: Counter = field(default_factory=Counter)
    tools: Counter = field(default_factory=Counter)
    buckets_original: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    buckets_resampled: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    multiplier_counts: Counter = field(default_factory=Counter)


class Resampler:
    """:func:`resample` fed in pieces: :meth:`add` the valid rows in order, a batch at a time
    (only the small columns it reads, so no column of the whole input is ever held as Python
    objects), then :meth:`result`."""

    def __init__(self, policy: ResamplePolicy):
        self.policy = policy
        self.rows = 0
        self._out = Resampled()

    def add(
        self,
        keep: Sequence[bool],
        turns: Sequence[int],
        tool_names: Sequence[list[str]],
        source_files: Sequence[str],
    ) -> None:
        """The next ``len(keep)`` valid rows (their positions follow the rows added before)."""
        out, policy, base = self._out, self.policy, self.rows
        for i, kept in enumerate(keep):
            if not kept:
                continue
            out.kept_per_file[source_files[i]] += 1
            out.tools.update(tool_names[i])
            m = policy.multiplier(turns[i])
            bucket = policy.bucket(turns[i])
            out.buckets_original[bucket] += 1
            out.multiplier_counts[str(m)] += 1
            for c in range(m):
                out.index.append(base + i)
                out.copies.append(c)
                out.multipliers.append(m)
                out.buckets_resampled[bucket] += 1
        self.rows += len(keep)

    def result(self, shuffle_seed: int | None = None) -> Resampled:
        """The copies in row order, or in ``RandomState(shuffle_seed).permutation`` order."""
        out = self._out
        if shuffle_seed is not None:
            order = legacy_permutation(len(out.index), shuffle_seed)
            out.index = [out.index[k] for k in order]
            out.copies = [out.copies[k] for k in order]
            out.multipliers = [out.multipliers[k] for k in order]
        return out


def resample(
    keep: Sequence[bool],
    turns: Sequence[int],
    tool_names: Sequence[list[str]],
    source_files: Sequence[str],
    policy: ResamplePolicy,
    shuffle_seed: int | None = None,
) -> Resampled:
    """Copies of each kept row by :meth:`ResamplePolicy.multiplier`, in row order, then in
    ``numpy.random.RandomState(shuffle_seed).permutation`` order when a seed is given."""
    sampler = Resampler(policy)
    sampler.add(keep, turns, tool_names, source_files)
    return sampler.result(shuffle_seed)

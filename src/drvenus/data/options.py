"""The options of ``drvenus data clean``, declared once.

Each option is one field of :class:`CleanOptions` (or of the nested
:class:`~drvenus.data.resample.ResamplePolicy` and :class:`~drvenus.grading.judge.JudgeConfig`):
type, default, constraints and help text. Making a ``CleanOptions`` validates them (a
``pydantic.ValidationError``, which is a ``ValueError``); ``drvenus data clean`` derives its
command-line options from the same fields (see :mod:`drvenus.flags`).
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from drvenus.data.resample import ResamplePolicy
from drvenus.flags import Cli
from drvenus.grading.judge import JudgeConfig
from drvenus.protocol.profiles import check_protocol

CORRECTNESS_MODES = ("off", "em", "f1", "judge")
CorrectnessMode = Literal["off", "em", "f1", "judge"]


def _flag(short: str | None = None, long: str | None = None) -> Cli:
    return Cli(flags=tuple(f for f in (long, short) if f))


class CleanOptions(BaseModel):
    """Options of ``drvenus data clean`` (defaults are DR-Venus's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: Annotated[
        Path, _flag("-i", "--input"), Field(description="Parquet/JSONL file or directory.")
    ]
    output_dir: Annotated[
        Path, _flag("-o", "--output-dir"), Field(description="Output directory.")
    ]
    file_pattern: Annotated[
        str, Field(min_length=1, description="Glob when --input is a directory.")
    ] = "train-*.parquet"
    system_prompt_mode: Annotated[
        Literal["template", "row"], Field(description="template | row")
    ] = "template"
    current_date: Annotated[
        str | None, Field(description="YYYY-MM-DD for the system prompt (default today).")
    ] = None
    system_prompt_file: Annotated[
        Path | None, Field(description="Use this file verbatim as the system prompt.")
    ] = None
    protocol: Annotated[
        Annotated[str, AfterValidator(check_protocol)] | None,
        Field(description="Whose system prompt the template mode writes: drvenus (ours) or "
                          "dr-venus (DR-Venus's exact one, its own date unless --current-date "
                          "is given, read from its pinned files: drvenus reference pull, or "
                          "DRVENUS_REFERENCE_DIR) (default: DRVENUS_PROTOCOL, else drvenus)."),
    ] = None
    allowed_tools: Annotated[
        tuple[str, ...],
        Cli(type=list[str] | None, default=None),
        Field(min_length=1,
              description="Tools to keep, repeated or comma-separated (search,visit)."),
    ] = ("search", "visit")
    correctness: Annotated[
        CorrectnessMode | None,
        Field(description="off | em | f1 | judge (default: judge if a judge is configured, "
                          "else f1)."),
    ] = None
    f1_threshold: Annotated[
        float, Field(ge=0.0, le=1.0, description="Keep rows with answer F1 >= this (f1 mode).")
    ] = 0.5
    judge: Annotated[JudgeConfig | None, Cli(expand="judge_")] = None
    keep_judge_failures: Annotated[
        bool,
        Field(description="Keep rows whose judge call failed (default: drop them, counted as "
                          "judge_failed)."),
    ] = False
    strict_format: Annotated[
        bool,
        Field(description="Also drop rows whose assistant turns fail the protocol's strict "
                          "format check."),
    ] = False
    policy: Annotated[ResamplePolicy, Cli(expand="")] = Field(default_factory=ResamplePolicy)
    shuffle: Annotated[
        bool, Field(description="Shuffle the resampled rows (as DR-Venus).")
    ] = False
    seed: Annotated[
        int, Field(ge=0, le=2**32 - 1, description="Shuffle seed (numpy's, as DR-Venus).")
    ] = 42
    keep_intermediate: Annotated[
        bool, Field(description="Write stage1/stage2 parquet files.")
    ] = False
    keep_metadata: Annotated[
        bool,
        Field(description="Keep _source_file/_source_row/_turns/_resample_multiplier/"
                          "_sample_copy columns."),
    ] = False
    write_jsonl: Annotated[
        bool, Field(description="Also write cleaned_resampled.jsonl.")
    ] = False
    workers: Annotated[
        int | None, Field(ge=1, description="Worker processes (default: CPU cores).")
    ] = None
    chunk_rows: Annotated[int, Field(ge=1, description="Rows per work chunk.")] = 32

    @field_validator("allowed_tools", mode="before")
    @classmethod
    def _split_tools(cls, value: Any) -> Any:
        """``"search,visit"`` or ``["search", "visit,x"]``: names, commas split, blanks dropped."""
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, Iterable):
            return value
        return tuple(t.strip() for item in items for t in str(item).split(",") if t.strip())

    @field_validator("current_date")
    @classmethod
    def _iso_date(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                _dt.date.fromisoformat(value)
            except ValueError:
                raise ValueError(f"{value!r} is not a YYYY-MM-DD date") from None
        return value

    @model_validator(mode="after")
    def _judge_configured(self) -> CleanOptions:
        if self.correctness == "judge" and self.judge is None:
            raise ValueError(
                "--correctness judge needs --judge-base-url and --judge-model "
                "(or DRVENUS_JUDGE_BASE_URL / DRVENUS_JUDGE_MODEL)"
            )
        return self

    @property
    def correctness_mode(self) -> str:
        """As given, else ``judge`` with a configured judge, else ``f1``."""
        if self.correctness is not None:
            return self.correctness
        return "judge" if self.judge is not None else "f1"

    @property
    def worker_count(self) -> int:
        return self.workers or os.cpu_count() or 1

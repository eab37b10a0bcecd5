"""The terminal rendering of the CLI: a research run live (from the agent's trace events), a
batch live (its progress and a line per question in flight) and the summary of a batch."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markdown import Markdown
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from drvenus import protocol
from drvenus.agent import TraceEvent
from drvenus.agent.words import (
    FORCED_NOTE,
    error_words,
    is_forced,
    no_answer_reason,
    no_answer_text,
    termination_words,
)
from drvenus.text import counted, headline


def _short(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


class LiveTrace:
    """Prints each step as it happens: queries and result titles, visited URLs, the answer."""

    def __init__(self, console: Console, show_thinking: bool = False) -> None:
        self.console = console
        self.show_thinking = show_thinking

    def __call__(self, event: TraceEvent) -> None:
        run = event.data.get("heavy_run")
        if run is not None:  # one of Heavy mode's parallel runs: one line per tool call
            self._heavy_member(int(run), event)
            return
        handler = getattr(self, f"_on_{event.type}", None)
        if handler is not None:
            handler(event)

    def _heavy_member(self, run: int, e: TraceEvent) -> None:
        label = f"[bold cyan]run {run + 1}[/]"
        if e.type == "started" and run == 0:
            self.console.print(Panel(escape(e.data["question"]), title="Question", expand=False))
        elif e.type == "tool_call":
            args: dict[str, Any] = e.data["arguments"]
            what = "; ".join(map(str, args.get("query") or args.get("url") or []))
            self.console.print(f"  {label} [green]{escape(e.data['name'])}[/] "
                               f"{escape(_short(what, 100))}")
        elif e.type == "finished":
            r = e.data["record"]
            what = (headline(str(r.get("prediction") or "")) if r["termination"].startswith(
                "answered") else no_answer_reason(r))
            self.console.print(f"  {label} {escape(termination_words(r['termination']))}: "
                               f"{escape(what)}")

    def _on_started(self, e: TraceEvent) -> None:
        if e.data.get("heavy"):  # the synthesis, or the vote (a failed synthesis's fallback too)
            how = ("Voting over the answers of" if e.data.get("heavy_mode") == "vote"
                   else "Writing one answer from")
            self.console.print(f"[bold]{how} {e.data['heavy']} runs[/]")
            return
        self.console.print(Panel(escape(e.data["question"]), title="Question", expand=False))
        model, window = e.data.get("model"), e.data.get("context_window")
        if model:
            limits = f"window {window} tokens · " if window else ""
            self.console.print(
                f"[dim]{escape(str(model))} · {limits}budget {e.data.get('max_context_tokens')} "
                f"tokens · {e.data.get('max_steps')} steps[/]"
            )

    def _on_step_started(self, e: TraceEvent) -> None:
        self.console.print(
            f"[bold cyan]Step {e.step + 1}[/] [dim]· context {e.data['context_tokens']} tokens[/]"
        )

    def _on_model_output(self, e: TraceEvent) -> None:
        if self.show_thinking and e.data.get("kind") != "error":
            parsed = protocol.parse_turn(e.data["text"])
            if parsed.thinking:
                self.console.print(f"  [dim italic]{escape(_short(parsed.thinking, 300))}[/]")

    def _on_error(self, e: TraceEvent) -> None:
        kind = error_words(e.data.get("kind", "error"))
        detail = e.data.get("message") or ""
        label = kind if e.data.get("last") else f"retry ({kind})"
        self.console.print(f"  [yellow]↻ {label}[/] [dim]{escape(_short(detail, 120))}[/]")

    def _on_tool_call(self, e: TraceEvent) -> None:
        args: dict[str, Any] = e.data["arguments"]
        if e.data["name"] == protocol.SEARCH:
            queries = "; ".join(args.get("query", []))
            self.console.print(f"  [green]search[/] {escape(queries)}")
        else:
            urls = ", ".join(args.get("url", []))
            self.console.print(f"  [magenta]visit[/] {escape(urls)}")
            self.console.print(f"    [dim]goal: {escape(_short(args.get('goal', ''), 100))}[/]")

    def _on_tool_result(self, e: TraceEvent) -> None:
        body: str = e.data["content"]
        if e.data["name"] == protocol.SEARCH:
            data = protocol.parse_search_body(body)
            if data is None:
                self.console.print(f"    [red]{escape(_short(body, 160))}[/]")
                return
            for entry in data:
                hits = entry["web_page_info_list"]
                noun = "result" if len(hits) == 1 else "results"
                self.console.print(f"    [dim]{len(hits)} {noun} for[/] {escape(entry['query'])}")
                for hit in hits[:5]:
                    title = escape(_short(hit["title"], 60))
                    self.console.print(f"      • {title} [dim]{escape(hit['url'])}[/]")
            return
        frames = protocol.parse_visit_body(body)
        if frames is None:
            self.console.print(f"    [red]{escape(_short(body, 160))}[/]")
            return
        for frame in frames:
            self.console.print(f"    [dim]summary:[/] {escape(_short(frame['summary'], 200))}")

    def _on_compaction(self, e: TraceEvent) -> None:
        d = e.data
        how = ("restarted from a report" if d.get("report") is not None
               else f"{counted(len(d.get('elided', [])), 'older tool result')} stubbed"
               + (f", {counted(d.get('dropped', 0), 'round')} dropped" if d.get("dropped") else ""))
        self.console.print(
            f"  [blue]context compacted[/] [dim]({escape(str(d.get('strategy')))}: {how}; "
            f"{d.get('tokens_before')} → {d.get('tokens_after')} tokens)[/]"
        )
        if self.show_thinking and d.get("report"):
            self.console.print(f"  [dim italic]{escape(_short(d['report'], 300))}[/]")

    def _on_answer(self, e: TraceEvent) -> None:
        label = "Answer (forced)" if e.data.get("forced") else "Answer"
        if not e.data.get("answer"):
            return
        # a terminal: the model's Markdown rendered (a pipe gets the plain answer, see ask)
        self.console.print(Panel(Markdown(e.data["answer"]), title=label, border_style="green"))

    def _on_finished(self, e: TraceEvent) -> None:
        r = e.data["record"]
        answered = r["termination"].startswith("answered")
        style = "green" if answered else "red"
        self.console.print(
            f"[{style}]{escape(termination_words(r['termination']))}[/] · "
            f"{counted(r['tool_call_count'], 'tool call')} · {counted(r['turns'], 'turn')} · "
            f"context {r['final_token_count']} tokens{_used(r)} · {r['elapsed_seconds']:.1f}s"
        )
        if is_forced(r):
            self.console.print(f"[yellow]{escape(FORCED_NOTE)}[/]")
        if not answered:  # in words, never the model's raw markup
            self.console.print(escape(no_answer_text(r)))


def _used(record: dict[str, Any]) -> str:
    """`` · 220 tokens used`` (the model calls' prompt and completion tokens in all)."""
    usage = record.get("usage") or {}
    used = int(usage.get("prompt_tokens") or 0) + int(usage.get("completion_tokens") or 0)
    return f" · {used} tokens used" if used else ""


def _pace(done: int, total: int, seconds: float) -> str:
    """``2.5/min · eta 0:04:00`` from the mean pace so far (empty before the first result)."""
    if done <= 0 or seconds <= 0:
        return ""
    per_second = done / seconds
    if per_second >= 1:
        rate = f"{per_second:.1f}/s"
    elif per_second * 60 >= 1:
        rate = f"{per_second * 60:.1f}/min"
    else:
        rate = f"{per_second * 3600:.1f}/h"
    left = max(total - done, 0) / per_second
    return f"{rate} · eta {int(left // 3600)}:{int(left % 3600 // 60):02d}:{int(left % 60):02d}"


class BatchProgress:
    """A batch live (``drvenus run``, ``drvenus eval``): the overall bar with the rate and an
    ETA from the mean pace so far, and a line per question in flight: which one, its step and
    what it does now (the query it searches, the page it reads). Feed it with :meth:`event`
    (every trace event of an item) and :meth:`done` (each saved record); use it as a context
    manager. ``label_of``: how a question is named on its line (e.g. its id only, for a
    benchmark whose questions must not be shown)."""

    def __init__(self, console: Console, total: int, label: str = "research", *,
                 label_of: Any = None) -> None:
        self.console = console
        self.total = total
        self.label_of = label_of or (lambda item: _short(item.question, 48))
        self.overall = Progress(
            TextColumn(f"[bold]{escape(label)}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("{task.fields[pace]}"),
            TextColumn("{task.fields[last]}"), console=console,
        )
        self.task = self.overall.add_task(label, total=total, pace="", last="")
        self.active: dict[str, tuple[str, int, str]] = {}  # id -> (label, step, doing)
        self.finished = 0
        self.started = time.monotonic()
        self.live = Live(self, console=console, refresh_per_second=4)

    def __enter__(self) -> BatchProgress:
        self.started = time.monotonic()
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.active.clear()
        self.live.__exit__(None, None, None)

    def __rich__(self) -> RenderableType:
        seconds = time.monotonic() - self.started
        self.overall.update(self.task, pace=_pace(self.finished, self.total, seconds))
        lines = Table.grid(padding=(0, 1))
        lines.add_column(no_wrap=True, overflow="ellipsis", max_width=50)
        lines.add_column(no_wrap=True)
        lines.add_column(no_wrap=True, overflow="ellipsis")
        for label, step, doing in list(self.active.values()):
            lines.add_row("  " + escape(label), f"[cyan]step {step}[/]", escape(doing))
        return Group(self.overall, lines) if self.active else self.overall

    def event(self, item: Any, event: TraceEvent) -> None:
        """One trace event of ``item``'s run (Heavy mode's runs share its line)."""
        if event.type == "finished" and "heavy_run" not in event.data:
            self.active.pop(item.id, None)
            return
        label, step, doing = self.active.get(item.id) or (self.label_of(item), 0, "starting")
        if event.type == "step_started":
            step, doing = event.step + 1, "thinking"
        elif event.type == "tool_call":
            args = event.data.get("arguments") or {}
            if event.data.get("name") == protocol.SEARCH:
                doing = "search: " + _short("; ".join(map(str, args.get("query") or [])), 80)
            else:
                doing = "visit: " + _short(", ".join(map(str, args.get("url") or [])), 80)
        elif event.type == "error":
            doing = f"retrying ({event.data.get('kind', 'error')})"
        elif event.type == "limit_notice":
            doing = "answering (limit reached)"
        elif event.type == "compaction":
            doing = f"context compacted ({event.data.get('strategy')})"
        elif event.type == "answer":
            doing = "answered"
        self.active[item.id] = (label, step, doing)

    def done(self, item: Any, record: Any) -> None:
        """``item`` finished and saved with ``record``."""
        self.active.pop(item.id, None)
        self.finished += 1
        self.overall.update(self.task, advance=1,
                            last=f"[dim]{escape(termination_words(record.termination))}[/]")


def summary_table(terminations: dict[str, int], elapsed: list[float], skipped: int) -> Table:
    table = Table(title="Batch summary", show_lines=False)
    table.add_column("how the run ended")
    table.add_column("count", justify="right")
    for name, count in sorted(terminations.items(), key=lambda kv: -kv[1]):
        table.add_row(escape(termination_words(name)), str(count))
    table.add_row("[dim]Skipped (already done)[/]", str(skipped))
    if elapsed:
        mean = sum(elapsed) / len(elapsed)
        table.caption = f"{len(elapsed)} finished · mean {mean:.1f}s per question"
    return table

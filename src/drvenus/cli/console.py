"""The terminal rendering of the CLI: a research run live (from the agent's trace events) and
the summary of a batch."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from drvenus import protocol
from drvenus.agent import TraceEvent
from drvenus.text import counted


def _short(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


class LiveTrace:
    """Prints each step as it happens: queries and result titles, visited URLs, the answer."""

    def __init__(self, console: Console, show_thinking: bool = False) -> None:
        self.console = console
        self.show_thinking = show_thinking

    def __call__(self, event: TraceEvent) -> None:
        handler = getattr(self, f"_on_{event.type}", None)
        if handler is not None:
            handler(event)

    def _on_started(self, e: TraceEvent) -> None:
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
        kind = e.data.get("kind", "error")
        detail = e.data.get("message") or ""
        label = f"{kind}, no more attempts" if e.data.get("last") else f"retry ({kind})"
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

    def _on_answer(self, e: TraceEvent) -> None:
        label = "Answer (forced)" if e.data.get("forced") else "Answer"
        if not e.data.get("answer"):
            return
        self.console.print(Panel(escape(e.data["answer"] or ""), title=label, border_style="green"))

    def _on_finished(self, e: TraceEvent) -> None:
        r = e.data["record"]
        style = "green" if r["termination"].startswith("answered") else "red"
        self.console.print(
            f"[{style}]{r['termination']}[/] · {counted(r['tool_call_count'], 'tool call')} · "
            f"{r['turns']} turns · {r['final_token_count']} tokens · {r['elapsed_seconds']:.1f}s"
        )
        if not r["termination"].startswith("answered"):
            if r.get("error"):
                self.console.print(f"[red]reason:[/] {escape(r['error'])}")
            self.console.print(f"[dim]last output:[/] {escape(_short(r['prediction'], 300))}")


def summary_table(terminations: dict[str, int], elapsed: list[float], skipped: int) -> Table:
    table = Table(title="Batch summary", show_lines=False)
    table.add_column("termination")
    table.add_column("count", justify="right")
    for name, count in sorted(terminations.items(), key=lambda kv: -kv[1]):
        table.add_row(name, str(count))
    table.add_row("[dim]skipped (already done)[/]", str(skipped))
    if elapsed:
        mean = sum(elapsed) / len(elapsed)
        table.caption = f"{len(elapsed)} finished · mean {mean:.1f}s per question"
    return table

"""``drvenus reference``: the pinned official files (DR-Venus's prompts, the benchmarks'
graders) that ``--protocol dr-venus`` and ``--grader official`` read: where each one stands, and
fetching them ahead of time so later runs are offline."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from drvenus.cli.common import CheckedGroup, fail, known_errors, out

reference_app = typer.Typer(
    cls=CheckedGroup,
    help="Official texts from pinned sources: list them, pull them into the cache.",
    no_args_is_help=True,
)

NamesArgument = Annotated[
    list[str] | None,
    typer.Argument(help="Sources by folder name (DR-Venus, simple-evals, ...); default: all."),
]
_STYLE = {"ok": "green", "missing": "yellow", "mismatch": "bold red"}


def _table(states: list) -> Table:
    from drvenus.reference import SOURCES

    table = Table(show_edge=False, pad_edge=False)
    table.add_column("source", no_wrap=True)
    table.add_column("file", overflow="fold")
    table.add_column("state", no_wrap=True)
    table.add_column("sha256", no_wrap=True)
    for s in states:
        src = SOURCES.get(s.source)
        name = f"{s.source} @{src.commit[:7]}" if src else s.source
        state = f"[{_STYLE[s.state]}]{s.state}[/]"
        table.add_row(escape(name), escape(s.path), state, s.expected[:12])
    return table


@reference_app.command("list")
def reference_list(names: NamesArgument = None) -> None:
    """Every pinned file: found and matching its SHA-256 (ok), absent (missing), or another
    version (mismatch), in DRVENUS_REFERENCE_DIR when it is set, else in the cache."""
    from drvenus.reference import reference_store

    try:
        store = reference_store()
        states = store.states(names or None)
    except known_errors() as exc:
        raise fail(exc) from None
    where = (f"DRVENUS_REFERENCE_DIR={store.local_dir}" if store.local_dir is not None
             else f"cache {store.cache_dir}")
    out.print(f"[dim]reading from {escape(where)}[/]")
    out.print(_table(states))


@reference_app.command("pull")
def reference_pull(names: NamesArgument = None) -> None:
    """Download the pinned files over HTTPS into the cache (each checked against its SHA-256),
    so that later runs need no network; with DRVENUS_REFERENCE_DIR set, check the checkouts
    there instead."""
    from drvenus.reference import reference_store

    try:
        store = reference_store()
        states = store.pull(names or None)
    except known_errors() as exc:
        raise fail(exc) from None
    out.print(_table(states))
    out.print(f"[green]{len(states)} official files ready[/]")

"""``drvenus reference``: the pinned official files (DR-Venus's prompts, the benchmarks'
graders) that ``--protocol dr-venus`` and ``--grader official`` read: where each one stands, and
fetching them ahead of time so later runs are offline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from drvenus.cli.common import RUN_FAILED, CheckedGroup, CliError, fail, known_errors, out

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


class PullFailed(CliError):
    """A pinned file could not be downloaded (no network, the host down, an HTTP error): exit
    code 1, as a run whose model cannot be reached; another version stays bad input (2)."""

    exit_code = RUN_FAILED


def source_template(source: str) -> str:
    """The download template of ``--source``: a URL base where files lie as on
    raw.githubusercontent.com (``<base>/<owner>/<name>/<commit>/<path>``), or a whole template
    with ``{path}`` (and ``{repo}``, ``{commit}``)."""
    from urllib.parse import urlsplit

    scheme = urlsplit(source).scheme
    if scheme not in ("http", "https"):
        raise CliError(f"--source: {source!r} is not an http(s) URL")
    if "{path}" in source:
        return source
    return source.rstrip("/") + "/{repo}/{commit}/{path}"


@reference_app.command("pull")
def reference_pull(
    names: NamesArgument = None,
    folder: Annotated[Path | None, typer.Option(
        "--dir", help="Write into this folder, laid out as local checkouts (DIR/DR-Venus/...), "
                      "for DRVENUS_REFERENCE_DIR=DIR; default: where drvenus reads them "
                      "(DRVENUS_REFERENCE_DIR when set, else the cache).")] = None,
    source: Annotated[str | None, typer.Option(
        "--source", metavar="URL-BASE",
        help="Download from this base instead of GitHub (files at "
             "URL-BASE/<owner>/<name>/<commit>/<path>, as raw.githubusercontent.com serves "
             "them; or a template with {repo}, {commit}, {path}).")] = None,
) -> None:
    """Download the pinned files of each source at its pinned commit, check each against its
    SHA-256 and write them (a source whole or not at all), so that later runs, and the tests
    that compare with the official files, need no network. A file there of another version is
    refused, never overwritten. Exit codes: 0 every file ready, 1 a download failed, 2 another
    version or bad input."""
    from drvenus.reference import (
        ReferenceError,
        ReferenceStore,
        ReferenceUnreachable,
        reference_store,
    )

    try:
        base = reference_store()
        template = source_template(source) if source else base.url_template
        local = folder.expanduser().resolve() if folder is not None else base.local_dir
        store = ReferenceStore(cache_dir=base.cache_dir, local_dir=local,
                               url_template=template)
        chosen = [store.source(n).name for n in names or list(store.sources)]
    except known_errors() as exc:
        raise fail(exc) from None
    failed: list[tuple[str, ReferenceError]] = []
    for name in chosen:
        try:
            store.pull_source(name)
        except ReferenceError as exc:
            failed.append((name, exc))
        except known_errors() as exc:  # the folder cannot be written, ...
            raise fail(exc) from None
    states = store.states(chosen)
    out.print(_table(states))
    for name in chosen:
        if name not in dict(failed):
            src = store.source(name)
            out.print(f"{escape(src.short)}: {len(src.files)} files in "
                      f"{escape(str(store.root(name)))}")
    if failed:
        first = str(failed[0][1]).strip().splitlines()[0]
        if len(failed) > 1:
            first += f" (also not pulled: {', '.join(n for n, _ in failed[1:])})"
        network = all(isinstance(e, ReferenceUnreachable) for _, e in failed)
        raise fail(PullFailed(first) if network else CliError(first)) from None
    out.print(f"[green]{len(states)} official files ready[/]")
    if folder is not None and local != base.local_dir:
        out.print(f"drvenus reads them from there with DRVENUS_REFERENCE_DIR={escape(str(local))}")

"""``drvenus serve`` (web demo + /v1 + /mcp) and ``drvenus mcp`` (MCP over stdio).

Both take the model and tool options of ``drvenus ask``; ``--heavy N`` makes every research N
parallel runs and one answer, and a request may ask for up to ``--max-heavy`` runs. Bad input (a
public address without a token, a taken port, a missing extra, a bad model or corpus) is one
line on stderr and exit code 2.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from drvenus.cli.common import (
    CliError,
    HostOption,
    PortOption,
    err,
    fail,
    known_errors,
    notice,
    warn_short_token,
    with_options,
)
from drvenus.cli.options import AgentOptions
from drvenus.net.server import DEFAULT_HOST
from drvenus.serve.server import DEFAULT_MAX_RUNNING, DEFAULT_MAX_WAITING, DEFAULT_PORT, HEAVY_CAP

if TYPE_CHECKING:
    from drvenus.config import Settings
    from drvenus.serve.agents import AgentPool

RunsDirOption = Annotated[
    Path | None,
    typer.Option("--runs-dir", help="Where run traces are kept (default: <cache>/runs)."),
]
MaxRunsOption = Annotated[
    int, typer.Option("--max-runs", min=1, help="Research runs going on at once.")
]
MaxHeavyOption = Annotated[
    int | None,
    typer.Option("--max-heavy", min=1, max=64, show_default=False,
                 help=f"The most Heavy-mode runs one request may ask for (its 'heavy' field; "
                 f"default {HEAVY_CAP}, or --heavy when that is more)."),
]


def _pool(agent: AgentOptions, max_runs: int, max_heavy: int | None
          ) -> tuple[Settings, AgentPool]:
    """Settings and the agent pool, with the default model and tools built (fail fast)."""
    from drvenus.serve.agents import pool_from_settings
    from drvenus.stack import announce_protocol

    settings = agent.settings()
    heavy = settings.heavy or 1
    if max_heavy is not None and heavy > max_heavy:
        raise CliError(f"--heavy {heavy} is over --max-heavy {max_heavy}")
    pool = pool_from_settings(
        settings, system_prompt_file=agent.prompt_file, parallel=max_runs,
        heavy_cap=max(heavy, max_heavy or HEAVY_CAP), notify=notice,
    )
    pool.prebuild()
    problem = asyncio.run(pool.problem(timeout=10.0))
    if problem:  # serve anyway (the model server may come up later); the page says so too
        err.print(f"[yellow]warning:[/] {escape(problem)}")
    announce_protocol(settings, agent.prompt_file, notice)
    return settings, pool


def _runs_dir(settings: Settings, runs_dir: Path | None) -> Path:
    return runs_dir.expanduser() if runs_dir else settings.cache_root() / "runs"


@with_options("agent", AgentOptions)
def serve(
    host: HostOption = DEFAULT_HOST,
    port: PortOption = DEFAULT_PORT,
    token: Annotated[
        str | None,
        typer.Option(
            "--token", show_default=False,
            help="Token every route but /health needs (Bearer header; the page: open "
            "/?token=T once). Better from env DRVENUS_SERVE_TOKEN than on the command line.",
        ),
    ] = None,
    max_runs: MaxRunsOption = DEFAULT_MAX_RUNNING,
    max_waiting: Annotated[
        int, typer.Option("--max-waiting", min=0, help="Runs that may wait for a free slot.")
    ] = DEFAULT_MAX_WAITING,
    max_heavy: MaxHeavyOption = None,
    runs_dir: RunsDirOption = None,
    all_runs: Annotated[
        bool, typer.Option("--all-runs", help="List every run (the page's, /v1's and MCP's) to "
                           "every visitor of the page; by default a visitor sees their own.")
    ] = False,
    *,
    agent: AgentOptions,
) -> None:
    """Serve the research agent: web demo at /, OpenAI-compatible API at /v1, MCP at /mcp."""
    from drvenus.net.server import check_bind, require_serve_extra
    from drvenus.serve.app import create_app
    from drvenus.serve.mcp_server import require_mcp
    from drvenus.serve.runs import RunRegistry
    from drvenus.serve.server import serve_app

    try:
        if token is None:
            from drvenus.config import load_settings

            token = load_settings().serve_token_value()
        check_bind(host, token, what="the web app",
                   token_hint="set DRVENUS_SERVE_TOKEN (or pass --token)")
        require_serve_extra()
        require_mcp()
        settings, pool = _pool(agent, max_runs, max_heavy)
    except known_errors(ImportError) as exc:
        raise fail(exc) from None
    warn_short_token(token)
    registry = RunRegistry(
        pool, _runs_dir(settings, runs_dir), max_running=max_runs, max_waiting=max_waiting,
        notify=lambda line: err.print(escape(line), highlight=False),
    )
    app = create_app(registry, token=token, all_runs=all_runs)

    def ready(url: str) -> None:
        hint = f" (open {url}/?token=… once)" if token else ""
        err.print(f"serving on [bold]{escape(url)}[/]{hint}: web demo /, OpenAI API /v1, "
                  "MCP /mcp; Ctrl-C stops")

    try:
        serve_app(app, host, port, on_ready=ready)
    except known_errors(ImportError) as exc:
        raise fail(exc) from None
    except KeyboardInterrupt:
        pass


@with_options("agent", AgentOptions)
def mcp(
    max_runs: MaxRunsOption = 1,
    max_heavy: MaxHeavyOption = None,
    runs_dir: RunsDirOption = None,
    *,
    agent: AgentOptions,
) -> None:
    """Serve the MCP tools (deep_research, research_status, search, fetch, visit) over stdio."""
    from drvenus.serve.mcp_server import require_mcp, serve_stdio
    from drvenus.serve.runs import RunRegistry

    try:
        require_mcp()
        settings, pool = _pool(agent, max_runs, max_heavy)
    except known_errors(ImportError) as exc:
        raise fail(exc) from None
    registry = RunRegistry(pool, _runs_dir(settings, runs_dir), max_running=max_runs)

    async def go() -> None:
        try:
            await serve_stdio(registry)
        finally:
            await registry.aclose()
            await pool.aclose()

    try:
        asyncio.run(go())
    except KeyboardInterrupt:
        pass


__all__ = ["mcp", "serve"]

"""``drvenus tools``: serve the search and visit tools over HTTP (mounted by drvenus.cli).

Bad input (a public address without a token, a taken port, a bad corpus, the ``serve`` extra
missing) is one line on stderr and exit code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from drvenus.tools.server import (
    DEFAULT_CACHE_SIZE,
    DEFAULT_HOST,
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_PORT,
)

tools_app = typer.Typer(
    name="tools",
    help="Share the search and visit tools with other processes over HTTP.",
    no_args_is_help=True,
    add_completion=False,
)
err = Console(stderr=True, soft_wrap=True)

BAD_INPUT = 2
SHORT_TOKEN = 16

# The tool options of every command that runs tools (``ask``, ``run``, ``tools serve``), declared
# once; each maps to the Settings field of the same name.
CorpusOption = Annotated[
    Path | None,
    typer.Option("--corpus", help="Corpus JSONL/parquet (id,title,url,text). Default: built-in."),
]
SearchOption = Annotated[
    str | None,
    typer.Option(
        "--search",
        help="Search providers in fallback order: serper, searxng, local (default: local).",
    ),
]
VisitOption = Annotated[
    str | None,
    typer.Option(
        "--visit",
        help="Page readers in fallback order: jina, fetch, local (default: local with local "
        "search, else fetch).",
    ),
]
PrivateUrlsOption = Annotated[
    bool | None,
    typer.Option(
        "--allow-private-urls/--no-allow-private-urls",
        help="Let visit read loopback, private and link-local addresses (default: refused).",
    ),
]
TOOL_OPTIONS: dict[str, Any] = {
    "corpus": CorpusOption,
    "search": SearchOption,
    "visit": VisitOption,
    "allow_private_urls": PrivateUrlsOption,
}


def _fail(exc: BaseException | str) -> typer.Exit:
    text = str(exc).strip() or type(exc).__name__
    err.print(f"[bold red]error:[/] {escape(text.splitlines()[0])}")
    return typer.Exit(BAD_INPUT)


def _known_errors() -> tuple[type[BaseException], ...]:
    from pydantic import ValidationError

    from drvenus.corpus import CorpusError

    return (ValueError, OSError, ImportError, CorpusError, ValidationError)


@tools_app.command()
def serve(
    host: Annotated[
        str, typer.Option("--host", help="Address to bind; any but loopback needs a token.")
    ] = DEFAULT_HOST,
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="TCP port.")] = DEFAULT_PORT,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            help="Bearer token clients must send (better: env DRVENUS_TOOLS_TOKEN, not shown "
            "in the process list).",
            show_default=False,
        ),
    ] = None,
    corpus: CorpusOption = None,
    search: SearchOption = None,
    visit: VisitOption = None,
    allow_private_urls: PrivateUrlsOption = None,
    max_concurrency: Annotated[
        int, typer.Option("--max-concurrency", min=1, help="Tool calls running at once.")
    ] = DEFAULT_MAX_CONCURRENCY,
    cache_size: Annotated[
        int, typer.Option("--cache-size", min=0, help="Responses kept in memory (0: none).")
    ] = DEFAULT_CACHE_SIZE,
) -> None:
    """Serve search and visit at http://HOST:PORT (POST /search, /visit; GET /health, /metrics)."""
    from drvenus.tools.metrics import Metrics
    from drvenus.tools.server import check_bind, require_serve_extra
    from drvenus.tools.server import serve as run_server

    try:
        from drvenus.app import build_toolbox
        from drvenus.config import load_settings

        settings = load_settings(
            corpus=corpus, search=search, visit=visit, allow_private_urls=allow_private_urls,
            tools_token=token,
        )
        secret = settings.tools_token_value()
        check_bind(host, secret)  # before the index is opened: fail fast
        require_serve_extra()
        # the server runs the tools itself, whatever DRVENUS_TOOLS_URL says (no proxy loops)
        settings = settings.model_copy(update={"tools_url": None})
        metrics = Metrics()
        toolbox = build_toolbox(settings, progress=True, metrics=metrics)
    except _known_errors() as exc:
        raise _fail(exc) from None
    if secret is not None and len(secret) < SHORT_TOKEN:
        err.print(f"[yellow]warning:[/] the token is short (< {SHORT_TOKEN} characters)")

    def ready(url: str) -> None:
        auth = "token required" if secret else "no token"
        err.print(f"serving {', '.join(toolbox.names)} on [bold]{url}[/] ({auth}); Ctrl-C stops")

    try:
        run_server(
            toolbox, host, port, secret, on_ready=ready, metrics=metrics,
            max_concurrency=max_concurrency, cache_size=cache_size,
        )
    except _known_errors() as exc:
        raise _fail(exc) from None
    except KeyboardInterrupt:
        pass


__all__ = ["tools_app"]

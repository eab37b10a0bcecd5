"""``drvenus tools serve``: the search and visit tools over HTTP, for other processes.

Bad input (a public address without a token, a taken port, a bad corpus or option, the ``serve``
extra missing) is one line on stderr and exit code 2.
"""

from __future__ import annotations

from typing import Annotated

import typer

from drvenus.cli.common import (
    CheckedGroup,
    HostOption,
    PortOption,
    err,
    fail,
    known_errors,
    warn_short_token,
    with_options,
)
from drvenus.cli.options import ToolOptions
from drvenus.net.server import DEFAULT_HOST
from drvenus.tools.server import (
    DEFAULT_CACHE_SIZE,
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_MAX_QUEUE,
    DEFAULT_PORT,
)

tools_app = typer.Typer(
    cls=CheckedGroup,
    name="tools",
    help="Share the search and visit tools with other processes over HTTP.",
    no_args_is_help=True,
    add_completion=False,
)


@tools_app.command()
@with_options("tools", ToolOptions)
def serve(
    host: HostOption = DEFAULT_HOST,
    port: PortOption = DEFAULT_PORT,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            help="Bearer token clients must send (better: env DRVENUS_TOOLS_TOKEN, not shown "
            "in the process list).",
            show_default=False,
        ),
    ] = None,
    *,
    tools: ToolOptions,
    max_concurrency: Annotated[
        int, typer.Option("--max-concurrency", min=1, help="Tool calls running at once.")
    ] = DEFAULT_MAX_CONCURRENCY,
    max_queue: Annotated[
        int, typer.Option("--max-queue", min=0, help="Tool calls waiting for a slot; beyond "
                          "that, 503 with Retry-After.")
    ] = DEFAULT_MAX_QUEUE,
    cache_size: Annotated[
        int, typer.Option("--cache-size", min=0, help="Responses kept in memory (0: none).")
    ] = DEFAULT_CACHE_SIZE,
) -> None:
    """Serve search and visit at http://HOST:PORT (POST /search, /visit; GET /health, /metrics)."""
    from drvenus.net.server import check_bind, require_serve_extra
    from drvenus.tools.metrics import Metrics
    from drvenus.tools.server import serve as run_server

    try:
        from drvenus.config import load_settings
        from drvenus.stack import build_toolbox

        settings = load_settings(**tools.setting_values(), tools_token=token)
        secret = settings.tools_token_value()
        check_bind(host, secret)  # before the index is opened: fail fast
        require_serve_extra()
        # the server runs the tools itself, whatever DRVENUS_TOOLS_URL says (no proxy loops)
        settings = settings.model_copy(update={"tools_url": None})
        metrics = Metrics()
        toolbox = build_toolbox(settings, progress=True, metrics=metrics)
    except known_errors(ImportError) as exc:
        raise fail(exc) from None
    warn_short_token(secret)

    def ready(url: str) -> None:
        auth = "token required" if secret else "no token"
        err.print(f"serving {', '.join(toolbox.names)} on [bold]{url}[/] ({auth}); Ctrl-C stops")

    try:
        run_server(
            toolbox, host, port, secret, on_ready=ready, metrics=metrics,
            max_concurrency=max_concurrency, max_queue=max_queue, cache_size=cache_size,
        )
    except known_errors(ImportError) as exc:
        raise fail(exc) from None
    except KeyboardInterrupt:
        pass


__all__ = ["tools_app"]

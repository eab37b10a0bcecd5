"""The ``drvenus`` command. Thin: it parses flags and calls the modules.

One module per command group (``agent``: ask, run; ``index``; ``models``; ``reference``;
``data``; ``eval``; ``serve``: serve, mcp; ``tools``; ``train``: sft, rl), all on
:mod:`drvenus.cli.common` (the consoles, the one error boundary, the options derived from
config fields). Heavy imports (torch, the web server, the trainer) happen inside the commands,
so every command starts on the default install.
"""

from __future__ import annotations

from typing import Annotated

import typer

from drvenus import __version__, signals
from drvenus.cli.agent import ASK_EXAMPLES, ask, run
from drvenus.cli.common import CheckedGroup, out, setup_logging
from drvenus.cli.data import data_app
from drvenus.cli.eval import eval_app
from drvenus.cli.index import index_app
from drvenus.cli.models import models_app
from drvenus.cli.reference import reference_app
from drvenus.cli.serve import mcp, serve
from drvenus.cli.tools import tools_app
from drvenus.cli.train import rl, sft
from drvenus.text import one_line

app = typer.Typer(
    cls=CheckedGroup,
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
    setup_logging(verbose)


app.command(epilog=ASK_EXAMPLES)(ask)
app.command()(run)
app.add_typer(index_app, name="index")
app.add_typer(models_app, name="models")
app.add_typer(reference_app, name="reference")
app.add_typer(tools_app, name="tools")
app.add_typer(data_app, name="data")
app.add_typer(eval_app, name="eval")
app.command("sft")(sft)
app.command("rl")(rl)
app.command("serve")(serve)
app.command("mcp")(mcp)


def _is_click_error(exc: BaseException, name: str) -> bool:
    """Whether ``exc`` is click's ``name`` exception (typer ships click itself or vendors a copy,
    depending on its version, so the class is matched by name)."""
    return any(cls.__name__ == name for cls in type(exc).__mro__)


def main() -> None:
    """The console script: usage errors (a bad option value, a missing argument) print one
    line and exit 2, instead of click's multi-line box. SIGTERM is handled like Ctrl-C
    (:mod:`drvenus.signals`), its exit code 143."""
    signals.install()
    try:
        code = app(prog_name="drvenus", standalone_mode=False)
    except typer.Abort:
        if signals.terminated():
            typer.echo("drvenus: terminated (SIGTERM)", err=True)
            raise SystemExit(signals.TERMINATED) from None
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
    raise SystemExit(signals.exit_code(code) if isinstance(code, int) else 0)


__all__ = ["app", "main"]

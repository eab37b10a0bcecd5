"""What every ``drvenus`` command shares: the consoles, the one error boundary, notices, logging,
and the one way config fields become command-line options.

Errors: a command catches :func:`known_errors` around its work and raises :func:`fail`, which
prints ONE red ``error:`` line on stderr and exits 2. A pydantic ``ValidationError`` is named by
its flag (``--search: unknown provider bogus; choose from serper, searxng, local``), whichever
config class raised it.

Options: :func:`with_options` turns the fields of a config class (pydantic model, pydantic
dataclass or dataclass; help from ``Field(description=...)`` or ``metadata["help"]``, overrides
from a :class:`drvenus.flags.Cli` marker) into typer options of a command, and hands the command
their values as one argument.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import math
import operator
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from typer.core import TyperGroup

from drvenus.flags import KEEP, Cli, flag
from drvenus.net.secrets import RedactingFilter

if TYPE_CHECKING:
    from pydantic import ValidationError

out = Console()
err = Console(stderr=True, soft_wrap=True)

BAD_INPUT = 2  # exit code of bad input / a usage error
RUN_FAILED = 1  # exit code of a run that failed (the model or the tools could not be reached)
INTERRUPTED = 130  # exit code after Ctrl-C


# ---------------------------------------------------------------- the error boundary
class CliError(Exception):
    """A user-facing failure: printed as one line, exit code 2 (``exit_code``)."""

    exit_code = BAD_INPUT


class ModelUnreachable(CliError):
    """Nothing answers at the model server's address: the run could not be made, exit code 1
    (as a run that ends as ``llm_error``), not bad input."""

    exit_code = RUN_FAILED


def known_errors(*extra: type[BaseException]) -> tuple[type[BaseException], ...]:
    """The failures a command reports as one line (plus ``extra``); anything else is a bug and
    keeps its traceback. (pydantic's ``ValidationError`` is a ``ValueError``.)"""
    from drvenus.corpus import CorpusError
    from drvenus.llm.base import LLMError

    return (LLMError, CliError, CorpusError, ValueError, OSError, *extra)


def fail(exc: BaseException | str) -> typer.Exit:
    """Print ``exc`` as one ``error:`` line on stderr; the ``typer.Exit`` to raise (2, or the
    error's own ``exit_code``)."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        text = describe_validation_error(exc, _FLAGS.get(exc.title, {}))
    else:
        text = str(exc).strip() or type(exc).__name__
    err.print(f"[bold red]error:[/] {escape(text.strip().splitlines()[0])}")
    return typer.Exit(exc.exit_code if isinstance(exc, CliError) else BAD_INPUT)


def describe_validation_error(exc: ValidationError, names: Mapping[str, str]) -> str:
    """The first problem of ``exc`` as one line, the field shown by ``names[field]`` (its flag;
    default ``--<field-name>``). Choice fields name their choices (pydantic's message or the
    validator's)."""
    from pydantic import BaseModel

    if not exc.errors():
        return str(exc)
    first = exc.errors()[0]
    msg = first["msg"].removeprefix("Value error, ")
    loc = [str(p) for p in first["loc"]]
    if not loc:
        return msg
    where = names.get(loc[0]) or flag(loc[0])
    got = first.get("input")
    plain = first["type"] != "value_error" and not isinstance(got, dict | BaseModel | None)
    shown = f" (got {got!r})" if plain else ""
    return f"{where}: {msg}{shown}"


async def require_model_server(model: object, timeout: float = 5.0) -> None:
    """CliError at once when nothing answers at a model server's address (instead of a run's
    retries); any other trouble (a slow server, no ``/models``) is left to the run to report."""
    from drvenus.llm.base import LLMError

    check = getattr(model, "check", None)
    if check is None:  # a model in this process
        return
    try:
        await check(timeout)
    except LLMError as exc:
        if exc.unreachable:
            raise ModelUnreachable(str(exc)) from None


def notice(message: str) -> None:
    """One-line progress notes from setup (e.g. fetching the embedded model)."""
    err.print(f"[dim]{escape(message)}[/]")


# ---------------------------------------------------------------- numbers on the command line
INT64 = 2**63  # an integer option fits in a signed 64-bit integer (torch, numpy, SQLite, C)


def check_number(value: Any) -> str | None:
    """Why ``value`` is not a usable number on the command line (None: it is): nan, an
    infinity (``1e400`` reads as one) or an integer beyond 64 bits."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number"
    if isinstance(value, int) and not isinstance(value, bool) and not -INT64 <= value < INT64:
        return f"{value} is out of range (a 64-bit integer)"
    return None


def _holds_numbers(tp: Any) -> bool:
    """``int`` / ``float``, alone or inside an optional, a list or a tuple."""
    if tp in (int, float):
        return True
    return any(_holds_numbers(a) for a in get_args(tp) if a is not Ellipsis)


def _is_numeric(param: Any) -> bool:
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is None or getattr(param, "is_flag", False):
        return False
    return _holds_numbers(descriptor.annotation)


def _guard_numbers(command: Any) -> None:
    """Every numeric option of ``command`` (and of its subcommands) refuses nan, infinities
    and integers beyond 64 bits while the command line is parsed, before the command runs."""
    for sub in getattr(command, "commands", {}).values():
        _guard_numbers(sub)
    for param in command.params:
        if not _is_numeric(param) or getattr(param, "_numbers_guarded", False):
            continue
        then = param.callback

        def checked(ctx: Any, p: Any, value: Any, then: Any = then) -> Any:
            for v in value if isinstance(value, list | tuple) else (value,):
                problem = check_number(v)
                if problem:
                    raise typer.BadParameter(problem, ctx=ctx, param=p)
            return then(ctx, p, value) if then is not None else value

        param.callback = checked
        param._numbers_guarded = True


class CheckedGroup(TyperGroup):
    """The command group of every ``drvenus`` app: numeric options checked by
    :func:`check_number` (a usage error: one line, exit 2)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        _guard_numbers(self)


# ---------------------------------------------------------------- the servers' options
PortOption = Annotated[int, typer.Option("--port", min=0, max=65535, help="TCP port.")]
HostOption = Annotated[
    str, typer.Option("--host", help="Address to bind; any but loopback needs a token.")
]
SHORT_TOKEN = 16  # a server's token shorter than this gets a warning


def warn_short_token(token: str | None) -> None:
    """A server's start-up warning about a short token (if it is)."""
    if token is not None and len(token) < SHORT_TOKEN:
        err.print(f"[yellow]warning:[/] the token is short (< {SHORT_TOKEN} characters)")


def setup_logging(verbose: int) -> None:
    """Logs on stderr: warnings, ``-v`` info, ``-vv`` debug; known secrets redacted."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    handler = RichHandler(console=err, show_path=False)
    handler.addFilter(RedactingFilter())  # httpx logs request URLs; servers echo keys
    logging.basicConfig(level=level, format="%(message)s", handlers=[handler])


def log_progress() -> None:
    """A long command (training) tells what it does: drvenus' info logs on."""
    logging.getLogger("drvenus").setLevel(logging.INFO)


# ---------------------------------------------------------------- options from config fields
# class name (pydantic's ValidationError.title) -> field -> its flag, for fail()
_FLAGS: dict[str, dict[str, str]] = {}


def name_flags(title: str, flags: Mapping[str, str]) -> None:
    """Let :func:`fail` name ``title``'s fields by these flags (e.g. the Settings field a
    command-line option sets)."""
    _FLAGS.setdefault(title, {}).update(flags)


@dataclass(frozen=True)
class _Field:
    name: str
    annotation: Any
    default: Any  # inspect.Parameter.empty when required
    help: str | None
    spec: Cli


def _class_fields(cls: type) -> list[_Field]:
    """The fields of a pydantic model, pydantic dataclass or dataclass, in declaration order."""
    infos = getattr(cls, "model_fields", None) or getattr(cls, "__pydantic_fields__", None)
    if infos is not None:
        return [
            _Field(name, info.annotation,
                   inspect.Parameter.empty if info.is_required()
                   else info.get_default(call_default_factory=True),
                   info.description,
                   next((m for m in info.metadata if isinstance(m, Cli)), Cli()))
            for name, info in infos.items()
        ]
    hints = typing.get_type_hints(cls, include_extras=True)
    found = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        extras = hint.__metadata__ if get_origin(hint) is Annotated else ()
        tp = get_args(hint)[0] if extras else hint
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = inspect.Parameter.empty
        found.append(_Field(f.name, tp, default, f.metadata.get("help"),
                            next((m for m in extras if isinstance(m, Cli)), Cli())))
    return found


def _cli_type(tp: Any) -> Any:
    """The typer type of a field type: a Literal becomes its values' type (the config class
    checks the value and names the choices), a variadic tuple a list; unions member by member."""
    origin = get_origin(tp)
    if origin is Literal:
        return type(get_args(tp)[0])
    if origin in (Union, types.UnionType):
        return reduce(operator.or_, [_cli_type(a) for a in get_args(tp)])
    if origin is tuple:
        return list[get_args(tp)[0]]
    return tp


def _nested_class(tp: Any) -> type:
    return next(a for a in (get_args(tp) or (tp,)) if a is not type(None))


@dataclass(frozen=True)
class _Option:
    """One command-line option, derived from one field of a config class."""

    path: tuple[str, ...]  # the nested fields holding the field, then its name
    parameter: inspect.Parameter


def field_options(cls: type, *, layered: bool = False, prefix: str = "",
                  path: tuple[str, ...] = ()) -> list[_Option]:
    """A typer option per field of ``cls`` (nested config objects expanded), in field order.

    ``layered``: every option's default is None ("not given": the value comes from a config
    file, the environment or the field's default, which the help then shows); else the field's
    default is the option's. A class's ``HELP_PANELS`` (field name -> title) groups its options
    in ``--help``.
    """
    options: list[_Option] = []
    flags: dict[str, str] = {}
    panels: Mapping[str, str] = getattr(cls, "HELP_PANELS", {})  # --help groups, by field
    for f in _class_fields(cls):
        if f.spec.hidden:
            continue
        if f.spec.expand is not None:
            options += field_options(_nested_class(f.annotation), layered=layered,
                                     prefix=f.spec.expand, path=(*path, f.name))
            continue
        pname = prefix + f.name
        flags[f.name] = (f.spec.flags or (flag(pname),))[0]
        tp = _cli_type(f.annotation) if f.spec.type is KEEP else f.spec.type
        help = f.help or ""
        shown: Any = True
        if layered:
            default, tp, shown = None, tp | None, False
            if f.default not in (None, "", inspect.Parameter.empty):
                help += f" [default: {f.default}]"
        else:
            default = f.default if f.spec.default is KEEP else f.spec.default
            if isinstance(f.default, tuple):
                shown = ",".join(f.default)
        # no explicit flags: typer's own name, which gives a bool its --x/--no-x pair; the help
        # is plain text, not rich markup ("[default: 8]", "drvenus[train]")
        option = typer.Option(*f.spec.flags, help=escape(help), show_default=shown,
                              rich_help_panel=panels.get(f.name))
        parameter = inspect.Parameter(pname, inspect.Parameter.KEYWORD_ONLY,
                                      annotation=Annotated[tp, option], default=default)
        options.append(_Option((*path, f.name), parameter))
    name_flags(cls.__name__, flags)
    return options


def nest(options: list[_Option], values: Mapping[str, Any]) -> dict[str, Any]:
    """The values of ``options`` (by parameter name) as nested dicts by field path."""
    nested: dict[str, Any] = {}
    for o in options:
        *groups, name = o.path
        target = nested
        for group in groups:
            target = target.setdefault(group, {})
        target[name] = values[o.parameter.name]
    return nested


def build(cls: type, values: Mapping[str, Any]) -> Any:
    """``cls`` from nested values (nested config objects built from their dicts)."""
    kinds = {f.name: f for f in _class_fields(cls)}
    return cls(**{
        name: build(_nested_class(kinds[name].annotation), value)
        if isinstance(value, dict) and kinds[name].spec.expand is not None else value
        for name, value in values.items()
    })


def with_options(param: str, cls: type, *, layered: bool = False,
                 into: Callable[[dict[str, Any]], Any] | None = None
                 ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the options of ``cls``'s fields in place of its parameter ``param``.

    The command receives ``param=into(values)``: ``values`` nested dicts by field path (see
    :func:`nest`), ``into`` by default :func:`build` of ``cls``. See :func:`field_options` for
    ``layered``.
    """
    options = field_options(cls, layered=layered)
    make = into or functools.partial(build, cls)

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command)
        hints = typing.get_type_hints(command, include_extras=True)
        params: list[inspect.Parameter] = []
        for name, p in signature.parameters.items():
            if name == param:
                params += [o.parameter for o in options]
            else:
                params.append(p.replace(annotation=hints.get(name, p.annotation)))
        own = {o.parameter.name for o in options}
        if param not in signature.parameters or own & set(signature.parameters):
            clash = sorted(own & set(signature.parameters))
            raise TypeError(f"{command.__name__}: no parameter {param!r} or a clash: {clash}")

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            values = {name: kwargs.pop(name) for name in own}
            return command(**kwargs, **{param: make(nest(options, values))})

        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        del wrapper.__wrapped__  # typer must read the new signature, not the original's
        return wrapper

    return decorate


__all__ = ["BAD_INPUT", "INT64", "INTERRUPTED", "CheckedGroup", "CliError", "HostOption",
           "PortOption", "build", "check_number", "describe_validation_error", "err", "fail",
           "field_options", "known_errors", "log_progress", "name_flags", "nest", "notice", "out",
           "require_model_server", "setup_logging", "warn_short_token", "with_options"]

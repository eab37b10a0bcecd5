"""How a config field appears on the command line.

A command's options are declared once, as the fields of a config class (a pydantic model, a
pydantic dataclass or a plain dataclass): type, default, constraints and help text (pydantic's
``Field(description=...)``, or ``metadata={"help": ...}`` on a dataclass field, see
:func:`option`). The CLI (:mod:`drvenus.cli.common`) derives each typer option from its field; a
:class:`Cli` marker in the field's ``Annotated`` metadata only says where the command line
differs from the default derivation (flag ``--<prefix><field-name>``, the field's type and
default).

This module is a leaf (no imports from the package) so that every config class can use it
without importing the CLI.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

KEEP = object()
"""Sentinel: use the field's own type or default on the command line."""


@dataclass(frozen=True)
class Cli:
    """Command-line overrides of one option field.

    ``flags``: the option names (default ``--<prefix><field-name>`` with ``_`` as ``-``).
    ``type``/``default``: the command-line type and default when they differ from the field's
    (e.g. a value the command resolves later from the environment).
    ``expand``: the field holds a nested options object; its fields become options of their own,
    named with this prefix. ``hidden``: not on the command line.
    """

    flags: tuple[str, ...] = ()
    type: Any = KEEP
    default: Any = KEEP
    expand: str | None = None
    hidden: bool = False


def flag(name: str) -> str:
    """The command-line flag of a field: ``--`` and its name with ``-`` for ``_``."""
    return "--" + name.replace("_", "-")


def option(help: str, default: Any = None) -> Any:
    """A dataclass field with its command-line help text."""
    return dataclasses.field(default=default, metadata={"help": help})

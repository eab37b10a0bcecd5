"""How an option field appears on the ``drvenus data clean`` command line.

The options of a run are declared once, as fields of :class:`drvenus.data.options.CleanOptions`
(and of the nested :class:`~drvenus.data.resample.ResamplePolicy` and
:class:`~drvenus.data.judge.JudgeConfig`): type, default, constraints and help text
(``Field(description=...)``). ``drvenus.data.cli`` derives each typer option from its field; a
:class:`Cli` marker in the field's ``Annotated`` metadata only says where the command line
differs from the default derivation (flag ``--<prefix><field-name>``, the field's type and
default).

This module is a leaf (no imports from the package) so that every options class can use it.
"""

from __future__ import annotations

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

"""Run settings as dataclasses: one field per command-line option, YAML files with the same keys.

Shared by ``drvenus sft`` and ``drvenus rl``: a config class declares its fields with
:func:`opt` (help text in the metadata); :func:`load` reads a YAML file, applies command-line
overrides (None = not given) and checks every value against its type hint. The command line
derives one option per field (``--<field-name>``, help from the field's metadata) in
:mod:`drvenus.cli.common`.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar

from drvenus.flags import flag

T = TypeVar("T")


class ConfigError(ValueError):
    """An invalid setting; the message is one line naming the option."""


def opt(help: str, default: Any = None, **kw: Any) -> Any:
    """A config field with its help text."""
    return dataclasses.field(default=default, metadata={"help": help, **kw})


def field_help(cls: type) -> dict[str, str]:
    """Help text of each field of ``cls``."""
    return {f.name: f.metadata["help"] for f in dataclasses.fields(cls)}


def one_line_reason(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


def check_types(config: Any, error: type[ConfigError] = ConfigError) -> None:
    """Raise ``error`` for the first field whose value does not match its type hint."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        _check_type(f.name, getattr(config, f.name), hints[f.name], error)


def _check_type(name: str, value: Any, tp: Any, error: type[ConfigError]) -> None:
    args = typing.get_args(tp)
    if typing.get_origin(tp) is Literal:
        if value not in args:
            raise error(f"{flag(name)} {value!r}: choose one of {', '.join(map(str, args))}")
        return
    allowed = tuple(a for a in (args or (tp,)))
    if value is None and type(None) in allowed:
        return
    if float in allowed and isinstance(value, int) and not isinstance(value, bool):
        return
    base = tuple(a for a in allowed if a is not type(None))
    if isinstance(value, bool) and bool not in base:
        raise error(f"{flag(name)}: expected {base[0].__name__}, got {value!r}")
    if not isinstance(value, base):
        raise error(f"{flag(name)}: expected {base[0].__name__}, got {value!r}")


def read_values(cls: type, path: str | Path | None, overrides: dict[str, Any],
                error: type[ConfigError] = ConfigError) -> dict[str, Any]:
    """The YAML file's values with ``overrides`` on top (None values ignored); unknown keys
    raise ``error``."""
    import yaml

    values: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise error(f"{path}: not valid YAML ({one_line_reason(exc)})") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise error(f"{path}: expected a mapping of option names to values")
        values.update(loaded or {})
    values.update({k: v for k, v in overrides.items() if v is not None})
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise error(f"unknown config key(s): {', '.join(unknown)}")
    return values


def dump(config: Any, path: Path) -> Path:
    """Write a config dataclass as YAML (keys = field names); returns ``path``."""
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dataclasses.asdict(config), sort_keys=False),
                    encoding="utf-8")
    return path


__all__ = ["ConfigError", "check_types", "dump", "field_help", "flag", "one_line_reason", "opt",
           "read_values"]

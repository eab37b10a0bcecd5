"""Run settings as dataclasses: one field per command-line option, YAML files with the same keys.

Shared by ``drvenus sft`` and ``drvenus rl``: a config class declares its fields with
:func:`opt` (help text in the metadata); :func:`load` reads a YAML file, applies command-line
overrides (None = not given) and checks every value against its type hint. The command line
derives one option per field (``--<field-name>``, help from the field's metadata) in
:mod:`drvenus.cli.common`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar

from drvenus.flags import flag
from drvenus.records import MAX_CONFIG_BYTES, RecordsError, read_bounded

T = TypeVar("T")


class ConfigError(ValueError):
    """An invalid setting; the message is one line naming the option."""


def opt(help: str, default: Any = None, **kw: Any) -> Any:
    """A config field with its help text; ``ge`` / ``gt`` / ``le`` / ``lt`` bound its value
    (checked by :func:`check_types`, None exempt)."""
    return dataclasses.field(default=default, metadata={"help": help, **kw})


def field_help(cls: type) -> dict[str, str]:
    """Help text of each field of ``cls``."""
    return {f.name: f.metadata["help"] for f in dataclasses.fields(cls)}


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def is_hub_id(value: str) -> bool:
    """``org/name`` as the Hugging Face hub spells a model, and not a path on this machine:
    one slash, no file suffix of a model file, no leading ``.``/``~``/``/``, and a first part
    that is not a local folder (``runs/x`` with a ``runs`` folder here is a local path)."""
    if not _HUB_ID.fullmatch(value) or value.endswith((".gguf", ".safetensors", ".bin")):
        return False
    return not Path(value.split("/", 1)[0]).is_dir()


def check_paths(config: Any, names: tuple[str, ...], error: type[ConfigError] = ConfigError,
                *, hub: tuple[str, ...] = (), ask_hub: bool = True) -> None:
    """Every path option in ``names`` that is set names an existing file or folder (those in
    ``hub`` may also be a hub model id: :func:`check_hub_model` unless not ``ask_hub``, as for
    a launch plan run elsewhere); the ``output`` folder can be created and written."""
    for name in names:
        value = getattr(config, name, None)
        if not value or Path(value).expanduser().exists():
            continue
        if name in hub and is_hub_id(str(value)):
            if ask_hub:
                check_hub_model(name, str(value), error)
        else:
            raise error(f"{flag(name)} {value}: no such file or folder")
    output = getattr(config, "output", None)
    if output:
        parent = Path(output).expanduser().absolute()
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise error(f"{flag('output')} {output}: cannot write there ({parent} is not a "
                        "writable folder)")


HUB_CHECK_TIMEOUT = 5.0  # seconds the hub may take to say whether a model exists


def check_hub_model(name: str, repo: str, error: type[ConfigError] = ConfigError) -> None:
    """``repo`` (``org/name``, not a folder here) is a model of the Hugging Face cache, or one
    the hub knows (asked once, briefly): else one line now, not the hub client's retries when
    the model is loaded (``runs/nosuch``, a folder that is not there, looks just like a hub
    id)."""
    try:
        from huggingface_hub import HfApi, constants, try_to_load_from_cache
    except ImportError:  # no train extra: the trainer says what to install
        return
    if isinstance(try_to_load_from_cache(repo, "config.json"), str):
        return
    where = f"{flag(name)} {repo}: no such folder here"
    if constants.HF_HUB_OFFLINE:
        raise error(f"{where}, nor in the Hugging Face cache (HF_HUB_OFFLINE is set)")
    try:
        HfApi().model_info(repo, timeout=HUB_CHECK_TIMEOUT)
    except Exception as exc:  # any failure: the model could not be loaded either
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status in (401, 404):
            raise error(f"{where}, nor a model on the Hugging Face hub") from None
        raise error(f"{where}, and the Hugging Face hub could not say whether it has it "
                    f"({one_line_reason(exc)})") from None


def one_line_reason(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


_INT64 = 2**63
_BOUNDS = {"ge": ("at least", lambda v, b: v >= b), "gt": ("greater than", lambda v, b: v > b),
           "le": ("at most", lambda v, b: v <= b), "lt": ("less than", lambda v, b: v < b)}


def check_types(config: Any, error: type[ConfigError] = ConfigError) -> None:
    """Raise ``error`` for the first field whose value does not match its type hint, is not a
    finite number (nan, inf: from a flag or a YAML ``.nan``), is an integer beyond 64 bits, or
    is out of the bounds its field declares (:func:`opt`)."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        _check_type(f.name, value, hints[f.name], error)
        if isinstance(value, float) and not math.isfinite(value):
            raise error(f"{flag(f.name)} {value}: not a finite number")
        if isinstance(value, int) and not isinstance(value, bool) and (
                not -_INT64 <= value < _INT64):
            raise error(f"{flag(f.name)} {value}: out of range (a 64-bit integer)")
        if value is None or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        for key, (words, ok) in _BOUNDS.items():
            bound = f.metadata.get(key)
            if bound is not None and not ok(value, bound):
                raise error(f"{flag(f.name)} {value}: must be {words} {bound}")


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
            raw = read_bounded(Path(path), MAX_CONFIG_BYTES)
            loaded = yaml.safe_load(raw.decode("utf-8"))
        except RecordsError as exc:
            raise error(str(exc)) from None
        except UnicodeDecodeError:
            raise error(f"{path}: not UTF-8 text") from None
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


__all__ = ["ConfigError", "check_hub_model", "check_types", "dump", "field_help", "flag",
           "one_line_reason", "opt", "read_values"]

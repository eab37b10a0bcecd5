"""What ``drvenus sft`` and ``drvenus rl`` hand to a launcher, and the verl pieces they share.

:class:`LaunchPlan` is the one description of a launch both trainers' ``--dry-run`` print (the
command, the files written for it); :data:`VERL_VERSION` the verl release both verl launches are
written for (their key names are read from its tagged source); :func:`hydra_value` /
:func:`hydra_override` format the Hydra command-line overrides verl takes. No torch, no verl.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VERL_VERSION = "0.6.1"


def hydra_value(value: Any) -> str:
    """A value as a Hydra override writes it: ``null``, ``true``/``false``, ``['a','b']``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(f"'{v}'" for v in value) + "]"
    return str(value)


def hydra_override(key: str, value: Any) -> str:
    """``key=value`` (a leading ``+`` in ``key`` adds a key verl's config lacks)."""
    return f"{key}={hydra_value(value)}"


@dataclass
class LaunchPlan:
    """What a ``--dry-run`` shows: the command to run (on each machine), the files it reads.

    ``config_file``: the resolved drvenus config (SFT); ``accelerate_file`` /
    ``accelerate_config``: the ``accelerate launch`` config (SFT on accelerate);
    ``parallelism``: the ``ParallelismConfig`` settings the training process builds (SFT
    sequence parallelism); ``engine``: what runs the training (accelerate | verl); ``files``:
    other files written for the run (verl: data, command script, agent-loop config);
    ``folder``: where they were written; ``wrap``: :meth:`shell` puts one argument per line
    (the long verl RL command)."""

    command: list[str]
    config_file: Path | None = None
    accelerate_file: Path | None = None
    accelerate_config: dict[str, Any] | None = None
    parallelism: dict[str, Any] | None = None
    engine: str = "accelerate"
    files: list[Path] = field(default_factory=list)
    folder: Path | None = None
    wrap: bool = False

    def shell(self) -> str:
        """The command as a shell line."""
        if self.wrap:
            return " \\\n    ".join(shlex.quote(c) for c in self.command)
        return shlex.join(self.command)

    def overrides(self) -> dict[str, str]:
        """The command's ``key=value`` arguments (Hydra overrides; a leading ``+`` dropped)."""
        return dict(c.lstrip("+").split("=", 1) for c in self.command if "=" in c)


__all__ = ["VERL_VERSION", "LaunchPlan", "hydra_override", "hydra_value"]

"""The protocol profiles' names and what every profile does by default (drvenus's own words).

A *profile* is whose words and habits the agent, its tools and the RL environment use: the
system prompt, the loop's notices, the visit failure frame, the agent's and the page
extractor's sampling, the RL environment's texts and the outcome judge. :class:`Profile` is
drvenus's own (``drvenus``); the registry of every profile, looked up by name, is
:mod:`drvenus.reference.profiles` (one of them reproduces DR-Venus's pinned files). Only the
names live here, so that :mod:`drvenus.config` can declare the setting without loading a
reference.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from drvenus.protocol.parse import DRVENUS_READER, TurnReader
from drvenus.protocol.render import DRVENUS_TEXTS, ProtocolTexts, render_search

#: the built-in profiles' names, the default first; registering a profile adds its own
#: (:func:`protocol_names`: every ``--protocol`` / DRVENUS_PROTOCOL value)
PROTOCOLS: tuple[str, ...] = ("drvenus", "dr-venus")
DEFAULT_PROTOCOL = PROTOCOLS[0]
#: a profile's name (checked against the known ones where settings are read: check_protocol)
ProtocolName = str
_NAMES: list[str] = list(PROTOCOLS)


def add_protocol_name(name: str) -> None:
    """Make ``name`` a known profile name (:func:`drvenus.reference.profiles.register_profile`
    does it for every profile it registers)."""
    if name not in _NAMES:
        _NAMES.append(name)


def protocol_names() -> tuple[str, ...]:
    """Every known profile name, the default first."""
    return tuple(_NAMES)


def check_protocol(name: str) -> str:
    """``name`` when it is a known profile name; ValueError naming the known ones."""
    if name not in _NAMES:
        raise ValueError(f"unknown protocol {name!r}; expected one of {', '.join(_NAMES)}")
    return name
#: writes the search tool's body for ``[(query, [hit, ...]), ...]``
SearchRenderer = Callable[[Sequence[tuple[str, Sequence[Mapping[str, Any]]]]], str]


class Profile:
    """drvenus's own profile; another profile overrides what it does differently. ``settings``
    is a :class:`drvenus.config.Settings` (where a profile's pinned files are read from)."""

    name: str = DEFAULT_PROTOCOL
    #: choosing it is said to the user (a departure from the default), not only logged
    chosen: bool = False
    #: every model error is tried again within a step's attempts, an HTTP 400 too
    retry_every_model_error: bool = False
    #: a blank reply on a step's last attempt ends the run as ``llm_error``
    blank_ends_run: bool = False
    #: seconds a question may take (None: the preset's); ``--time-limit`` goes first
    time_limit: float | None = None
    #: after a context compaction the model is told the searches and pages it already made
    #: (:func:`drvenus.protocol.recap`)
    compaction_recap: bool = True

    def texts(self, settings: Any = None) -> ProtocolTexts:
        """The words of the agent loop and the visit tool."""
        return DRVENUS_TEXTS

    def reader(self) -> TurnReader:
        """How the agent loop repairs and reads a sampled turn."""
        return DRVENUS_READER

    def search_renderer(self) -> SearchRenderer:
        """How the search tool writes its results (drvenus's JSON)."""
        return render_search

    def search_without_query(self) -> str | None:
        """What a search call without a query gets (None: drvenus's error text)."""
        return None

    def agent_sampling(self, settings: Any = None) -> Mapping[str, Any]:
        """Sampling keywords on top of a real model's preset (none: the preset's)."""
        return {}

    def extractor(self, settings: Any = None) -> tuple[str, Mapping[str, Any]] | None:
        """(prompt, sampling keywords) of the page extractor; None: ours, with the offline
        method as fallback."""
        return None

    def note(self, settings: Any = None) -> str | None:
        """One line on the prompt a run uses (None: nothing to say of this profile)."""
        return None

    def no_extractor_warning(self) -> str | None:
        """What to warn of when no extractor model is configured."""
        return None

    def remote_tools_note(self) -> str | None:
        """What to say when the tools run on a tool server."""
        return None

    def rl_texts(self) -> Any:
        """The texts of the profile's own RL environment; None: none, rollouts run the agent
        loop with inference's hooks (with them: that environment's loop, re-rendered queries,
        the completion cut-off; drvenus.train.rl.collect.run_rollout)."""
        return None

    def rl_judge_texts(self) -> Any:
        """The RL outcome judge's texts (None: drvenus's judge)."""
        return None

    def check_rl(self, judge: bool) -> None:
        """Load what ``rl`` needs of this profile now, raising one line when it cannot."""


__all__ = ["DEFAULT_PROTOCOL", "PROTOCOLS", "Profile", "ProtocolName", "SearchRenderer",
           "add_protocol_name", "check_protocol", "protocol_names"]

"""The registry of protocol profiles, looked up by name (``--protocol``, DRVENUS_PROTOCOL).

``drvenus``: drvenus's own words (:class:`drvenus.protocol.profiles.Profile`). ``dr-venus``:
DR-Venus's, every text read from its pinned files at run time (:mod:`.dr_venus` for inference,
:mod:`.dr_venus_rl` for the RL environment and judge). A new profile subclasses
:class:`~drvenus.protocol.profiles.Profile` and is registered here with
:func:`register_profile`; nothing outside this registry compares profile names.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from drvenus.protocol import ProtocolTexts
from drvenus.protocol.dr_venus import DR_VENUS_READER, render_search_view
from drvenus.protocol.parse import TurnReader
from drvenus.protocol.profiles import (
    DEFAULT_PROTOCOL,
    Profile,
    SearchRenderer,
    add_protocol_name,
    protocol_names,
)
from drvenus.reference import dr_venus_rl
from drvenus.reference.dr_venus import PROFILE, RUN_DEMO, load_dr_venus_texts
from drvenus.reference.store import read_once, reference_store

log = logging.getLogger(__name__)


class DrVenusProfile(Profile):
    """DR-Venus's texts, sampling, page extractor, RL environment and judge, from the pinned
    files (DRVENUS_REFERENCE_DIR, else the cache, else HTTPS), hash checked."""

    name = PROFILE
    chosen = True
    retry_every_model_error = True  # run_demo.py's _generate retries any failed call
    blank_ends_run = True  # ... and returns None (llm_error) when the last one is blank
    # Inference/run_demo.sh's TIME_LIMIT (run_demo.py's argument default is 9000); its
    # SOLVER_MAX_LEN, 230,000, is drvenus's context budget already
    time_limit = 18_000.0
    # DR-Venus has no compaction; with a --context-strategy its model is told nothing beyond
    # drvenus's report / stub wording, no recap of its searches
    compaction_recap = False

    def reference(self, settings: Any = None) -> Any:
        """DR-Venus's inference texts (:class:`~drvenus.reference.dr_venus.DrVenusTexts`), read
        once per process and store (:func:`read_once`). Nothing is registered anywhere: the
        readers of tool responses are handed the profile's texts (``texts``). Raises
        ReferenceError / ExtractError (one line, both ValueErrors)."""
        return read_once("DR-Venus inference texts", load_dr_venus_texts,
                         reference_store(settings))

    def texts(self, settings: Any = None) -> ProtocolTexts:
        return self.reference(settings).protocol_texts()  # type: ignore[no-any-return]

    def reader(self) -> TurnReader:
        return DR_VENUS_READER

    def search_renderer(self) -> SearchRenderer:
        return render_search_view  # the Markdown as the dispatcher re-reads it

    def search_without_query(self) -> str | None:
        return render_search_view([])  # the tool's invalid-request text re-read: "[]"

    def agent_sampling(self, settings: Any = None) -> Mapping[str, Any]:
        return self.reference(settings).agent_sampling  # type: ignore[no-any-return]

    def extractor(self, settings: Any = None) -> tuple[str, Mapping[str, Any]] | None:
        texts = self.reference(settings)
        return texts.extractor_prompt, texts.extractor_sampling

    def note(self, settings: Any = None) -> str | None:
        texts = self.reference(settings)
        return (f"prompt: DR-Venus's own system prompt and notices ({texts.source}, "
                f"{RUN_DEMO} sha256 {texts.files[RUN_DEMO][:12]}) (--protocol {self.name})")

    def no_extractor_warning(self) -> str | None:
        return (f"--protocol {self.name}: no extractor model (DRVENUS_EXTRACTOR_BASE_URL, "
                "DRVENUS_EXTRACTOR_MODEL), so pages are summarised offline, not with "
                "DR-Venus's extractor prompt")

    def remote_tools_note(self) -> str | None:
        return (f"--protocol {self.name} with --tools-url: the visit texts and the extractor "
                f"are the tool server's (start it with --protocol {self.name} too)")

    def rl_texts(self) -> Any:
        return dr_venus_rl.rl_texts()  # looked up at call time: one place to swap in tests

    def rl_judge_texts(self) -> Any:
        return dr_venus_rl.rl_judge_texts()

    def check_rl(self, judge: bool) -> None:
        self.rl_texts()  # one line naming a missing or changed file
        if judge:
            self.rl_judge_texts()


PROFILES: dict[str, Profile] = {}


def register_profile(profile: Profile, *aliases: str) -> None:
    """Make ``profile`` known by its name (and ``aliases``): ``--protocol``, DRVENUS_PROTOCOL
    and every layer's lookup (:func:`profile`) accept it from then on."""
    for name in (profile.name, *aliases):
        PROFILES[name] = profile
        add_protocol_name(name)


def profile(name: str | None = None) -> Profile:
    """The profile called ``name`` (None: the default). Raises ValueError for an unknown name."""
    key = name or DEFAULT_PROTOCOL
    try:
        return PROFILES[key]
    except KeyError:
        raise ValueError(f"unknown protocol {key!r}; expected one of "
                         f"{', '.join(protocol_names())}") from None


register_profile(Profile())
register_profile(DrVenusProfile())

__all__ = ["PROFILES", "DrVenusProfile", "profile", "register_profile"]

"""The profiles own their behaviour: DR-Venus's pinned files are read once per process, however
often a stack is built."""

from __future__ import annotations

import os
from pathlib import Path

from dr_venus_functions import NEEDS_REFERENCE


@NEEDS_REFERENCE
def test_the_pinned_files_are_read_once_per_process(monkeypatch, tmp_path):
    from drvenus.config import Settings
    from drvenus.reference import profiles
    from drvenus.stack import agent_config, protocol_note

    (tmp_path / "refs").symlink_to(Path(os.environ["DRVENUS_REFERENCE_DIR"]).expanduser())
    loads: list[object] = []
    real = profiles.load_dr_venus_texts
    monkeypatch.setattr(profiles, "load_dr_venus_texts",
                        lambda store: loads.append(store) or real(store))
    settings = Settings(protocol="dr-venus", base_url="http://127.0.0.1:9/v1",
                        reference_dir=tmp_path / "refs", cache_dir=tmp_path / "cache")
    chosen = profiles.profile("dr-venus")
    for _ in range(3):  # three stack builds
        agent_config(settings)
        protocol_note(settings)
        chosen.extractor(settings)
        chosen.texts(settings)
    assert len(loads) == 1

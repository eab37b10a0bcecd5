"""The profiles own their behaviour: DR-Venus's pinned files are read once per process, however
often a stack is built."""

from __future__ import annotations

from dr_venus_functions import NEEDS_REFERENCE


@NEEDS_REFERENCE
def test_the_pinned_files_are_read_once_per_process(monkeypatch, tmp_path, real_reference):
    from drvenus.config import Settings
    from drvenus.reference import profiles
    from drvenus.stack import agent_config, protocol_note

    (tmp_path / "refs").symlink_to(real_reference)  # a store no earlier test has read
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


def test_a_third_profile_registers_and_runs_end_to_end(monkeypatch):
    """A toy profile, registered without touching drvenus.protocol: the settings accept its
    name, and a run reads its texts and its search view through the product's stack."""
    import asyncio
    from dataclasses import replace

    from drvenus.agent import ResearchAgent
    from drvenus.config import Settings
    from drvenus.protocol import DRVENUS_TEXTS
    from drvenus.protocol import profiles as names
    from drvenus.protocol.profiles import Profile
    from drvenus.reference import profiles
    from drvenus.stack import agent_config, build_toolbox
    from helpers.search import KEY, FakeSearchServer
    from scripted import ScriptedModel, answer, call

    monkeypatch.setattr(names, "_NAMES", list(names._NAMES))
    monkeypatch.setattr(profiles, "PROFILES", dict(profiles.PROFILES))
    toy_texts = replace(DRVENUS_TEXTS, name="toy", format_error="TOY: once more, please.")

    class Toy(Profile):
        name = "toy"
        blank_ends_run = True

        def texts(self, settings=None):
            return toy_texts

        def search_renderer(self):
            return lambda per_query: "toy view: " + " | ".join(q for q, _ in per_query)

    profiles.register_profile(Toy(), "toy-alias")
    assert profiles.profile("toy-alias").name == "toy"
    assert "toy" in names.protocol_names()
    with FakeSearchServer("serper", n=3) as serper:
        settings = Settings(protocol="toy", base_url="http://127.0.0.1:9/v1", search="serper",
                            visit="fetch", serper_url=serper.url, serper_api_key=KEY,
                            tool_cache=False)
        cfg = agent_config(settings)
        assert cfg.texts is toy_texts and cfg.blank_ends_run
        model = ScriptedModel(["<think>x</think>no call", call("search", query=["Dune", "Herbert"]),
                               answer("Frank Herbert")])
        tools = build_toolbox(settings)
        record = asyncio.run(ResearchAgent(model, tools, replace(cfg, backoff_base=0.0,
                                                                 max_attempts=1)).run("Who?"))
    bodies = [m["content"] for m in record.messages if m["role"] == "user"][1:]
    assert "TOY: once more, please." in bodies[0]
    assert bodies[1] == "<tool_response>\ntoy view: Dune | Herbert\n</tool_response>"
    assert record.termination == "answered"

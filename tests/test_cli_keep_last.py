"""`--keep-last` without `--context-strategy keep-last-k` is said, not silently ignored
(issue 43)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from drvenus.agent.context import keep_last_warning
from drvenus.cli.options import AgentOptions
from drvenus.config import CONTEXT_STRATEGIES


@given(strategy=st.sampled_from([None, *CONTEXT_STRATEGIES]),
       keep_last=st.one_of(st.none(), st.integers(0, 50)))
def test_the_warning_names_the_flags_exactly_when_keep_last_is_unused(strategy, keep_last):
    warning = keep_last_warning(strategy, keep_last)
    unused = keep_last is not None and strategy != "keep-last-k"
    assert (warning is not None) == unused
    if warning:
        assert f"--keep-last {keep_last}" in warning and "keep-last-k" in warning


def test_agent_options_warn_once_on_stderr(capsys, monkeypatch):
    monkeypatch.delenv("DRVENUS_CONTEXT_STRATEGY", raising=False)
    monkeypatch.delenv("DRVENUS_KEEP_LAST", raising=False)
    settings = AgentOptions(keep_last=4).settings()
    assert settings.keep_last == 4
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "--keep-last 4 does nothing" in err
    AgentOptions(keep_last=4, context_strategy="keep-last-k").settings()
    AgentOptions().settings()
    assert "warning" not in capsys.readouterr().err

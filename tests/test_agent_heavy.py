"""Heavy mode (drvenus.agent.heavy): N runs in parallel, then a synthesis turn or a vote."""

from __future__ import annotations

import asyncio

from drvenus import protocol
from drvenus.agent import AgentConfig, HeavyPolicy, ResearchAgent, replay_messages
from drvenus.agent.events import split_runs
from drvenus.agent.heavy import majority_vote
from drvenus.agent.record import ResultRecord
from scripted import ScriptedModel, ScriptedTools, answer, call

ANSWERS = ["Mary Shelley", "Bram Stoker", "bram stoker.", "Sheridan Le Fanu"]


class Researchers:
    """Run i (in the order runs first call the model) searches once, then answers ANSWERS[i];
    the synthesis turn replies ``synthesis``."""

    def __init__(self, synthesis: str = answer("Bram Stoker")) -> None:
        self.synthesis = synthesis
        self.runs: dict[int, int] = {}
        self.synthesis_prompts: list[list[dict[str, str]]] = []

    def __call__(self, messages):
        if messages[0]["content"] == protocol.SYNTHESIS_PROMPT:
            self.synthesis_prompts.append(messages)
            return self.synthesis
        run = self.runs.setdefault(id(messages), len(self.runs))
        if not any(m["role"] == "assistant" for m in messages):
            return call("search", query=[f"dracula author {run}"])
        return answer(ANSWERS[run])


def heavy(mode: str, researchers: Researchers, runs: int = 4):
    config = AgentConfig(max_steps=3, max_attempts=1, backoff_base=0.0,
                         heavy=HeavyPolicy(runs=runs, mode=mode))  # type: ignore[arg-type]
    agent = ResearchAgent(ScriptedModel([researchers]), ScriptedTools("[]"), config)
    events = []
    record = asyncio.run(agent.run("Who wrote Dracula?", events.append))
    return record, events


def test_vote_picks_the_majority_answer_deterministically():
    record, _ = heavy("vote", Researchers())
    assert record.termination == "answered" and record.prediction == "Bram Stoker"
    info = record.extra["heavy"]
    assert info["chosen_by"] == "vote" and len(info["runs"]) == 4
    assert info["votes"] == {"mary shelley": 1, "bram stoker": 2, "sheridan le fanu": 1}
    assert record.tool_call_count == 4 and record.usage["calls"] == 8


def test_synthesis_reads_each_answer_and_its_evidence():
    researchers = Researchers()
    record, events = heavy("synthesise", researchers)
    assert record.prediction == "Bram Stoker"
    assert record.extra["heavy"]["chosen_by"] == "synthesis"
    (prompt,) = researchers.synthesis_prompts
    text = prompt[1]["content"]
    for i, a in enumerate(ANSWERS):
        assert f"Answer: {a}" in text and f"search: dracula author {i}" in text
    assert record.messages[:2] == prompt and record.messages[2]["role"] == "assistant"
    assert record.usage["calls"] == 9 and record.turns == 9
    # the trace: four interleaved runs split apart, then the synthesis run; each replays
    runs = split_runs([e.to_dict() for e in events])
    assert len(runs) == 5
    for i, run in enumerate(runs[:4]):
        member = ResultRecord(**run[-1]["data"]["record"])
        assert replay_messages(run) == member.messages
        assert {e["data"]["heavy_run"] for e in run} == {i}
    assert replay_messages(runs[4]) == record.messages
    assert events[-1].type == "finished" and "heavy_run" not in events[-1].data


def test_a_failed_synthesis_falls_back_to_the_vote():
    record, events = heavy("synthesise", Researchers(synthesis="no tags at all"))
    assert record.prediction == "Bram Stoker"
    assert record.extra["heavy"]["chosen_by"] == "vote"
    assert record.extra["heavy"]["note"].startswith("synthesis failed")
    assert any(e.type == "error" and e.data["kind"] == "synthesis_failed" for e in events)


def test_no_run_answered_keeps_the_first_runs_outcome():
    def searcher(messages):
        n = sum(m["role"] == "assistant" for m in messages)
        return call("search", query=[f"q{id(messages)}-{n}"])

    config = AgentConfig(max_steps=2, max_attempts=1, backoff_base=0.0,
                         heavy=HeavyPolicy(runs=2))
    agent = ResearchAgent(ScriptedModel([searcher]), ScriptedTools("[]"), config)
    record = asyncio.run(agent.run("Who?"))
    assert record.termination == "max_steps"
    assert record.extra["heavy"]["chosen_by"] == "vote" and record.extra["heavy"]["votes"] == {}


def test_majority_vote_ties_go_to_the_earliest_run():
    def rec(prediction, termination="answered"):
        return ResultRecord("q", [], prediction, termination)

    assert majority_vote([rec("A"), rec("B"), rec("b"), rec("a")]) == 0
    assert majority_vote([rec("A", "max_steps"), rec("B")]) == 1
    assert majority_vote([rec("", "answered")]) is None


def test_settings_choose_heavy_mode():
    from drvenus.config import load_settings
    from drvenus.stack import agent_config

    cfg = agent_config(load_settings(base_url="http://127.0.0.1:9/v1", heavy=3,
                                     heavy_mode="vote"))
    assert cfg.heavy == HeavyPolicy(runs=3, mode="vote")


def test_the_terminal_shows_each_run_then_the_final_answer():
    from rich.console import Console

    from drvenus.cli.console import LiveTrace

    _, events = heavy("synthesise", Researchers(), runs=2)
    console = Console(record=True, width=200)
    trace = LiveTrace(console)
    for event in events:
        trace(event)
    text = console.export_text()
    assert text.count("Question") == 1 and "run 2 Answered: Bram Stoker" in text
    assert text.count("Writing one answer from 2 runs") == 1 and "Voting" not in text


def test_the_terminal_heads_a_run_with_its_answers_first_paragraph():
    from rich.console import Console

    from drvenus.agent import TraceEvent
    from drvenus.cli.console import LiveTrace

    console = Console(record=True, width=200)
    markdown = ("## Author\n\n**Bram Stoker** wrote [it](https://en.wikipedia.org/wiki/Dracula)."
                "\n\n| book | year |\n|---|---|\n| Dracula | 1897 |")
    LiveTrace(console)(TraceEvent("finished", 2, {
        "heavy_run": 0, "record": {"termination": "answered", "prediction": markdown}}))
    assert console.export_text().strip() == "run 1 Answered: Bram Stoker wrote it."


def test_the_terminal_words_a_failed_synthesis_and_its_vote():
    from rich.console import Console

    from drvenus.cli.console import LiveTrace

    _, events = heavy("synthesise", Researchers(synthesis="no tags at all"), runs=2)
    console = Console(record=True, width=200)
    trace = LiveTrace(console)
    for event in events:
        trace(event)
    text = console.export_text()
    assert text.count("Writing one answer from 2 runs") == 1
    assert text.count("Voting over the answers of 2 runs") == 1
    assert "the synthesis failed; the runs' answers are voted on instead" in text
    assert "synthesis_failed" not in text and "Final answer from" not in text


def test_runs_after_the_first_sample_differently():
    from drvenus.agent.heavy import MEMBER_TEMPERATURE, member_sampling
    from drvenus.llm.base import SamplingParams

    greedy = SamplingParams(temperature=0.0, seed=0)
    assert member_sampling(greedy, 0) == greedy
    second, third = member_sampling(greedy, 1), member_sampling(greedy, 2)
    assert second.temperature == MEMBER_TEMPERATURE and len({0, second.seed, third.seed}) == 3
    assert member_sampling(SamplingParams(temperature=0.6), 1).temperature == 0.6


def test_a_constrained_synthesis_must_pick_one_of_the_answers():
    from dataclasses import replace

    researchers = Researchers(synthesis=answer("Researcher 1"))
    config = AgentConfig(max_steps=3, max_attempts=1, backoff_base=0.0, constrained=True,
                         heavy=HeavyPolicy(runs=4))
    agent = ResearchAgent(ScriptedModel([researchers]), ScriptedTools("[]"), config)
    record = asyncio.run(agent.run("Who wrote Dracula?"))
    assert record.prediction == "Bram Stoker" and record.extra["heavy"]["chosen_by"] == "vote"
    assert "none of the runs' answers" in record.extra["heavy"]["note"]
    unconstrained = replace(config, constrained=False)
    agent = ResearchAgent(ScriptedModel([Researchers(synthesis=answer("Researcher 1"))]),
                          ScriptedTools("[]"), unconstrained)
    assert asyncio.run(agent.run("Who wrote Dracula?")).prediction == "Researcher 1"


def test_split_researches_keeps_a_heavy_research_together():
    from drvenus.agent.events import split_researches

    def ev(kind: str, run: int | None = None, **data) -> dict:
        return {"type": kind, "step": 0, "data": {**data, **({} if run is None else
                                                           {"heavy_run": run})}}

    plain = [ev("started"), ev("finished")]
    heavy = [ev("started", 0), ev("started", 1), ev("finished", 1), ev("finished", 0),
             ev("started", heavy=2), ev("finished")]
    cut = [ev("started", 0), ev("started", 1)]  # a Heavy research cut short
    again = [ev("started", 0), ev("finished", 0), ev("started", heavy=1), ev("finished")]
    cut_plain = [ev("started")]
    groups = split_researches([*plain, *heavy, *cut, *again, *cut_plain, *plain])
    assert groups == [plain, heavy, cut, again, cut_plain, plain]


def test_the_synthesis_turn_is_read_by_the_profile_reader():
    """--protocol dr-venus: the synthesis reply is read as DR-Venus reads a turn (the first
    answer block wins, even inside the think block), not by drvenus's reader."""
    from dataclasses import replace

    from drvenus.protocol.dr_venus import DR_VENUS_READER
    from drvenus.protocol.parse import DRVENUS_READER

    reply = "<think>first <answer>Bram Stoker</answer> then</think>\n<answer>Mary Shelley</answer>"
    config = AgentConfig(max_steps=3, max_attempts=1, backoff_base=0.0,
                         heavy=HeavyPolicy(runs=2, mode="synthesise"))
    for reader, expected in ((DR_VENUS_READER, "Bram Stoker"), (DRVENUS_READER, "Mary Shelley")):
        agent = ResearchAgent(ScriptedModel([Researchers(synthesis=reply)]), ScriptedTools("[]"),
                              replace(config, reader=reader))
        record = asyncio.run(agent.run("Who wrote Dracula?"))
        assert record.extra["heavy"]["chosen_by"] == "synthesis"
        assert record.prediction == expected

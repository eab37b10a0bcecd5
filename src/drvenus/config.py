"""One typed settings object: CLI flags override environment variables and ``.env``.

Every variable is prefixed ``DRVENUS_`` (``DRVENUS_BASE_URL``, ``DRVENUS_MODEL_NAME`` ...).
Secrets (API keys) are read from the environment or ``.env`` only, and never logged.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="DRVENUS_", env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    # model: a server (base_url + model_name), a GGUF file (model_path), or the embedded default
    base_url: str | None = None
    model_name: str | None = None
    api_key: SecretStr | None = Field(default=None, repr=False)
    model_path: Path | None = None
    constrained: bool | None = None
    n_ctx: int | None = None
    request_timeout: float = 600.0

    # tools
    corpus: Path | None = None
    cache_dir: Path | None = None
    search_top_k: int | None = None

    # extractor model for visit (optional, OpenAI-compatible)
    extractor_base_url: str | None = None
    extractor_model: str | None = None
    extractor_api_key: SecretStr | None = Field(default=None, repr=False)

    # LLM judge (correctness filter, evaluation)
    judge_base_url: str | None = None
    judge_model: str | None = None
    judge_api_key: SecretStr | None = Field(default=None, repr=False)

    # agent budgets
    max_steps: int | None = None
    max_context: int | None = None
    time_limit: float | None = None
    max_attempts: int | None = None

    def api_key_value(self) -> str | None:
        return self.api_key.get_secret_value() if self.api_key else None


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment / ``.env``, with non-None ``overrides`` (CLI flags) on top."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})

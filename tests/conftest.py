from __future__ import annotations

import contextlib
import signal
import tempfile
from pathlib import Path

import pytest

# imported first here: the real pinned official files are looked for before any test changes
# the environment (helpers.reference)
from helpers.reference import checkout_folder, real_store

# The MCP SDK's stdio client takes sys.stderr as its default error log when it is first
# imported; imported inside a CliRunner (whose stderr has no file descriptor), every later
# stdio client would fail with "fileno". Imported here, the default is a real stream.
with contextlib.suppress(ImportError):
    import mcp.client.stdio  # noqa: F401

# The Ctrl-C tests send SIGINT to child processes. A child started by a process that ignores
# SIGINT (a pytest launched in the background by a non-interactive shell, or with nohup)
# inherits the ignoring, and then Ctrl-C would do nothing. Handling SIGINT here, as an
# interactive pytest does, lets every child start with the default action, as under a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
# The embedded model is fetched once (with pip) and shared by test sessions on this machine.
TEST_MODELS_DIR = Path(tempfile.gettempdir()) / "drvenus-test-models"


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    """The two-page corpus (Dracula, Emma) of the command-line tests (helpers.cli)."""
    from helpers.cli import write_corpus

    return write_corpus(tmp_path / "corpus.jsonl")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data folder not found at {SHARED_DATA} (only present in the dev tree)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def models_dir() -> Path:
    return TEST_MODELS_DIR


@pytest.fixture(scope="session")
def embedded_gguf(models_dir: Path) -> Path:
    """The embedded GGUF (pulled on first use; a test session fails loudly if it cannot be)."""
    from drvenus.llm.embedded import embedded_model_path

    return embedded_model_path(models_dir)


@pytest.fixture(scope="session")
def embedded_tokenizer_dir(embedded_gguf: Path, tmp_path_factory) -> Path:
    """The embedded model's tokenizer and chat template as a Hugging Face folder, converted from
    its GGUF once per session (needs the train extra's transformers and gguf)."""
    transformers = pytest.importorskip("transformers", reason="needs the train extra")
    folder = tmp_path_factory.mktemp("smollm2-tokenizer")
    tok = transformers.AutoTokenizer.from_pretrained(
        str(embedded_gguf.parent), gguf_file=embedded_gguf.name
    )
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory, embedded_tokenizer_dir) -> Path:
    """A 2-layer, 64-wide random Llama with SmolLM2's tokenizer and chat template (RL tests)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("tiny-policy")
    tok = transformers.AutoTokenizer.from_pretrained(embedded_tokenizer_dir)
    config = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Never let a test write into the real user cache."""
    monkeypatch.setenv("DRVENUS_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "drvenus-cache"))
    monkeypatch.setenv("DRVENUS_MODELS_DIR", str(TEST_MODELS_DIR))


@pytest.fixture(scope="session")
def _real_reference_folder(tmp_path_factory) -> Path:
    return checkout_folder(real_store(), tmp_path_factory.mktemp("real-reference"))


@pytest.fixture()
def real_reference(_real_reference_folder: Path, monkeypatch) -> Path:
    """The real pinned official files, as a folder of checkouts that DRVENUS_REFERENCE_DIR
    points at for the test (helpers.reference: skips where they cannot be had, fails instead
    under DRVENUS_REQUIRE_REFERENCE=1)."""
    monkeypatch.setenv("DRVENUS_REFERENCE_DIR", str(_real_reference_folder))
    return _real_reference_folder

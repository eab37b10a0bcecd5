"""The embedded model's tokenizer as a Hugging Face folder, shared by the benchmarks.

Converting it from the GGUF takes about 5 s of CPU; the folder is written once (to a scratch
folder, then renamed, so concurrent runs never read a half copy) next to the test models in the
temp dir, keyed by the GGUF's name, size and modification time.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

TEST_MODELS = Path(tempfile.gettempdir()) / "drvenus-test-models"


def embedded_tokenizer_dir() -> Path:
    """A folder ``AutoTokenizer.from_pretrained`` loads: SmolLM2's tokenizer and chat template."""
    from transformers import AutoTokenizer

    from drvenus.llm.embedded import embedded_model_path

    gguf = embedded_model_path(TEST_MODELS)
    stat = gguf.stat()
    folder = Path(tempfile.gettempdir()) / (
        f"drvenus-bench-tokenizer-{gguf.stem}-{stat.st_size}-{stat.st_mtime_ns}")
    if (folder / "tokenizer_config.json").is_file():
        return folder
    scratch = Path(tempfile.mkdtemp(prefix=f"{folder.name}.", dir=folder.parent))
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(scratch)
    try:
        scratch.rename(folder)
    except OSError:  # another run wrote it first
        shutil.rmtree(scratch, ignore_errors=True)
    return folder

"""Read the metadata of a GGUF file (no tensors, no native code).

The in-process backend needs a few facts before it loads a model: the trained context length
and the KV-cache size per token (to size the window to the machine's memory), and the chat
template (to know whether it opens the assistant turn inside the think block). The format is
documented in llama.cpp's ``gguf`` spec: a header, then typed key/value pairs.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from drvenus.llm.base import LLMError
from drvenus.protocol import template_prefills_think

GGUF_MAGIC = b"GGUF"

# value type id -> struct format (scalars); 8 = string, 9 = array
_SCALARS = {
    0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d",
}
_STRING, _ARRAY = 8, 9
# Arrays longer than this (token lists, merges) are skipped, not kept in memory.
_MAX_KEPT_ARRAY = 64


@dataclass(frozen=True)
class GGUFInfo:
    """What drvenus needs from a GGUF header."""

    path: Path
    metadata: dict[str, Any] = field(repr=False)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def _arch(self, key: str) -> Any:
        return self.metadata.get(f"{self.architecture}.{key}")

    @property
    def name(self) -> str | None:
        name = self.metadata.get("general.name")
        return str(name) if name else None

    @property
    def context_length(self) -> int | None:
        value = self._arch("context_length")
        return int(value) if value else None

    @property
    def chat_template(self) -> str | None:
        value = self.metadata.get("tokenizer.chat_template")
        return str(value) if value else None

    @property
    def kv_bytes_per_token(self) -> int | None:
        """Bytes of f16 K and V cache one token takes across all layers (None if unknown)."""
        layers = self._arch("block_count")
        heads = self._arch("attention.head_count")
        kv_heads = self._arch("attention.head_count_kv") or heads
        embed = self._arch("embedding_length")
        if isinstance(kv_heads, list):  # per-layer counts (some hybrid architectures)
            kv_heads = max(kv_heads) if kv_heads else None
        if not (layers and kv_heads and (heads or embed)):
            return None
        key_len = self._arch("attention.key_length") or (embed // heads if heads else None)
        value_len = self._arch("attention.value_length") or key_len
        if not key_len:
            return None
        return int(layers) * int(kv_heads) * (int(key_len) + int(value_len)) * 2

    def prefills_think(self) -> bool:
        """Whether the chat template opens the assistant turn inside the think block."""
        return template_prefills_think(self.chat_template or "")


def _read(fh: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize("<" + fmt)
    data = fh.read(size)
    if len(data) != size:
        raise EOFError("truncated GGUF header")
    return struct.unpack("<" + fmt, data)[0]


def _read_string(fh: BinaryIO) -> str:
    n = _read(fh, "Q")
    data = fh.read(n)
    if len(data) != n:
        raise EOFError("truncated GGUF string")
    return data.decode("utf-8", errors="replace")


def _read_value(fh: BinaryIO, vtype: int) -> Any:
    if vtype in _SCALARS:
        return _read(fh, _SCALARS[vtype])
    if vtype == _STRING:
        return _read_string(fh)
    if vtype == _ARRAY:
        item_type, count = _read(fh, "I"), _read(fh, "Q")
        if count > _MAX_KEPT_ARRAY:
            _skip_array(fh, item_type, count)
            return None
        return [_read_value(fh, item_type) for _ in range(count)]
    raise ValueError(f"unknown GGUF value type {vtype}")


def _skip_array(fh: BinaryIO, item_type: int, count: int) -> None:
    if item_type in _SCALARS:
        fh.seek(struct.calcsize("<" + _SCALARS[item_type]) * count, os.SEEK_CUR)
        return
    for _ in range(count):
        if item_type == _STRING:
            fh.seek(_read(fh, "Q"), os.SEEK_CUR)
        else:
            _read_value(fh, item_type)


def check_gguf_file(path: str | os.PathLike[str]) -> Path:
    """``path`` as a Path if it names a readable GGUF file; else :class:`LLMError`."""
    p = Path(path).expanduser()
    if not p.exists():
        raise LLMError(f"model file not found: {p}")
    if not p.is_file():
        raise LLMError(f"model path is not a file: {p}")
    try:
        with p.open("rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise LLMError(f"cannot read model file {p}: {exc.strerror or exc}") from None
    if magic != GGUF_MAGIC:
        raise LLMError(f"not a GGUF model file: {p} (starts with {magic!r}, expected b'GGUF')")
    return p


def read_gguf_info(path: str | os.PathLike[str]) -> GGUFInfo:
    """The metadata key/values of a GGUF file; :class:`LLMError` if it is not one."""
    p = check_gguf_file(path)
    metadata: dict[str, Any] = {}
    try:
        with p.open("rb") as fh:
            fh.seek(4)
            version = _read(fh, "I")
            if version < 2:
                raise LLMError(f"GGUF version {version} is too old: {p}")
            _read(fh, "Q")  # tensor count
            for _ in range(_read(fh, "Q")):
                key = _read_string(fh)
                metadata[key] = _read_value(fh, _read(fh, "I"))
    except (EOFError, ValueError, struct.error, OSError) as exc:
        raise LLMError(f"cannot read GGUF metadata of {p}: {exc}") from None
    return GGUFInfo(p, metadata)


__all__ = ["GGUFInfo", "check_gguf_file", "read_gguf_info"]

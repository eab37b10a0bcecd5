"""A GGUF model run inside this process by llama.cpp's own server engine (xllamacpp).

xllamacpp ships prebuilt wheels (Linux x86-64 and arm64, macOS, Windows) whose CPU code picks
its instruction set at run time, so nothing is compiled at install and nothing the CPU lacks is
executed. Its ``Server`` is llama-server without the network: it takes OpenAI-style request
bodies, keeps each conversation's KV cache in a *slot* (step k of an agent run evaluates only
the tokens added since step k-1) and runs ``parallel`` slots with continuous batching, so
several questions share one loaded model. A LoRA adapter in llama.cpp's GGUF adapter format
(``drvenus models export-adapter``) can be applied on top of the weights (``adapter``).

:class:`InProcessTransport` plugs it under :class:`~drvenus.llm.openai_compat.OpenAICompatModel`,
which builds the requests and parses the answers exactly as for an HTTP server.
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from drvenus.llm.base import GrammarBuilder, LLMError
from drvenus.llm.gguf import GGUFInfo, read_gguf_info
from drvenus.llm.openai_compat import OpenAICompatModel, error_detail, status_error
from drvenus.net import DEFAULT_REQUEST_TIMEOUT

log = logging.getLogger(__name__)

MIN_WINDOW = 2048
FALLBACK_WINDOW = 32768  # when neither the GGUF nor the machine says more
KV_MEMORY_SHARE = 0.5  # of the memory left after the weights, at most, for the KV cache
# KV cache types (``--kv-cache``): llama.cpp's ggml type, and bytes per element relative to
# f16 (q8_0: 34 bytes per block of 32, q4_0: 18), so a quantised cache fits a longer window
KV_CACHE_TYPES: dict[str, tuple[str, float]] = {
    "f16": ("GGML_TYPE_F16", 1.0),
    "q8_0": ("GGML_TYPE_Q8_0", 34 / 64),
    "q4_0": ("GGML_TYPE_Q4_0", 18 / 64),
}


# The x86-64 wheels of xllamacpp are built for a fixed baseline (no -march=native, no AVX-512):
# their code uses AVX2, FMA, F16C and BMI2 instructions unconditionally (checked by
# disassembling the 2026.10 wheel). A CPU without them would die of SIGILL, so we refuse first.
X86_REQUIRED_FLAGS = ("avx", "avx2", "fma", "f16c", "bmi2")


def missing_cpu_flags(cpuinfo: str) -> list[str]:
    """The required x86-64 CPU flags absent from a ``/proc/cpuinfo`` text."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            return [f for f in X86_REQUIRED_FLAGS if f not in flags]
    return []


def check_cpu() -> None:
    """:class:`LLMError` (instead of a crash) on an x86-64 Linux CPU the wheel cannot run on."""
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            missing = missing_cpu_flags(fh.read())
    except OSError:
        return
    if missing:
        raise LLMError(
            f"this CPU lacks {', '.join(missing)}, which the prebuilt llama.cpp runtime needs: "
            "point drvenus at a model server (--base-url) or build xllamacpp from source "
            "(pip install --no-binary xllamacpp xllamacpp)"
        )


def _import_xllamacpp() -> Any:
    check_cpu()
    try:
        import xllamacpp
    except ImportError as exc:  # pragma: no cover - a default dependency
        raise LLMError(
            f"the llama.cpp runtime is not installed ({exc}): pip install xllamacpp"
        ) from None
    return xllamacpp


def usable_cores() -> int:
    """CPU cores this process may run on (``sched_getaffinity`` where the OS has it)."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    if getaffinity is not None:
        try:
            return max(1, len(getaffinity(0)))
        except OSError:
            pass
    return max(1, os.cpu_count() or 1)


def default_threads(cores: int | None = None, load: float | None = None) -> int:
    """Threads for llama.cpp: the cores not already busy (1-minute load average), at least 1.

    llama.cpp's threads meet at a barrier after every operation, so one thread that loses its
    core stalls them all: measured on 2 cores with other work running, 2 threads generated 3
    tokens/s and 1 thread 27; on idle cores 2 threads are about 40% faster than 1.
    """
    cores = cores or usable_cores()
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):  # Windows: no load average
            load = 0.0
    return max(1, min(cores, int(cores - load + 0.5)))


def available_memory() -> int | None:
    """Bytes of memory available to new allocations, or None when the OS does not say."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:  # macOS and other POSIX systems: physical memory (no "available" figure)
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def choose_window(
    info: GGUFInfo, parallel: int, requested: int | None = None, memory: int | None = None,
    kv_cache: str = "f16",
) -> int:
    """Tokens of context per slot: ``requested``, else the GGUF's trained length, capped so the
    KV cache of all slots (of type ``kv_cache``) fits in part of the memory left after the
    weights."""
    if requested:
        return max(256, int(requested))
    window = info.context_length or FALLBACK_WINDOW
    f16 = info.kv_bytes_per_token
    per_token = max(1, int(f16 * KV_CACHE_TYPES[kv_cache][1])) if f16 else None
    if per_token and memory:
        free = memory - info.path.stat().st_size
        fits = int(free * KV_MEMORY_SHARE) // (per_token * max(1, parallel))
        window = min(window, max(MIN_WINDOW, fits // 256 * 256))
    elif not memory:  # the OS does not say how much memory there is: stay modest
        window = min(window, FALLBACK_WINDOW)
    return window


def check_adapter(path: str | os.PathLike[str], base: GGUFInfo) -> Path:
    """``path`` if it is a llama.cpp LoRA adapter GGUF for ``base``'s architecture; else
    :class:`LLMError` (llama.cpp itself would only log the reason and fail to start)."""
    try:
        info = read_gguf_info(path)
    except LLMError as exc:
        raise LLMError(f"adapter: {exc}") from None
    kind = info.metadata.get("general.type")
    if kind != "adapter" or info.metadata.get("adapter.type") != "lora":
        raise LLMError(
            f"{info.path} is not a LoRA adapter GGUF (general.type {kind!r}): export one with "
            "`drvenus models export-adapter`"
        )
    if info.architecture != base.architecture:
        raise LLMError(
            f"adapter {info.path.name} is for a {info.architecture} model, but "
            f"{base.path.name} is {base.architecture}"
        )
    return info.path


def _set(params: Any, name: str, value: Any) -> None:
    """Set a llama.cpp parameter the installed xllamacpp may or may not have."""
    if hasattr(params, name):
        setattr(params, name, value)
    else:  # pragma: no cover - older wheels (e.g. on macOS) lack some knobs
        log.debug("xllamacpp has no parameter %s; left at its default", name)


class LlamaCppServer:
    """One GGUF loaded by llama.cpp, with ``parallel`` slots of ``window`` tokens each, and
    optionally a LoRA ``adapter`` (a GGUF adapter file) applied to every request."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        window: int | None = None,
        parallel: int = 1,
        n_threads: int | None = None,
        adapter: str | os.PathLike[str] | None = None,
        kv_cache: str | None = None,
    ) -> None:
        xlc = _import_xllamacpp()
        self.kv_cache = kv_cache or "f16"
        if self.kv_cache not in KV_CACHE_TYPES:
            raise LLMError(f"unknown KV cache type {kv_cache!r}; choose from "
                           + ", ".join(KV_CACHE_TYPES))
        self.info = read_gguf_info(path)
        self.path = self.info.path
        self.adapter = check_adapter(adapter, self.info) if adapter is not None else None
        self.parallel = max(1, int(parallel))
        self.window = choose_window(self.info, self.parallel, window, available_memory(),
                                    self.kv_cache)
        self.n_threads = n_threads or default_threads()
        params = xlc.CommonParams()
        params.model.path = str(self.path)
        params.n_ctx = self.window * self.parallel
        params.n_parallel = self.parallel
        params.cpuparams.n_threads = self.n_threads
        params.cpuparams_batch.n_threads = self.n_threads
        params.warmup = False
        if self.adapter is not None:
            params.lora_adapters = [xlc.CommonAdapterLoraInfo(str(self.adapter), 1.0)]
        _set(params, "verbosity", -1)
        _set(params, "kv_unified", False)  # each slot owns its window
        _set(params, "cache_ram_mib", 0)  # no extra host-memory prompt cache
        if self.kv_cache != "f16":  # a quantised V cache needs flash attention (auto: on)
            ggml = getattr(xlc.ggml_type, KV_CACHE_TYPES[self.kv_cache][0])
            _set(params, "cache_type_k", ggml)
            _set(params, "cache_type_v", ggml)
        _set(params, "reasoning_format", xlc.common_reasoning_format.COMMON_REASONING_FORMAT_NONE)
        # The engine also listens on a random loopback port; a random key keeps it closed.
        self.api_key = secrets.token_urlsafe(24)
        _set(params, "api_keys", [self.api_key])
        _set(params, "endpoint_metrics", True)  # the start-up handshake below
        start = time.perf_counter()
        try:
            self._server: Any = xlc.Server(params)
        except Exception as exc:  # the binding raises RuntimeError/ValueError
            with_adapter = f" with adapter {self.adapter}" if self.adapter else ""
            raise LLMError(f"cannot load GGUF model {self.path}{with_adapter}: {exc}") from None
        self._wait_for_task_loop()
        self.load_seconds = time.perf_counter() - start
        self._pool = ThreadPoolExecutor(self.parallel + 1, thread_name_prefix="llama")
        self._lock = threading.Lock()
        self._cancels: set[threading.Event] = set()
        self._closed = False
        log.info(
            "loaded %s%s in %.2fs: %d slot(s) x %d tokens, %d threads",
            self.path.name, f" + adapter {self.adapter.name}" if self.adapter else "",
            self.load_seconds, self.parallel, self.window, self.n_threads,
        )

    def _wait_for_task_loop(self) -> None:
        """Return once the engine's task loop runs. The engine's constructor returns just
        before its loop starts, and a shutdown that lands in that gap is lost (the loop then
        runs forever and closing the model hangs); one metrics request goes through the loop,
        so after it the gap is closed."""
        try:
            self._server.handle_metrics()
        except Exception as exc:  # an older engine without the route: nothing to wait on
            log.debug("no metrics handshake with the engine: %s", exc)

    def chat(self, body: dict[str, Any], cancel: threading.Event) -> dict[str, Any]:
        """One chat completion (blocking). Streams internally so that ``cancel`` stops the
        generation within a token, then returns the answer as one ``chat.completion``."""
        pieces: list[str] = []
        final: dict[str, Any] = {}
        failure: dict[str, Any] = {}

        def on_chunk(chunk: Any) -> bool:
            if isinstance(chunk, dict):
                if "error" in chunk:
                    failure.update(chunk)
                    return True
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    if delta.get("content"):
                        pieces.append(delta["content"])
                    if choice.get("finish_reason"):
                        final["finish_reason"] = choice["finish_reason"]
                for key in ("usage", "timings", "model"):
                    if key in chunk:
                        final[key] = chunk[key]
            return cancel.is_set()

        request = {**body, "stream": True, "stream_options": {"include_usage": True}}
        answer = self._server.handle_chat_completions(request, on_chunk)
        if isinstance(answer, dict) and "error" in answer:
            failure.update(answer)
        if failure:
            return failure
        message = {"role": "assistant", "content": "".join(pieces)}
        choice = {"index": 0, "message": message, "finish_reason": final.get("finish_reason")}
        return {"object": "chat.completion", "choices": [choice], **final}

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """One plain-text completion (blocking, llama.cpp's ``/completion`` request body);
        :class:`LLMError` when the engine answers with an error."""
        with self._lock:
            if self._closed:
                raise LLMError(f"model {self.path.name} is closed")
        try:
            reply = self._server.handle_completions({**body, "stream": False})
        except Exception as exc:  # the binding raises RuntimeError/ValueError
            raise LLMError(f"{self.path.name}: {exc}") from None
        if not isinstance(reply, dict) or "error" in reply:
            raise LLMError(f"{self.path.name}: {reply!r:.300}")
        return reply

    def tokenize(self, text: str, timeout: float = 30.0) -> list[int]:
        """``text``'s token ids as the model's own tokenizer writes them (no start token): the
        engine's ``/tokenize`` route on its loopback port, with its key (the binding has no
        call of its own for it). One request, bounded by ``timeout`` seconds; LLMError when
        the engine does not answer with tokens."""
        with self._lock:
            if self._closed:
                raise LLMError(f"model {self.path.name} is closed")
        address = str(self._server.listening_address).rstrip("/")
        if not address.startswith("http"):
            address = f"http://{address}"
        try:
            reply = httpx.post(f"{address}/tokenize", json={"content": text}, timeout=timeout,
                               headers={"Authorization": f"Bearer {self.api_key}"},
                               trust_env=False)  # the loopback port, never through a proxy
            reply.raise_for_status()
            tokens = reply.json()["tokens"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise LLMError(f"{self.path.name}: no tokens for the text: {exc}") from None
        if not (isinstance(tokens, list) and all(isinstance(t, int) for t in tokens)):
            raise LLMError(f"{self.path.name}: no tokens for the text: {tokens!r:.200}")
        return tokens

    def close(self) -> None:
        """Stop every generation (within a token), wait for them, free the model."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for event in self._cancels:
                event.set()
        self._pool.shutdown(wait=True)
        self._server = None

    def submit(self, body: dict[str, Any]) -> tuple[Any, threading.Event]:
        cancel = threading.Event()
        with self._lock:
            if self._closed:
                raise LLMError(f"model {self.path.name} is closed")
            self._cancels.add(cancel)

        def run() -> dict[str, Any]:
            try:
                return self.chat(body, cancel)
            finally:
                with self._lock:
                    self._cancels.discard(cancel)

        return self._pool.submit(run), cancel


class InProcessTransport:
    """The :class:`~drvenus.llm.openai_compat.Transport` of a :class:`LlamaCppServer`."""

    def __init__(self, server: LlamaCppServer, name: str) -> None:
        self.server = server
        self.name = name
        self.where = f"local model {server.path.name}"

    def __repr__(self) -> str:
        return f"InProcessTransport({str(self.server.path)!r})"

    async def request(
        self, method: str, path: str, body: dict[str, Any] | None, timeout: float | None
    ) -> Any:
        if method == "GET" and path == "/models":
            entry = {"id": self.name, "owned_by": "llamacpp", "max_model_len": self.server.window}
            return {"object": "list", "data": [entry]}
        if method != "POST" or path != "/chat/completions" or body is None:
            raise LLMError(f"{self.where}: {method} {path} is not supported in process")
        future, cancel = self.server.submit(body)
        try:
            answer = await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except TimeoutError:
            cancel.set()
            raise LLMError(f"{self.where}: timed out after {timeout:g}s", retryable=True) from None
        except BaseException:  # cancelled (Ctrl-C, a time limit): stop the generation too
            cancel.set()
            raise
        if "error" in answer:
            err = answer["error"] if isinstance(answer["error"], dict) else {}
            code = int(err.get("code") or 500)
            raise status_error(self.where, code, error_detail(answer, "llama.cpp error"))
        return answer

    async def aclose(self) -> None:
        await asyncio.to_thread(self.server.close)


def llamacpp_model(
    path: str | os.PathLike[str],
    *,
    name: str | None = None,
    window: int | None = None,
    parallel: int = 1,
    n_threads: int | None = None,
    grammar_builder: GrammarBuilder | None = None,
    timeout: float = DEFAULT_REQUEST_TIMEOUT,
    extra_body: dict[str, Any] | None = None,
    adapter: str | os.PathLike[str] | None = None,
    kv_cache: str | None = None,
) -> OpenAICompatModel:
    """An :class:`OpenAICompatModel` over a GGUF loaded in this process (see module doc),
    with ``adapter`` (a LoRA adapter GGUF) applied when given and a ``kv_cache`` of that type
    (f16, q8_0, q4_0; None: f16)."""
    server = LlamaCppServer(
        path, window=window, parallel=parallel, n_threads=n_threads, adapter=adapter,
        kv_cache=kv_cache,
    )
    label = name or server.info.name or Path(path).stem
    return OpenAICompatModel(
        model=label,
        transport=InProcessTransport(server, label),
        timeout=timeout,
        grammar_mode="gbnf-field",
        prefilled_think=server.info.prefills_think(),
        grammar_builder=grammar_builder,
        extra_body=extra_body,
    )


__all__ = [
    "X86_REQUIRED_FLAGS",
    "InProcessTransport",
    "check_adapter",
    "check_cpu",
    "missing_cpu_flags",
    "LlamaCppServer",
    "available_memory",
    "choose_window",
    "default_threads",
    "llamacpp_model",
    "usable_cores",
]

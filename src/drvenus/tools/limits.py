"""Per-provider limits: how many requests at once and how many per second.

Every online provider owns one :class:`Limiter`; each request runs inside ``async with
limiter:``. Concurrency is a semaphore; the rate is a token bucket (``rate`` requests per second
on average, bursts up to ``burst``). Retries of failed requests pass through the limiter again,
so backing off never exceeds the provider's quota.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from types import TracebackType


@dataclass(frozen=True)
class Limits:
    """``concurrency``: requests in flight at most; ``rate``: requests per second on average
    (None: unlimited); ``burst``: requests allowed back to back before the rate applies."""

    concurrency: int = 8
    rate: float | None = None
    burst: int = 1

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.rate is not None and self.rate <= 0:
            raise ValueError("rate must be positive")
        if self.burst < 1:
            raise ValueError("burst must be at least 1")


class Limiter:
    """An async context manager that enforces :class:`Limits` for one provider."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self._slots = asyncio.Semaphore(self.limits.concurrency)
        self._tokens = float(self.limits.burst)
        self._stamp = time.monotonic()
        self._bucket = asyncio.Lock()

    async def _take_token(self) -> None:
        rate = self.limits.rate
        if rate is None:
            return
        async with self._bucket:  # waiters are served in order
            while True:
                now = time.monotonic()
                self._tokens = min(self.limits.burst, self._tokens + (now - self._stamp) * rate)
                self._stamp = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                await asyncio.sleep((1 - self._tokens) / rate)

    async def __aenter__(self) -> Limiter:
        await self._slots.acquire()
        try:
            await self._take_token()
        except BaseException:
            self._slots.release()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._slots.release()


__all__ = ["Limiter", "Limits"]

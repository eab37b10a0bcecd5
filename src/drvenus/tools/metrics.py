"""Counters and latency histograms for the tools, rendered in Prometheus' text format.

One :class:`Metrics` object per process-level toolbox (the tool server exposes it at
``/metrics``). Providers report each request with :meth:`Metrics.observe`; the cache reports
hits and misses. Thread-safe; nothing here does I/O.
"""

from __future__ import annotations

import threading
from collections import defaultdict

# Upper bounds (seconds) of the latency histogram buckets.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

Labels = tuple[tuple[str, str], ...]


def _labels(**labels: str) -> Labels:
    return tuple(sorted(labels.items()))


def _fmt(labels: Labels, extra: tuple[tuple[str, str], ...] = ()) -> str:
    items = labels + extra
    if not items:
        return ""
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in items)
    return "{" + body + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Metrics:
    """``observe(tool, provider, outcome, seconds)`` per request; ``cache(tool, hit)`` per cache
    lookup; ``render()`` gives the Prometheus exposition text."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[Labels, int] = defaultdict(int)
        self._cache: dict[Labels, int] = defaultdict(int)
        self._hist: dict[Labels, list[int]] = {}
        self._sum: dict[Labels, float] = defaultdict(float)

    def observe(self, tool: str, provider: str, outcome: str, seconds: float) -> None:
        """One finished request. ``outcome``: ``ok``, ``empty``, ``error``, ``timeout``,
        ``refused`` (a URL the security policy blocks) or ``cached``."""
        key = _labels(tool=tool, provider=provider, outcome=outcome)
        lat = _labels(tool=tool, provider=provider)
        with self._lock:
            self._requests[key] += 1
            counts = self._hist.setdefault(lat, [0] * (len(BUCKETS) + 1))
            for i, bound in enumerate(BUCKETS):
                if seconds <= bound:
                    counts[i] += 1
            counts[-1] += 1
            self._sum[lat] += seconds

    def cache(self, tool: str, hit: bool) -> None:
        with self._lock:
            self._cache[_labels(tool=tool, result="hit" if hit else "miss")] += 1

    def count(self, tool: str, provider: str | None = None, outcome: str | None = None) -> int:
        """Requests observed, optionally only for one provider / outcome (for tests and logs)."""
        with self._lock:
            return sum(
                n
                for labels, n in self._requests.items()
                if dict(labels)["tool"] == tool
                and provider in (None, dict(labels)["provider"])
                and outcome in (None, dict(labels)["outcome"])
            )

    def render(self) -> str:
        lines: list[str] = []
        with self._lock:
            lines += [
                "# HELP drvenus_tool_requests_total Tool provider requests by outcome.",
                "# TYPE drvenus_tool_requests_total counter",
            ]
            for labels, n in sorted(self._requests.items()):
                lines.append(f"drvenus_tool_requests_total{_fmt(labels)} {n}")
            lines += [
                "# HELP drvenus_tool_cache_lookups_total Tool cache lookups by result.",
                "# TYPE drvenus_tool_cache_lookups_total counter",
            ]
            for labels, n in sorted(self._cache.items()):
                lines.append(f"drvenus_tool_cache_lookups_total{_fmt(labels)} {n}")
            lines += [
                "# HELP drvenus_tool_request_seconds Tool provider request latency.",
                "# TYPE drvenus_tool_request_seconds histogram",
            ]
            for labels, counts in sorted(self._hist.items()):
                name = "drvenus_tool_request_seconds"
                for bound, n in zip((*map(str, BUCKETS), "+Inf"), counts, strict=True):
                    lines.append(f"{name}_bucket{_fmt(labels, (('le', bound),))} {n}")
                lines.append(f"{name}_sum{_fmt(labels)} {self._sum[labels]:.6f}")
                lines.append(f"{name}_count{_fmt(labels)} {counts[-1]}")
        return "\n".join(lines) + "\n"


__all__ = ["BUCKETS", "Metrics"]

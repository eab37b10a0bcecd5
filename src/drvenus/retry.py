"""Where the retry policy used to live: it is :mod:`drvenus.net.retry` now (re-exported here for
the modules that still import it from this path)."""

from drvenus.net.retry import (
    Deadline,
    RetryPolicy,
    TransientError,
    parse_retry_after,
    with_retries,
)

__all__ = ["Deadline", "RetryPolicy", "TransientError", "parse_retry_after", "with_retries"]

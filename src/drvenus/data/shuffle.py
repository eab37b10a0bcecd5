"""The row order of ``--shuffle --seed N``, identical to DR-Venus's script (pandas
``DataFrame.sample(frac=1.0, random_state=N)``, i.e. numpy's legacy ``RandomState(N)
.permutation(n)``), without numpy.

numpy's legacy generator is MT19937 seeded with Knuth's ``init_genrand``; Python's ``random``
module runs the same MT19937, so we seed its state directly and draw 32-bit words from it. The
permutation is numpy's Fisher-Yates with masked rejection sampling (``random_interval``).
"""

from __future__ import annotations

import random

_N = 624


def _mt19937_state(seed: int) -> list[int]:
    state = [0] * _N
    s = seed & 0xFFFFFFFF
    for i in range(_N):
        state[i] = s
        s = (1812433253 * (s ^ (s >> 30)) + i + 1) & 0xFFFFFFFF
    return state


def legacy_permutation(n: int, seed: int) -> list[int]:
    """``numpy.random.RandomState(seed).permutation(n)`` as a list (seed in [0, 2**32))."""
    if not 0 <= seed <= 0xFFFFFFFF:
        raise ValueError("seed must be between 0 and 2**32 - 1")
    gen = random.Random()
    gen.setstate((3, (*_mt19937_state(seed), _N), None))
    draw32 = gen.getrandbits
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        mask = i
        mask |= mask >> 1
        mask |= mask >> 2
        mask |= mask >> 4
        mask |= mask >> 8
        mask |= mask >> 16
        if i <= 0xFFFFFFFF:
            j = draw32(32) & mask
            while j > i:
                j = draw32(32) & mask
        else:  # pragma: no cover - more than 4 billion rows
            mask |= mask >> 32
            j = _draw64(draw32) & mask
            while j > i:
                j = _draw64(draw32) & mask
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def _draw64(draw32) -> int:  # pragma: no cover - see above
    return (draw32(32) << 32) | draw32(32)

"""The impact index's numba kernels (:mod:`drvenus.corpus.impact`): accumulate postings, the
k best scores, candidate selection and galloping merges. Imported only when searching, where
numba is installed; compiled once and cached on disk by numba."""

from __future__ import annotations

import numba
import numpy as np

jit = numba.njit(cache=True, nogil=True)


@jit
def accumulate(acc, docs, scores, touched, n):  # type: ignore[no-untyped-def]
    for i in range(docs.shape[0]):
        d = docs[i]
        touched[n] = d  # kept only if d is new (no branch); touched has a spare slot
        n += acc[d] == 0.0
        acc[d] += scores[i]
    return n


@jit
def gather_and_clear(acc, touched, n):  # type: ignore[no-untyped-def]
    sums = np.empty(n, np.float32)
    for i in range(n):
        d = touched[i]
        sums[i] = acc[d]
        acc[d] = 0.0
    return sums


@jit
def worse(s1, d1, s2, d2):  # type: ignore[no-untyped-def]
    return s1 < s2 or (s1 == s2 and d1 > d2)


@jit
def best_k(sums, docs, k):  # type: ignore[no-untyped-def]
    """The k best (score, doc), ties to the lower doc, as a heap whose root (index 0) is
    the k-th best."""
    hs = np.empty(k, np.float32)
    hd = np.empty(k, np.int32)
    m = 0
    for i in range(sums.shape[0]):
        d = docs[i]
        s = sums[i]
        if m < k:
            j = m
            m += 1
            while j > 0:
                parent = (j - 1) >> 1
                if not worse(s, d, hs[parent], hd[parent]):
                    break
                hs[j] = hs[parent]
                hd[j] = hd[parent]
                j = parent
            hs[j] = s
            hd[j] = d
        elif worse(hs[0], hd[0], s, d):
            j = 0
            while True:
                child = 2 * j + 1
                if child >= m:
                    break
                if child + 1 < m and worse(hs[child + 1], hd[child + 1], hs[child], hd[child]):
                    child += 1
                if not worse(hs[child], hd[child], s, d):
                    break
                hs[j] = hs[child]
                hd[j] = hd[child]
                j = child
            hs[j] = s
            hd[j] = d
    return hs[:m], hd[:m]


@jit
def best_k_acc(acc, touched, n, k):  # type: ignore[no-untyped-def]
    sums = np.empty(n, np.float32)
    for i in range(n):
        sums[i] = acc[touched[i]]
    return best_k(sums, touched, k)


@jit
def select(sums, docs, floor):  # type: ignore[no-untyped-def]
    m = 0
    for i in range(sums.shape[0]):
        m += sums[i] >= floor
    out_docs = np.empty(m, np.int32)
    out_sums = np.empty(m, np.float32)
    m = 0
    for i in range(sums.shape[0]):
        if sums[i] >= floor:
            out_docs[m] = docs[i]
            out_sums[m] = sums[i]
            m += 1
    return out_docs, out_sums


@jit
def add_matches(cand, totals, docs, scores):  # type: ignore[no-untyped-def]
    """totals[i] += the score of cand[i] in the postings, if there: both sorted, so each
    search gallops on from where the last one stopped."""
    size = docs.shape[0]
    j = 0
    for i in range(cand.shape[0]):
        d = cand[i]
        if j >= size:
            break
        if docs[j] < d:
            lo = j  # docs[lo] < d
            step = 1
            hi = j + 1
            while hi < size and docs[hi] < d:
                lo = hi
                step <<= 1
                hi = lo + step
            hi = min(hi, size)  # the first doc >= d is in (lo, hi]
            lo += 1
            while lo < hi:
                mid = (lo + hi) >> 1
                if docs[mid] < d:
                    lo = mid + 1
                else:
                    hi = mid
            j = lo
        if j < size and docs[j] == d:
            totals[i] += scores[j]


@jit
def reset(acc, touched, n):  # type: ignore[no-untyped-def]
    for i in range(n):
        acc[touched[i]] = 0.0


__all__ = ["accumulate", "add_matches", "best_k", "best_k_acc", "gather_and_clear", "reset",
           "select"]

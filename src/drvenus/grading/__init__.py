"""Grading: is an answer correct? SQuAD-style exact match and token F1 (:mod:`.match`) and the
LLM judge with its verdict cache (:mod:`.judge`). The one grading library of ``data clean``
(its correctness filter), ``eval`` (under the benchmarks' own graders) and ``rl`` (outcomes)."""

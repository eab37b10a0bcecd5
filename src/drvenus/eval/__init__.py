"""Evaluation: benchmark loaders, judges and scorers, metrics, the runner and reports."""

from drvenus.eval.benchmarks import BENCHMARKS, BenchmarkSpec, EvalItem, load

__all__ = ["BENCHMARKS", "BenchmarkSpec", "EvalItem", "load"]

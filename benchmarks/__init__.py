"""Benchmark and comparison scripts (``python -m benchmarks.<name>``); never part of the test run.

A regular package, not a namespace one: Opacus 1.6.0's wheel installs a top-level ``benchmarks``
package of its own, which would otherwise shadow this folder.
"""

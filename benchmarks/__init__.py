"""Benchmark scripts: `python -m benchmarks.<name>`; results and commands in BENCHMARKS.md."""

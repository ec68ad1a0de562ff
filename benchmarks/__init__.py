"""Benchmark harness (run the scripts directly; see benchmarks/README.md)."""

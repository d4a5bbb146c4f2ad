"""Benchmarks over task kinds: task sets, the interleaved harness, reports and plots."""

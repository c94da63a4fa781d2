"""Benchmarks of cancel-bus against the physical floor: see docs/BENCHMARKS.md."""

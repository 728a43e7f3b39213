"""The Countersign benchmark: `python -m bench.run [--quick]`; results in docs/benchmark.md."""

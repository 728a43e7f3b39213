"""Workflows: deterministic code only (no I/O, clocks or randomness); activities do the I/O."""

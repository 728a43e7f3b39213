"""Commands: dev (filled in by its owner)."""

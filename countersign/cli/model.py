"""Commands: model (filled in by its owner)."""

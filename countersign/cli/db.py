"""Commands: db (filled in by its owner)."""

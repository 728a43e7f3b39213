"""Commands: conversations (filled in by its owner)."""

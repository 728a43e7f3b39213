"""What every email Countersign sends has in common, whichever activity sends it."""

from __future__ import annotations

import hashlib


def message_id(idempotency_key: str, sender: str) -> str:
    """The same Message-ID for every delivery attempt of one sending (a tool call's email, a
    reviewer's notice): a copy sent again after a lost answer is recognizable as the same email."""
    domain = sender.rpartition("@")[2] or "countersign.local"
    return f"<{hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]}@{domain}>"

"""`conversations list`: newest first, and a closed run reads `ended` (issue 41, items 2 and 9: a
cancelled conversation was listed `idle`, and `--all` came in visibility's order)."""

from __future__ import annotations

from typing import Any

from countersign.cli.conversations import as_listed, shown_words


def row(workflow_id: str, started_at: str, state: str, status: str) -> dict[str, Any]:
    return {"workflow_id": workflow_id, "state": state, "status": status, "started_at": started_at}


def test_newest_first_and_a_closed_run_has_ended() -> None:
    listed = as_listed(
        [
            row("conv-acme-000000000001", "2026-11-27T15:40:01+00:00", "idle", "RUNNING"),
            row("conv-acme-000000000003", "2026-11-27T15:40:03+00:00", "idle", "CANCELED"),
            row("conv-acme-000000000002", "2026-11-27T15:40:02+00:00", "awaiting_approval", "RUNNING"),
        ],
        limit=50,
    )
    assert [(r["workflow_id"][-1], r["state"]) for r in listed] == [
        ("3", "ended"),
        ("2", "awaiting_approval"),
        ("1", "idle"),
    ]


def test_the_limit_keeps_the_newest_whatever_order_visibility_returned() -> None:
    """Visibility lists running runs first, then closed ones by close time: `--all --limit 2` must
    still be the two started last, not the first two it returned."""
    returned = [
        row("conv-acme-000000000001", "2026-11-27T15:40:01+00:00", "idle", "RUNNING"),
        row("conv-acme-000000000002", "2026-11-27T15:40:02+00:00", "idle", "RUNNING"),
        row("conv-acme-000000000004", "2026-11-27T15:40:04+00:00", "idle", "COMPLETED"),
        row("conv-acme-000000000003", "2026-11-27T15:40:03+00:00", "idle", "CANCELED"),
    ]
    assert [r["workflow_id"][-1] for r in as_listed(returned, limit=2)] == ["4", "3"]


def test_a_conversations_first_words_end_its_line_on_one_line_and_marked_when_cut() -> None:
    assert shown_words("please qualify\njane") == '"please qualify jane"'
    assert shown_words("x" * 50) == '"' + "x" * 40 + '…"'

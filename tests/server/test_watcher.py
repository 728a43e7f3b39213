"""When the inbox's live stream tells reviewers the pending list changed (countersign.server.watcher),
a plain rule tested without a server."""

from __future__ import annotations

from countersign.server.inbox import Page, PendingItem
from countersign.server.watcher import Feed, covers, listed_differently


def item(call_id: str, nonce: str, approved_by: tuple[str, ...] = ()) -> PendingItem:
    return PendingItem(
        workflow_id="wf-1", call_id=call_id, tool="update_lead_status", args="{}", risk="high",
        requested_by="alice", requested_at="2026-11-27T14:00:00Z", expires_at="2026-11-28T14:00:00Z",
        nonce=nonce, approved_by=list(approved_by),
    )  # fmt: skip


def listing(*items: PendingItem) -> dict[str, PendingItem]:
    return {i.key: i for i in items}


def test_the_same_requests_are_not_news() -> None:
    assert not listed_differently(listing(item("c1", "n1")), listing(item("c1", "n1")))


def test_a_request_that_came_or_went_is_news() -> None:
    assert listed_differently(listing(item("c1", "n1"), item("c2", "n2")), listing(item("c1", "n1")))
    assert listed_differently(listing(), listing(item("c1", "n1")))


def test_a_call_asked_again_is_news_though_its_key_is_the_same() -> None:
    """Issue 34: an approved call whose effect changed before it ran is asked again under the same
    key with a new nonce; a poll that missed the moment in between must still tell the page."""
    assert listed_differently(listing(item("c1", "n2")), listing(item("c1", "n1")))


def test_one_more_approval_of_a_quorum_is_news() -> None:
    """Issue 35: a call that needs two approvers stays pending after the first; the cards must say
    "1 of 2 approved (bob)" (the poll's new listing was dropped when only nonces were compared)."""
    before = listing(item("c1", "n1"))
    assert listed_differently(listing(item("c1", "n1", ("bob",))), before)
    assert not listed_differently(listing(item("c1", "n1", ("bob",))), listing(item("c1", "n1", ("bob",))))


def test_a_shorter_page_of_a_longer_read_counts_what_it_leaves_out() -> None:
    """One poll reads the largest page its streams show; each stream shows its own page of it, and
    what it leaves out is counted with what the poll did not read."""
    feed = Feed()
    feed.read(Page(items=[item(f"c{n}", "n") for n in range(5)], more=7), 5)
    short = feed.shown(2)
    assert [i.call_id for i in short.items] == ["c0", "c1"] and short.more == 3 + 7
    assert feed.shown(5).more == 7 and feed.shown(50).more == 7 and len(feed.shown(None).items) == 5


def test_a_read_covers_a_page_no_longer_than_it() -> None:
    assert covers(None, None) and covers(None, 50) and covers(50, 50) and covers(50, 10)
    assert not covers(50, 51) and not covers(50, None) and not covers(0, 1)

"""What a chat is shown and what comes back from it, without a server (countersign.server.chat_render
and the pure parsing in countersign.server.channels): a card's lines are the same on Telegram and
Slack, a long card is folded with its mark and a link to the whole (never cut silently), nothing in
a call's arguments becomes a Slack mention, the tenant's setting decides which buttons a card has,
and Slack's presses and thread replies are read as such."""

from __future__ import annotations

from typing import Any

from countersign.core.shown import fold_mark
from countersign.server.channels import slack_message
from countersign.server.chat_render import (
    SLACK_SECTION_CHARS,
    card_text,
    may_decide,
    press_of,
    slack_card,
    slack_press,
    telegram_keyboard,
    telegram_press,
)
from countersign.server.inbox import PendingItem

LINK = "https://countersign.example.com/#conv-acme-1/c1"


def item(*lines: str, risk: Any = "high") -> PendingItem:
    return PendingItem(
        workflow_id="conv-acme-1", call_id="c1", tool="send_email", args="{}", risk=risk,
        requested_by="alice", requested_at="", expires_at="", effect_lines=list(lines),
    )  # fmt: skip


def test_a_card_s_lines_are_the_same_on_both_and_a_long_one_is_folded_with_a_link_to_the_whole() -> None:
    long = item("Sends an email to <!channel> jane@example.com", "x" * 5_000)
    text = card_text(long)
    card = slack_card(text, 7, True, LINK)
    section = card["blocks"][0]["text"]
    assert section["type"] == "plain_text" and len(section["text"]) <= 3_000
    assert section["text"].startswith(text[:SLACK_SECTION_CHARS] + fold_mark(len(text) - SLACK_SECTION_CHARS))
    assert section["text"].endswith(f"The whole of it: {LINK}")
    assert "&lt;!channel&gt;" in card["text"] and "<!channel>" not in card["text"]  # no mention
    assert text.startswith("send_email asked by alice (high risk)\nSends an email to <!channel>")


def test_the_buttons_follow_the_tenant_s_setting_and_carry_data_read_back_the_same() -> None:
    assert [b["text"] for b in telegram_keyboard(7, True, LINK)["inline_keyboard"][0]] == [
        "Approve", "Reject", "Open in inbox",
    ]  # fmt: skip
    assert [b["text"] for b in telegram_keyboard(7, False, LINK)["inline_keyboard"][0]] == ["Open in inbox"]
    elements = slack_card("x", 7, True, LINK)["blocks"][1]["elements"]
    assert [press_of(b.get("value")) for b in elements] == [(7, "approve"), (7, "reject"), None]
    assert [b["action_id"] for b in slack_card("x", 7, False, LINK)["blocks"][1]["elements"]] == ["open"]
    assert [may_decide(r, "medium") for r in ("low", "medium", "high")] == [True, True, False]
    assert not any(may_decide(r, "none") for r in ("low", "medium", "high"))
    assert all(may_decide(r, "high") for r in ("low", "medium", "high"))
    for junk in (None, 7, "cs:7", "cs:x:a", "xx:7:a", "cs:7:z", "cs:" + "9" * 19 + ":a"):
        assert press_of(junk) is None


def test_slack_presses_and_thread_replies_are_read_as_such() -> None:
    pressed = {"type": "block_actions", "user": {"id": "UBOB"}, "actions": [{"value": "cs:12:r"}],
               "container": {"channel_id": "CREVIEW", "message_ts": "1.2"}}  # fmt: skip
    press = slack_press(pressed)
    assert press is not None and (press.sender, press.card, press.decision) == ("UBOB", 12, "reject")
    assert (press.chat, press.message_id, press.query_id) == ("CREVIEW", "1.2", None)
    opened = {**pressed, "actions": [{"action_id": "open", "url": LINK}]}
    junk: list[Any] = [
        None,
        [],
        {"type": "view_submission"},
        {**pressed, "actions": []},
        {**pressed, "user": "U"},
    ]
    for payload in [*junk, opened]:
        assert slack_press(payload) is None
    assert telegram_press({"callback_query": {"id": "q", "from": {"id": 7}, "data": "cs:12:a"}}) is not None

    said = {"type": "message", "user": "UALICE", "channel": "C1", "text": "hi", "ts": "5.0"}
    first = slack_message({"event_id": "Ev1", "event": said})
    assert first is not None and (first.thread, first.reply_to) == ("5.0", None)
    reply = slack_message({"event_id": "Ev2", "event": {**said, "ts": "6.0", "thread_ts": "5.0"}})
    assert reply is not None and (reply.thread, reply.reply_to) == ("5.0", "5.0")

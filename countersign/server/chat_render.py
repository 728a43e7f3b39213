"""What a chat is shown, as Telegram and Slack take it (pure): replies, review cards with their
buttons, decided cards, and the presses that come back (read without raising on outside data).

A card is the same lines on both (`card_text`: the call, who asked, its risk, the effect's lines as
the inbox card shows them, its warnings), folded with a visible mark and a link to the whole
(`chat_text`, countersign.core.shown) wherever one message would cut it; only the wrapping differs:
Telegram's `inline_keyboard` of `callback_data` buttons, Slack's Block Kit `section` (plain text,
so nothing in a call's arguments becomes a mention or a link) and `actions` block. Both buttons
carry the same data, `cs:<card>:<a|r>`, parsed back by `press_of`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from countersign.core.shown import fold
from countersign.server.inbox import PendingItem
from tools.chat import slack_escaped

CARD_PREFIX = "cs"
# Characters of a reply posted as one chat message (Telegram takes 4,096): a longer one is folded,
# its mark and the link to the whole after it.
REPLY_CHARS = 3_800
SLACK_SECTION_CHARS = 2_900  # a Block Kit section's text takes 3,000
RISK_ORDER = ("low", "medium", "high")
Decision = Literal["approve", "reject"]
PRESSES: dict[str, Decision] = {"a": "approve", "r": "reject"}


def chat_text(text: str, whole_at: str, limit: int = REPLY_CHARS) -> str:
    """`text` as one chat message (a reply, a card, a decided card): a long one folded with its
    visible mark (countersign.core.shown) and where the whole of it is (`whole_at`: the chat page,
    the card in the inbox), never cut silently."""
    shown, rest = fold(text, limit)
    return f"{shown}\nThe whole of it: {whole_at}" if rest else shown


def card_text(item: PendingItem) -> str:
    """A card: the call, who asked, its risk, and the effect's lines (the arguments' when the tool
    resolved no effect); posted through `chat_text`, which folds it past one message's length."""
    lines = item.effect_lines or item.arg_lines
    return "\n".join([f"{item.tool} asked by {item.requested_by} ({item.risk} risk)", *lines, *item.warnings])


def decided_text(item: PendingItem | None, state: str) -> str:
    """A card once decided: its lines, then who decided and what became of the call."""
    return (card_text(item) + "\n\n" if item is not None else "") + state


def may_decide(risk: str, up_to: str) -> bool:
    """Whether a press in the chat decides a call of `risk`, under the tenant's setting `up_to`
    ("none", or the highest risk the chat decides)."""
    return up_to in RISK_ORDER and risk in RISK_ORDER and RISK_ORDER.index(risk) <= RISK_ORDER.index(up_to)


def press_data(card: int, decision: Decision) -> str:
    return f"{CARD_PREFIX}:{card}:{decision[0]}"


def press_of(data: Any) -> tuple[int, Decision] | None:
    """(card, decision) of a button's data `cs:<card>:<a|r>`, or None for anything else."""
    if not isinstance(data, str):
        return None
    prefix, _, rest = data.partition(":")
    card, _, decision = rest.partition(":")
    if prefix != CARD_PREFIX or not (card.isascii() and card.isdigit()) or len(card) > 18:
        return None
    return (int(card), PRESSES[decision]) if decision in PRESSES else None


def telegram_keyboard(card: int, decides: bool, link: str) -> dict[str, Any]:
    """Approve and Reject (when the chat may decide the call), and Open in inbox."""
    row: list[dict[str, str]] = []
    if decides:
        row += [{"text": "Approve", "callback_data": press_data(card, "approve")},
                {"text": "Reject", "callback_data": press_data(card, "reject")}]  # fmt: skip
    row.append({"text": "Open in inbox", "url": link})
    return {"inline_keyboard": [row]}


def slack_section(text: str, whole_at: str) -> dict[str, Any]:
    shown = chat_text(text, whole_at, SLACK_SECTION_CHARS)
    return {"type": "section", "text": {"type": "plain_text", "text": shown, "emoji": False}}


def slack_button(label: str, **fields: str) -> dict[str, Any]:
    return {"type": "button", "text": {"type": "plain_text", "text": label}, **fields}


def slack_card(text: str, card: int, decides: bool, link: str) -> dict[str, Any]:
    """A card as `chat.postMessage` takes it (its `channel` aside): the lines in a section, and
    the buttons Approve, Reject (when the chat may decide the call) and Open in inbox."""
    buttons = [
        slack_button("Approve", action_id="approve", style="primary", value=press_data(card, "approve")),
        slack_button("Reject", action_id="reject", style="danger", value=press_data(card, "reject")),
    ]
    buttons = buttons if decides else []
    buttons.append(slack_button("Open in inbox", action_id="open", url=link))  # fmt: skip
    return {
        "text": slack_escaped(chat_text(text, link)),
        "blocks": [slack_section(text, link), {"type": "actions", "elements": buttons}],
    }


def slack_decided(text: str, link: str) -> dict[str, Any]:
    """A decided card as `chat.update` takes it: its lines and the decision, no buttons left."""
    return {"text": slack_escaped(chat_text(text, link)), "blocks": [slack_section(text, link)]}


# --- the presses that come back ------------------------------------------------------------------


def as_id(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | str) or value == "":
        return None
    return str(value)


@dataclass(frozen=True)
class Press:
    """A button pressed on a card: who pressed it, which card, approve or reject, and where the
    card's message is (to edit it once decided); `query_id`: Telegram's callback query, answered
    to show the presser what came of it (Slack's presser is told in an ephemeral message)."""

    query_id: str | None
    sender: str
    card: int
    decision: Decision
    chat: str | None
    message_id: str | None


def telegram_press(update: Any) -> Press | None:
    """The `callback_query` of a card's button (`cs:<card>:<a|r>`), or None."""
    query = update.get("callback_query") if isinstance(update, dict) else None
    if not isinstance(query, dict):
        return None
    pressed = press_of(query.get("data"))
    sender = as_id((query.get("from") or {}).get("id")) if isinstance(query.get("from"), dict) else None
    query_id = as_id(query.get("id"))
    if pressed is None or sender is None or query_id is None:
        return None
    message = query.get("message")
    message = message if isinstance(message, dict) else {}
    chat = as_id((message.get("chat") or {}).get("id")) if isinstance(message.get("chat"), dict) else None
    return Press(query_id, sender, *pressed, chat, as_id(message.get("message_id")))


def slack_press(payload: Any) -> Press | None:
    """The button of a Slack `block_actions` payload (its value `cs:<card>:<a|r>`), or None (the
    "Open in inbox" link button, anything else)."""
    if not isinstance(payload, dict) or payload.get("type") != "block_actions":
        return None
    actions, user, container = payload.get("actions"), payload.get("user"), payload.get("container")
    if not isinstance(actions, list) or not actions or not isinstance(actions[0], dict):
        return None
    pressed = press_of(actions[0].get("value"))
    sender = as_id(user.get("id")) if isinstance(user, dict) else None
    if pressed is None or sender is None:
        return None
    container = container if isinstance(container, dict) else {}
    return Press(
        None, sender, *pressed, as_id(container.get("channel_id")), as_id(container.get("message_ts"))
    )

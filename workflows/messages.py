"""MessageStore: the conversation's messages, kept in PostgreSQL, known to the workflow by envelope.

Every message gets a sequence number; its body goes to the conversation store (a local activity,
`append_messages`, whose input is not recorded in history) and workflow history keeps only its
envelope (role, tokens, call ids) in the cursor. Tool results are stored by the activities that
produce them, at sequence numbers allocated here when the model asks for the calls. The cursor is
what continue-as-new carries: the next sequence number, the window, the running summary, and the
message ids already answered (a redelivered message is answered once).
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from countersign.core.activity_refs import APPEND_MESSAGES, LOAD_TURN_REPLY, SUMMARIZE_CONVERSATION
    from countersign.core.calls import StoredResult
    from countersign.core.contract import SubmitMessage, TurnResult
    from countersign.core.envelopes import (
        PROMPT_SEQ,
        AppendMessages,
        Cursor,
        Envelope,
        RepliedTurn,
        StoredMessage,
        SummaryRequest,
        message_envelope,
        remember_answer,
        select_window,
        stored_envelope,
    )
    from countersign.core.messages import ChatMessage, ToolCall, Usage

from workflows.conversation import Conversation
from workflows.options import (
    BOOKKEEPING_TIMEOUT,
    DB_OUTAGE_TOLERANCE,
    DB_RETRY,
    HEARTBEAT_TIMEOUT,
    MODEL_CALL_TIMEOUT,
    MODEL_RETRY,
    bookkeeping,
    execute,
    execute_local,
)

# Replies (and refusals) `wait_reply` answers from memory, by message id: the most recent ones.
REPLIES_KEPT = 100
# The `transcript` query answers the prompt and this many latest messages of the run: a bounded
# view for the UI and tests; the store has the whole conversation.
TRANSCRIPT_KEPT = 200


def keep_latest(kept: dict[str, Any], limit: int) -> None:
    """Forget the oldest entries of an insertion-ordered dict beyond `limit`."""
    while len(kept) > limit:
        del kept[next(iter(kept))]


class MessageStore:
    def __init__(self, conversation: Conversation) -> None:
        carried = conversation.start.carried
        self.conversation = conversation
        self.cursor = carried.cursor if carried and carried.cursor else Cursor(next_seq=PROMPT_SEQ + 1)
        self.transcript: list[ChatMessage] = []  # this run's latest messages, for the query
        self.replies: dict[str, TurnResult] = {}  # by message id, the most recent REPLIES_KEPT
        self.refused: dict[str, str] = {}  # message id -> why it was refused

    # --- storing messages ---------------------------------------------------------------------

    def next_seq(self) -> int:
        self.cursor.next_seq += 1
        return self.cursor.next_seq - 1

    def record(self, message: ChatMessage, error: str | None = None, seq: int | None = None) -> StoredMessage:
        """Give `message` the next sequence number (or `seq`, allocated by `next_seq` earlier) and
        keep its envelope (the body goes to the store through `append`, and to the transcript)."""
        seq = self.next_seq() if seq is None else seq
        self.cursor.recent.append(message_envelope(seq, message, error))
        self._keep_in_transcript(message)
        return StoredMessage(seq=seq, message=message)

    def _keep_in_transcript(self, message: ChatMessage) -> None:
        """Add `message` to the transcript's latest TRANSCRIPT_KEPT (after the prompt)."""
        self.transcript.append(message)
        prompt = 1 if self.transcript[0].role == "system" else 0
        del self.transcript[prompt : max(prompt, len(self.transcript) - TRANSCRIPT_KEPT)]

    async def append(self, messages: list[StoredMessage]) -> list[int]:
        """Store `messages`; the seqs refused as redelivered messages. A local activity: its input
        (the bodies) is not recorded in history, only its small result."""
        assert self.conversation.context is not None  # loaded before anything is stored
        batch = AppendMessages.at(self.conversation.ref(), messages=messages)
        return await execute_local(
            APPEND_MESSAGES,
            batch,
            start_to_close_timeout=BOOKKEEPING_TIMEOUT,
            schedule_to_close_timeout=DB_OUTAGE_TOLERANCE,
            retry_policy=DB_RETRY,
            summary=f"store {len(messages)} message(s) from seq {messages[0].seq}" if messages else "store",
        )

    async def note(self, message: ChatMessage) -> None:
        """Store one message the workflow itself writes (a turn's stop, a rollback's report)."""
        await self.append([self.record(message)])

    async def store_prompt(self, prompt: str) -> None:
        """Today's system prompt, at PROMPT_SEQ: each run stores it again (an agent's prompt may change)."""
        message = ChatMessage(role="system", content=prompt)
        self.transcript.insert(0, message)
        await self.append([StoredMessage(seq=PROMPT_SEQ, message=message)])

    async def accept(self, message: SubmitMessage) -> bool:
        """Store the user's message; False for a redelivered one (its id is stored already)."""
        stored = self.record(ChatMessage(role="user", content=message.text, name=message.user_id))
        stored.message_id = message.message_id
        if await self.append([stored]):
            self.cursor.recent.pop()
            self.transcript.pop()
            workflow.logger.warning("message %s was delivered before: answered once", message.message_id)
            return False
        return True

    def keep_results(self, calls: list[ToolCall], results: list[StoredResult]) -> None:
        """Keep the envelopes of a batch's results (stored by their activities), in call order."""
        for call, result in zip(calls, results, strict=True):
            self.cursor.recent.append(stored_envelope(result))
            stub = ChatMessage(role="tool", tool_call_id=call.id, name=call.name, content=result.stub())
            self._keep_in_transcript(stub)

    # --- the model's context window -----------------------------------------------------------

    async def model_seqs(self) -> list[int]:
        """The sequence numbers the next model call sends: prompt, summary, then the window. What
        falls out of the window is folded into the running summary when the policy asks for one."""
        assert self.conversation.context is not None
        cursor, policy = self.cursor, self.conversation.context.policy
        kept = select_window(cursor.recent, policy)
        if len(kept) < len(cursor.recent) and policy.summarize:
            kept = select_window(cursor.recent, policy, fold=True)
        dropped = cursor.recent[: len(cursor.recent) - len(kept)]
        cursor.recent = kept
        if dropped and policy.summarize:
            await self._summarize(dropped)
        summary = [cursor.summary_seq] if cursor.summary_seq is not None else []
        return [PROMPT_SEQ, *summary, *(e.seq for e in kept)]

    async def _summarize(self, dropped: list[Envelope]) -> None:
        context = self.conversation.context
        assert context is not None
        seq = self.next_seq()
        request = SummaryRequest.at(
            self.conversation.ref(),
            seq=seq,
            previous=self.cursor.summary_seq,
            seqs=[e.seq for e in dropped],
            agent=context.agent.name,
        )
        try:
            done = await execute(
                SUMMARIZE_CONVERSATION,
                request,
                start_to_close_timeout=MODEL_CALL_TIMEOUT,
                retry_policy=MODEL_RETRY,
                heartbeat_timeout=HEARTBEAT_TIMEOUT,
                summary=f"summarize {len(dropped)} message(s) leaving the window",
            )
        except ActivityError as err:  # the window still holds; only the summary of these is missing
            workflow.logger.error("summary of seqs %s failed: %s", request.seqs, err.cause or err)
            return
        self.cursor.summary_seq = seq
        self.conversation.usage = self.conversation.usage.plus(done.usage)

    # --- replies, for `wait_reply` --------------------------------------------------------------

    def replied(self, message_id: str, result: TurnResult) -> None:
        self.replies[message_id] = result
        remember_answer(self.cursor.answered, message_id, result.turn)
        keep_latest(self.replies, REPLIES_KEPT)

    def refuse(self, message_id: str, why: str) -> None:
        """Remember why a message was refused: its sender may be waiting for the reply."""
        self.refused[message_id] = why
        keep_latest(self.refused, REPLIES_KEPT)

    def settled(self, message_id: str) -> bool:
        """Whether the message was answered (in this run or an earlier one) or refused."""
        return message_id in self.replies or message_id in self.cursor.answered or message_id in self.refused

    async def reply_to(self, message_id: str) -> TurnResult | None:
        """The turn that replied to a settled message; read from the store when an earlier run answered."""
        if message_id not in self.replies and message_id in self.cursor.answered:
            return await self._earlier_reply(message_id, self.cursor.answered[message_id])
        return self.replies.get(message_id)

    async def _earlier_reply(self, message_id: str, turn: int) -> TurnResult:
        """The turn an earlier run answered `message_id` with, read from the conversation store once
        per run (then kept with this run's replies)."""
        replied = RepliedTurn(
            workflow_id=self.conversation.workflow_id,
            conversation_id=self.conversation.conversation_id,
            message_id=message_id,
            turn=turn,
        )
        try:
            result = await bookkeeping(LOAD_TURN_REPLY, replied, f"load the reply to message {message_id}")
        except ActivityError as err:  # the store stayed out of reach: the turn, without its text
            workflow.logger.error("reply to %s not loaded: %s", message_id, err.cause or err)
            return TurnResult(turn=turn, reply=None, stop="completed", usage=Usage())
        if message_id not in self.replies:
            self.replies[message_id] = result
            keep_latest(self.replies, REPLIES_KEPT)
        return result

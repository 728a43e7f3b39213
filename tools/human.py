"""ask_human: the model asks the conversation's user a question and waits for the answer.

The workflow answers this tool itself (it waits for the `answer` signal, with a timer); the
declaration here gives it a schema, a validation model and a place in agents' permissions.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from tools.registry import ToolArgs, ToolContext, ToolFailure, tool


class AskHumanArgs(ToolArgs):
    question: str = Field(
        min_length=1, max_length=2000, description="The question, as the user should read it"
    )


class HumanAnswer(BaseModel):
    answer: str


@tool(risk="low", category="read")
async def ask_human(ctx: ToolContext, args: AskHumanArgs) -> HumanAnswer:
    """Ask the user a question and wait for their answer. Use it for information only the user has,
    or to confirm an intention before acting on it."""
    raise ToolFailure("INTERNAL_ERROR", "ask_human is answered by the user through the conversation")

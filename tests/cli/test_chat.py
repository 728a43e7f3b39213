"""`starter.py chat` as a person uses it: a subprocess on a pipe, against the real dev server, an
in-process worker on its own task queue, PostgreSQL and the scripted model over HTTP."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import pytest

from countersign.cli.stack_client import query_status
from countersign.core.approvals import Approval, Decision
from countersign.runtime.config import PROJECT_ROOT
from tests.fixtures.agent import AgentHarness
from tests.fixtures.offer import HIDDEN, MARK, SEND, TARGET

pytestmark = pytest.mark.devserver

STEP_TIMEOUT_S = 20
FINISH_TIMEOUT_S = 40  # a whole turn, then the chat's exit, on a machine shared with other test workers
QUALIFY = (
    {
        "when": {"user_contains": "qualify"},
        "reply": {
            "content": "I'll mark Jane Doe as qualified; that needs a reviewer's approval.",
            "tool_calls": [
                {
                    "name": "update_lead_status",
                    "arguments": {
                        "lead": "jane.doe@example.com",
                        "new_status": "qualified",
                        "reason": "Budget confirmed",
                    },
                }
            ],
        },
    },
    {"when": {"after_tool": "update_lead_status"}, "reply": {"content": "Done: Jane Doe is qualified."}},
)


class ChatProcess:
    """`python starter.py chat …` on pipes: write lines, read output until something appears."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.output = ""

    @classmethod
    async def start(cls, harness: AgentHarness, data_dir: Path, *args: str) -> ChatProcess:
        env = harness.cli_env(data_dir)
        process = await asyncio.create_subprocess_exec(
            sys.executable, "starter.py", "chat", *args,
            cwd=PROJECT_ROOT, env=env,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        return cls(process)

    def send(self, *lines: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("".join(f"{line}\n" for line in lines).encode())

    async def until(self, pattern: str) -> re.Match[str]:
        """Read output until `pattern` matches in it."""
        assert self.process.stdout is not None
        async with asyncio.timeout(STEP_TIMEOUT_S):
            while not (found := re.search(pattern, self.output)):
                chunk = await self.process.stdout.read(4096)
                assert chunk, f"chat exited before {pattern!r} appeared:\n{self.output}"
                self.output += chunk.decode()
        return found

    async def finish(self, *lines: str) -> str:
        """Send the last lines, close stdin and return everything the chat printed."""
        self.send(*lines)
        try:
            out, _ = await asyncio.wait_for(self.process.communicate(), FINISH_TIMEOUT_S)
        except TimeoutError:  # say what the chat had printed, not only that it did not end
            self.process.kill()
            assert self.process.stdout is not None
            self.output += (await self.process.stdout.read()).decode()
            raise AssertionError(f"chat did not end in {FINISH_TIMEOUT_S} s:\n{self.output}") from None
        self.output += out.decode()
        assert self.process.returncode == 0, self.output
        return self.output


async def test_chat_shows_tool_calls_results_and_reply(dev_agent: AgentHarness, tmp_path: Path) -> None:
    dev_agent.script(
        {
            "when": {"user_contains": "jane"},
            "reply": {"tool_calls": [{"name": "search_leads", "arguments": {"query": "Jane Doe"}}]},
        },
        {"when": {"after_tool": "search_leads"}, "reply": {"content": "Jane Doe is a new lead."}},
    )
    chat = await ChatProcess.start(
        dev_agent, tmp_path, "--tenant", "acme", "--user", "alice", "--agent", "lead-qualifier"
    )
    output = await chat.finish("Find Jane Doe", "/status", "/quit")

    assert "[scripted model]" in output
    assert '→ search_leads({"query": "Jane Doe"}) [c1]' in output
    assert "← search_leads [c1] ok:" in output and "jane.doe@example.com" in output
    assert "agent> [scripted model] Jane Doe is a new lead." in output
    assert "(2 model calls, 1 tool call," in output
    workflow_id = re.search(r"conversation (conv-acme-\w+)", output)
    assert workflow_id and f"{workflow_id[1]}: idle · turn 1" in output  # /status
    assert f"chat --workflow {workflow_id[1]}" in output  # /quit leaves it running


async def test_the_requester_gets_no_prompt_and_sees_who_approved_elsewhere(
    dev_agent: AgentHarness, tmp_path: Path
) -> None:
    """Bob (a reviewer) asked for a high-risk call: the workflow would refuse his approval (four
    eyes), so his chat offers no prompt; it says who may decide, and shows Carol's decision."""
    dev_agent.script(*QUALIFY)
    chat = await ChatProcess.start(
        dev_agent, tmp_path, "--tenant", "acme", "--user", "bob", "--agent", "lead-qualifier"
    )
    chat.send("Please qualify Jane Doe")
    workflow_id = (await chat.until(r"conversation (conv-acme-\w+)"))[1]
    await chat.until(r"waiting for a decision: .*\n")
    assert "reviewer other than bob" in chat.output
    assert "approve c1 as bob?" not in chat.output

    decision = Decision(call_id="c1", decision="approve", approver="carol", reason="checked")
    approval = await dev_agent.client.get_workflow_handle(workflow_id).execute_update(
        "decide", decision, result_type=Approval
    )
    assert approval.decided_by == "carol"
    await chat.until(r"agent> \[scripted model\] Done: Jane Doe is qualified\.")
    output = await chat.finish("/quit")
    # In order: the call, its pending approval, who decided, then the result it let through.
    order = [
        "→ update_lead_status",
        "⏸ c1",
        "✓ approved c1: update_lead_status by carol",
        "    carol approved it (reason: checked)",  # why, as the requester reads it (issue 41)
        "← update_lead_status [c1]",
    ]
    positions = [output.index(text) for text in order]
    assert positions == sorted(positions), output


async def test_reattach_answers_a_question_inline_and_ends(dev_agent: AgentHarness, tmp_path: Path) -> None:
    dev_agent.script(
        {
            "when": {"user_contains": "email"},
            "reply": {"tool_calls": [{"name": "ask_human", "arguments": {"question": "Which Jane?"}}]},
        },
        {
            "when": {"after_tool": "ask_human", "result_contains": "doe"},
            "reply": {"content": "Jane Doe it is."},
        },
    )
    handle = await dev_agent.start("Email Jane")  # started elsewhere; the chat re-attaches
    async with asyncio.timeout(STEP_TIMEOUT_S):
        while (await query_status(handle)).state != "awaiting_answer":  # noqa: ASYNC110  (queries only)
            await asyncio.sleep(0.1)

    chat = await ChatProcess.start(dev_agent, tmp_path, "--workflow", handle.id)
    output = await chat.finish("Jane Doe", "/end")

    assert "alice> Email Jane" in output  # the transcript so far
    assert "? c1 the agent asks: Which Jane?" in output
    assert "agent> [scripted model] Jane Doe it is." in output
    assert f"ended conversation {handle.id}" in output
    assert (await handle.result()).ended_by == "end by alice"


async def test_chat_shows_the_reply_as_it_streams(dev_agent: AgentHarness, tmp_path: Path) -> None:
    """The text arrives a few words at a time (the conversation's events, not a poll of the
    transcript): part of it is on screen while the rest is still being written."""
    dev_agent.script({"reply": {"content": "one two three four five six seven eight nine ten"}})
    dev_agent.model.chunk_delay_s = 0.3
    chat = await ChatProcess.start(
        dev_agent, tmp_path, "--tenant", "acme", "--user", "alice", "--agent", "lead-qualifier"
    )
    chat.send("count for me")
    await chat.until(r"agent> \[scripted model\] one two")
    assert "ten" not in chat.output.split("agent> ")[-1], chat.output
    output = await chat.finish("/quit")
    assert "agent> [scripted model] one two three four five six seven eight nine ten\n" in output
    assert output.count("one two three") == 1, "streamed once, not printed again from the transcript"


async def test_a_waiting_call_shows_what_it_will_do_folded_with_how_to_see_all(
    dev_agent: AgentHarness, tmp_path: Path
) -> None:
    """Under a call that waits, the chat prints its effect as the card shows it (issue 48 items 2
    and 3): the email's HTML as its reader sees it (the link's real target, the hidden small print)
    and the long body line folded with its mark, then the command that prints it whole."""
    dev_agent.script(
        {"when": {"user_contains": "offer"}, "reply": {"tool_calls": [SEND]}},
        {"when": {"after_tool": "send_email"}, "reply": {"content": "done"}},
    )
    chat = await ChatProcess.start(
        dev_agent, tmp_path, "--tenant", "acme", "--user", "alice", "--agent", "lead-qualifier"
    )
    chat.send("send the offer")
    workflow_id = (await chat.until(r"conversation (conv-acme-\w+)"))[1]
    await chat.until(r"waiting for a decision: .*\n")
    decision = Decision(call_id="c1", decision="reject", approver="bob", reason="seen")
    await dev_agent.client.get_workflow_handle(workflow_id).execute_update(
        "decide", decision, result_type=Approval
    )
    await chat.until(r"agent> \[scripted model\] done")
    output = await chat.finish("/quit")
    order = [
        "⏸ c1 send_email",
        "    Email to partner@example.org: “Our offer”",
        f"{MARK}\n",
        f"      Please confirm at {TARGET}.",
        f"      {HIDDEN}",
        f"    folded lines: `approvals show {workflow_id} c1` prints them whole",
    ]
    positions = [output.index(text) for text in order]
    assert positions == sorted(positions), output

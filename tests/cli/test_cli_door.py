"""The CLI through the front door in signed mode, as subprocesses against the real dev server,
worker, server and PostgreSQL: `login` serves requesters and reviewers; start, send, answer,
rollback and end go through the server with the session, and status, transcript and audit read
through it; `tokens` creates, lists and revokes API tokens."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import aiohttp
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.runtime.config import PROJECT_ROOT
from tests.cli.test_chat import QUALIFY, ChatProcess
from tests.cli.test_inbox_cli import starter
from tests.fixtures.approvals import ECHO_RESULT, qualify
from tests.fixtures.inbox import SignedStack

pytestmark = pytest.mark.devserver

HELLO = {"when": {"user_contains": "hello"}, "reply": {"content": "hi there"}}


async def test_the_cli_works_end_to_end_through_the_server_in_signed_mode(
    signed_dev_agent: SignedStack, db_engine: AsyncEngine, tmp_path: Path, jane_is_new: None
) -> None:
    stack = signed_dev_agent
    stack.agent.script(qualify(), ECHO_RESULT, HELLO)
    env = {
        **stack.agent.cli_env(tmp_path),
        "COUNTERSIGN_AUTH": "signed",
        "COUNTERSIGN_SESSION_FILE": str(tmp_path / "session.json"),
        # the CLI needs no Temporal in signed mode: an address that answers nothing proves it
        "TEMPORAL_ADDRESS": "127.0.0.1:1",
    }

    async def cli(*args: str, code: int = 0) -> str:
        done = await starter(env, *args)
        assert done.returncode == code, f"{args}: {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    async def login(user: str) -> None:
        await cli(
            "login", "--tenant", "acme", "--as", user, "--password", f"{user}-dev", "--inbox", stack.url
        )

    await login("alice")
    out = await cli(
        "start", "--tenant", "acme", "--user", "alice", "--agent", "lead-qualifier",
        "--message", "qualify jane", "--wait", code=3,
    )  # fmt: skip
    workflow_id = out.splitlines()[0]
    stack.agent.track(workflow_id)
    assert "waiting for approval: c1 update_lead_status" in out
    wrong = await starter(
        env, "start", "--tenant", "acme", "--user", "bob", "--agent", "lead-qualifier", "--message", "x"
    )
    assert wrong.returncode != 0 and "logged in as alice" in wrong.stderr

    await login("bob")
    approved = await cli("approve", workflow_id, "c1", "--as", "bob")
    assert "approved c1: update_lead_status by bob (proven)" in approved

    await login("alice")
    reply = await cli("send", workflow_id, "hello", "--user", "alice")
    assert "hi there" in reply
    status = json.loads(await cli("status", workflow_id, "--json"))
    assert (status["state"], status["user_id"]) == ("idle", "alice")
    transcript = await cli("transcript", workflow_id)
    assert "alice> qualify jane" in transcript and "alice> hello" in transcript
    audit = json.loads(await cli("audit", "--workflow", workflow_id, "--json"))
    assert [(r["tool"], r["outcome"], r["approved_by"], r["requested_by"]) for r in audit] == [
        ("update_lead_status", "executed", "bob", "alice")
    ]
    assert audit[0]["decision_proven"] is True
    rolled = await cli("rollback", workflow_id, "--as", "alice", "--scope", "conversation")
    assert "sent" in rolled
    ended = await cli("end", workflow_id, "--as", "alice")
    assert "ended conversation" in ended or "ending" in ended


async def test_tokens_are_created_once_listed_without_secrets_and_revoked(
    signed_dev_agent: SignedStack, tmp_path: Path
) -> None:
    stack = signed_dev_agent
    env = stack.agent.cli_env(tmp_path)

    async def cli(*args: str, code: int = 0) -> tuple[str, str]:
        done = await starter(env, *args)
        assert done.returncode == code, f"{args}: {done.stdout}\n{done.stderr}"
        return done.stdout, done.stderr

    secret, note = await cli(
        "tokens", "create", "--tenant", "globex", "--name", "cli-bot", "--act-as", "dave"
    )
    secret = secret.strip()
    assert secret.startswith("cst_") and "only time" in note
    _, refused = await cli(
        "tokens", "create", "--tenant", "globex", "--name", "x", "--act-as", "alice", code=1
    )
    assert "no user alice" in refused
    listed = json.loads((await cli("tokens", "list", "--tenant", "globex", "--json"))[0])
    assert [(t["name"], t["act_as"], t["revoked_at"]) for t in listed] == [("cli-bot", ["dave"], None)]
    assert secret not in json.dumps(listed)

    async def status_with_token() -> int:
        async with (
            aiohttp.ClientSession() as http,
            http.get(
                stack.url + "/api/conversations/conv-globex-none",
                headers={"Authorization": f"Bearer {secret}"},
            ) as response,
        ):
            return response.status

    assert await status_with_token() == 404  # accepted as a caller; no such conversation
    assert "revoked token cli-bot (globex)" in (await cli("tokens", "revoke", "cli-bot"))[0]
    assert await status_with_token() == 401


async def test_chat_goes_through_the_server_in_signed_mode(
    signed_dev_agent: SignedStack, tmp_path: Path, jane_is_new: None
) -> None:
    stack = signed_dev_agent
    stack.agent.script(*QUALIFY)
    env = {
        **stack.agent.cli_env(tmp_path),
        "COUNTERSIGN_AUTH": "signed",
        "COUNTERSIGN_SESSION_FILE": str(tmp_path / "session.json"),
        "TEMPORAL_ADDRESS": "127.0.0.1:1",  # the chat needs no Temporal in signed mode
    }
    login = await starter(
        env, "login", "--tenant", "acme", "--as", "alice", "--password", "alice-dev", "--inbox", stack.url
    )
    assert login.returncode == 0, login.stderr
    process = await asyncio.create_subprocess_exec(
        sys.executable, "starter.py", "chat",
        "--tenant", "acme", "--user", "alice", "--agent", "lead-qualifier",
        cwd=PROJECT_ROOT, env=env,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    chat = ChatProcess(process)
    chat.send("Please qualify Jane Doe")
    workflow_id = (await chat.until(r"conversation (conv-acme-\w+)"))[1]
    stack.agent.track(workflow_id)
    await chat.until(r"waiting for a decision: .*\n")  # alice (sales) may not approve her high-risk call
    bob = await stack.login("bob")
    code, body = await stack.call("POST", f"/api/approvals/{workflow_id}/c1", bob, {"decision": "approve"})
    assert code == 200, body
    await chat.until(r"agent> .*Done: Jane Doe is qualified\.")
    output = await chat.finish("/status", "/end")
    assert "✓ approved c1: update_lead_status by bob" in output
    assert f"{workflow_id}: idle" in output and f"ended conversation {workflow_id}" in output
    await stack.agent.client.get_workflow_handle(workflow_id).result()  # ended by /end, with its proof

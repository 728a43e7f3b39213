"""The Temporal Web UI shows a conversation the way operators look for it: the static summary
("acme/alice → lead-qualifier: …") on the workflow page, the search attributes to filter by, and
the current details naming the pending approval. Rendered by headless Chromium, not assumed."""

from __future__ import annotations

import asyncio
import html
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from temporalio.api.sdk.v1 import WorkflowMetadata

from countersign.cli.stack_client import query_status
from countersign.client.handles import start_conversation, static_summary
from countersign.core.approvals import Approval, Decision
from countersign.core.contract import StartConversation
from countersign.runtime.config import PROJECT_ROOT
from countersign.runtime.search_attributes import AGENT_NAME, AGENT_STATUS, TENANT_ID
from tests.fixtures.agent import AgentHarness
from tests.test_chat import QUALIFY, STEP_TIMEOUT_S

pytestmark = pytest.mark.devserver

ARTIFACTS = PROJECT_ROOT / "test-artifacts"
INSTALL_TIMEOUT_S = 600


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium, installed with apt-get when missing (root only); skipped if it cannot be."""
    found = shutil.which("chromium")
    if found is None and shutil.which("apt-get"):
        env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        try:
            for command in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
                subprocess.run(command, check=True, capture_output=True, timeout=INSTALL_TIMEOUT_S, env=env)
        except (subprocess.SubprocessError, OSError) as err:
            pytest.skip(f"chromium is missing and `apt-get install chromium` failed: {err}")
        found = shutil.which("chromium")
    if found is None:
        pytest.skip("chromium is missing and apt-get is not available to install it")
    return found


async def headless(chromium: str, profile: Path, url: str, *mode: str) -> str:
    args = [
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", "--virtual-time-budget=15000", *mode, url,
    ]  # fmt: skip
    process = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    out, _ = await asyncio.wait_for(process.communicate(), 90)
    assert process.returncode == 0, f"chromium exited with {process.returncode}"
    return out.decode()


def rendered_metadata(dom: str) -> dict[str, str]:
    """The markdown the page renders in its metadata iframes (`src="/render?content=…"`), by iframe id."""
    shown = {}
    for tag in re.findall(r"<iframe[^>]*>", dom):
        src, frame_id = re.search(r'src="([^"]*)"', tag), re.search(r'id="([^"]*)"', tag)
        if src and frame_id and src[1].startswith("/render?"):
            query = parse_qs(urlsplit(html.unescape(src[1])).query)
            shown[frame_id[1]] = query["content"][0]
    return shown


async def test_web_ui_renders_summary_and_details(
    dev_agent: AgentHarness,
    chromium: str,
    tmp_path: Path,
) -> None:
    dev_agent.script(*QUALIFY)
    start = StartConversation(
        tenant_id="acme",
        user_id="alice",
        agent="lead-qualifier",
        message="Please qualify Jane Doe",
        single_turn=True,
    )
    handle = await start_conversation(dev_agent.client, dev_agent.settings, start)
    async with asyncio.timeout(STEP_TIMEOUT_S):
        while (await query_status(handle)).state != "awaiting_approval":  # noqa: ASYNC110  (queries only)
            await asyncio.sleep(0.1)

    described = await handle.describe()
    attributes = described.typed_search_attributes
    assert (attributes.get(TENANT_ID), attributes.get(AGENT_NAME)) == ("acme", "lead-qualifier")
    assert attributes.get(AGENT_STATUS) == "awaiting_approval"
    assert await described.static_summary() == static_summary(start)
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    details = metadata.current_details
    # each argument named and apart, not the values run together
    assert (
        "awaiting approval: `c1` `update_lead_status` · lead: jane.doe@example.com · new\\_status: qualified"
        in details
    )

    # The page of a running workflow keeps a history long-poll open, so Chromium's virtual time never
    # runs out: render it once the conversation is over (bob approves; single_turn ends it).
    await handle.execute_update(
        "decide", Decision(call_id="c1", decision="approve", approver="bob"), result_type=Approval
    )
    await handle.result()
    url = f"{dev_agent.settings.workflow_url(handle.id)}/{described.run_id}/user-metadata"
    dom = await headless(chromium, tmp_path / "profile", url, "--dump-dom")
    assert handle.id in dom
    shown = rendered_metadata(dom)  # the UI renders each markdown field in an iframe of its own
    assert shown["user-metadata-summary"] == "acme/alice → lead-qualifier: Please qualify Jane Doe"
    assert shown["user-metadata-details"] == "tenant `acme` · user `alice` · agent `lead-qualifier`"
    assert any(
        text.startswith("**ended** · turn 1 · acme/alice") for text in shown.values()
    )  # current details
    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "web-ui-conversation.png"
    await headless(
        chromium, tmp_path / "profile", url, f"--screenshot={screenshot}", "--window-size=1400,1000"
    )
    assert screenshot.stat().st_size > 10_000

"""A read tool through Countersign as an MCP server, against the same call in a conversation:

    .venv/bin/python -m bench.mcp_face [--samples N]

On parts this script starts (embedded PostgreSQL, the Temporal dev server, the scripted model, an
in-process worker, the server), with one API token acting for alice:

- **through /mcp**: the real `mcp` client's `call_tool("search_leads", …)` on `/mcp/lead-qualifier`,
  from the call to its result (the token's conversation already runs: the `serve_call` update, the
  tool as a local activity, its stored result read back);
- **in a conversation**: the same `search_leads` asked by the model in a turn of a running
  conversation, through the conversation API: `POST …/messages`, then `GET …/reply` until the
  reply (two model calls, the scripted model answering at once, and the tool call).

Samples alternate, so both see the same load. Writes the `bench.mcp_face` section of
docs/benchmark.md (bench/sections.py), leaving the rest of the file as it is.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from bench import stack
from bench.scenario import STEPS_MESSAGE, bench_scenario
from bench.sections import put_section, recorded_run
from bench.stats import Summary
from countersign.db.engine import session_factory
from countersign.identity import tokens
from countersign.server.app import running_server

TARGET = 1.5  # the round trip through /mcp at most this many times the conversation's


async def measure(samples: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-mcp-face-") as tmp:
        root = Path(tmp)
        async with (
            stack.postgres(root) as database_url,
            stack.temporal(root, "mcp-face", stack.ServerSetup()) as server,
            stack.parts(database_url, server.config, bench_scenario(1)) as base,
            stack.in_process_worker(base, {}) as parts,
            running_server(parts.settings, "127.0.0.1", 0, client=parts.client) as url,
        ):
            async with session_factory(parts.engine).begin() as session:
                secret = await tokens.create(session, "acme", "bench-mcp", ["alice"])
            return await _measure(url, secret, samples)


async def _measure(url: str, secret: str, samples: int) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {secret}"}
    http = create_mcp_http_client(headers=headers)
    mcp_ms: list[float] = []
    turn_ms: list[float] = []
    async with (
        Client(streamable_http_client(f"{url}/mcp/lead-qualifier", http_client=http)) as mcp,
        aiohttp.ClientSession(headers=headers) as api,
    ):
        await mcp.call_tool("search_leads", {"query": "Jane Doe"})  # the token's conversation runs
        body = {"agent": "lead-qualifier", "user_id": "alice", "message": STEPS_MESSAGE}
        async with api.post(f"{url}/api/conversations", json=body) as response:
            workflow_id = (await response.json())["workflow_id"]
        async with api.get(f"{url}/api/conversations/{workflow_id}/reply?turn=1&wait=30") as response:
            assert (await response.json())["state"] == "replied"
        for _ in range(samples):
            started = time.perf_counter()
            result = await mcp.call_tool("search_leads", {"query": "Jane Doe"})
            mcp_ms.append((time.perf_counter() - started) * 1000)
            assert not result.is_error, result
            started = time.perf_counter()
            path = f"{url}/api/conversations/{workflow_id}"
            async with api.post(f"{path}/messages", json={"text": STEPS_MESSAGE}) as response:
                message_id = (await response.json())["message_id"]
            async with api.get(f"{path}/reply?message_id={message_id}&wait=30") as response:
                reply = await response.json()
            turn_ms.append((time.perf_counter() - started) * 1000)
            assert reply["state"] == "replied", reply
    through, turn = Summary.of(mcp_ms), Summary.of(turn_ms)
    return {
        "mcp": through.__dict__,
        "conversation": turn.__dict__,
        "ratio_p50": round(through.p50 / turn.p50, 2),
    }


def markdown(result: dict[str, Any]) -> str:
    mcp, turn, ratio = result["mcp"], result["conversation"], result["ratio_p50"]
    machine = result["machine"]
    verdict = "met" if ratio <= TARGET else "**not met**"
    return "\n".join(
        [
            "## Countersign as an MCP server: a read round trip (`python -m bench.mcp_face`, issue 37)",
            "",
            "`search_leads` (a read: no approval, a local activity) called by the real `mcp` client on "
            "`/mcp/lead-qualifier` with an API token (the `serve_call` update on the token's running "
            "conversation, the result read back from the store), against the same call asked by the "
            "model in a turn of a running conversation through the conversation API (`POST …/messages` "
            "→ `GET …/reply`: two model calls, the scripted model answering at once, and the tool). "
            "Samples alternate. Load average at start "
            f"{machine['load_average_at_start']}, at end {machine['load_average_at_end']} (2 shared cores).",
            "",
            "| ms | n | p50 | p95 | max |",
            "|---|---|---|---|---|",
            f"| through `/mcp` | {mcp['n']} | {mcp['p50']} | {mcp['p95']} | {mcp['max']} |",
            f"| in a conversation | {turn['n']} | {turn['p50']} | {turn['p95']} | {turn['max']} |",
            "",
            f"Through `/mcp` ÷ in a conversation, p50: **{ratio}** (target ≤ {TARGET}x: {verdict}).",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=30)
    given = parser.parse_args()
    result = recorded_run("bench.mcp_face", [f"--samples={given.samples}"], measure(given.samples))
    section = markdown(result)
    print(section)
    put_section(Path("docs/benchmark.md"), "bench.mcp_face", section)


if __name__ == "__main__":
    main()

"""MCP calls through the worker's pool: what connection reuse saves, per transport.

    .venv/bin/python -m bench.mcp [--calls 50]

Each call is what `execute_mcp_tool` does against the server: `tools/list` (to refuse a changed
tool) then `tools/call`. "reused" keeps one pool (the worker's case); "fresh" opens a new
connection for every call (what a pool-less client would pay). Servers: `mcp-server-time` over
stdio, and the SDK-built test server (tests/fixtures/mcp_http_server.py) over streamable HTTP.
Writes the `bench.mcp` section of docs/benchmark.md (bench/sections.py), leaving the rest of the
file as it is.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

from bench.sections import put_section, run_to_the_end
from countersign.mcp.pool import McpPool
from countersign.mcp.servers import ServerConfig
from countersign.runtime.ports import free_port, wait_for_port


async def one_call(pool: McpPool, server: ServerConfig, tool: str, args: dict[str, object]) -> float:
    started = time.perf_counter()
    await pool.list_tools(server)
    await pool.call_tool(server, tool, args, {"countersign/call_id": "bench"})
    return (time.perf_counter() - started) * 1000


async def measure(
    server: ServerConfig, tool: str, args: dict[str, object], calls: int
) -> dict[str, list[float]]:
    pool = McpPool()
    try:
        await one_call(pool, server, tool, args)  # connect once
        reused = [await one_call(pool, server, tool, args) for _ in range(calls)]
    finally:
        await pool.close()
    fresh = []
    for _ in range(max(calls // 5, 3)):
        pool = McpPool()
        try:
            fresh.append(await one_call(pool, server, tool, args))
        finally:
            await pool.close()
    return {"reused": reused, "fresh": fresh}


def row(name: str, samples: list[float]) -> str:
    cuts = statistics.quantiles(samples, n=20) if len(samples) > 1 else samples * 19
    return f"| {name} | {len(samples)} | {statistics.median(samples):.1f} | {cuts[18]:.1f} |"


def start_http_server(port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.fixtures.mcp_http_server", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def collect(calls: int) -> str:
    bin_dir = Path(sys.executable).parent
    time_server = ServerConfig(
        name="time", transport="stdio", command=[str(bin_dir / "mcp-server-time")], agents=["bench"]
    )
    port = free_port()
    http = start_http_server(port)
    try:
        wait_for_port("127.0.0.1", port, 30, "the MCP test server")
        web = ServerConfig(name="web", transport="http", url=f"http://127.0.0.1:{port}/mcp", agents=["bench"])
        results = {
            "stdio (mcp-server-time)": await measure(
                time_server, "get_current_time", {"timezone": "UTC"}, calls
            ),
            "streamable HTTP (MCPServer)": await measure(web, "echo", {"text": "hi"}, calls),
        }
        pool = McpPool()
        await pool.list_tools(time_server)
        children = psutil.Process().children(recursive=True)
        rss = max(
            (c.memory_info().rss for c in children if "mcp-server-time" in " ".join(c.cmdline())), default=0
        )
        await pool.close()
    finally:
        http.terminate()
        http.wait(10)
    lines = [
        "## MCP calls (`python -m bench.mcp`)",
        "",
        "One call = `tools/list` (refuse a changed tool) + `tools/call`, as `execute_mcp_tool` makes it, "
        "through `countersign.mcp.pool.McpPool`. *Reused*: one pooled connection (the worker's case); "
        "*fresh*: a new connection per call (spawning the stdio server, or a new HTTP session). "
        f"Load average at the end: {', '.join(f'{x:.2f}' for x in psutil.getloadavg())} (shared 2 cores).",
        "",
        "| transport, connection | calls | p50 ms | p95 ms |",
        "|---|---|---|---|",
    ]
    for name, samples in results.items():
        lines += [row(f"{name}, reused", samples["reused"]), row(f"{name}, fresh per call", samples["fresh"])]
    lines += ["", f"One pooled stdio server process (mcp-server-time): {rss / 2**20:.0f} MB RSS."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=50)
    section = run_to_the_end(collect(parser.parse_args().calls))
    print(section)
    put_section(Path("docs/benchmark.md"), "bench.mcp", section)


if __name__ == "__main__":
    main()

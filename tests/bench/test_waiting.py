"""bench.waiting's logic without a run: which approvals it samples, how it extrapolates memory, which
part it says saturates, and the section it writes."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import stack
from bench.report import rss_at
from bench.waiting import BENCH, POSTGRES, SERVER, WORKER, main, part_cpu_s, render, saturated, spread


def test_spread_takes_the_first_the_last_and_evenly_between() -> None:
    items = list(range(101))
    assert spread(items, 5) == [0, 25, 50, 75, 100]
    assert spread(items, 1) == [0]
    assert spread([1, 2], 5) == [1, 2]  # fewer than asked: all of them


def test_memory_grows_only_up_to_the_workflow_cache() -> None:
    run = {"max_cached_workflows": 250, "idle_rss_mb": 100.0, "rss_mb": 150.0, "conversations": 125}
    assert rss_at(run, 125) == 150.0
    assert rss_at(run, 10_000) == 200.0  # the cache holds 250: twice the 125 measured, then flat
    past = {**run, "rss_mb": 220.0, "conversations": 2000}
    assert rss_at(past, 10_000) == 220.0  # a run past the cache measured the plateau itself


def row(workers: int, server: float, postgres: float, worker: float, cores: int = 2) -> dict[str, object]:
    return {
        "workers": workers,
        "concurrency": 30,
        "tool_calls": 300,
        "wall_s": 10.0,
        "tool_calls_per_s": 30.0,
        "cores_busy": {WORKER: worker, SERVER: server, POSTGRES: postgres, BENCH: 0.1},
        "machine_cores": cores,
    }


@pytest.mark.parametrize(
    ("last", "says"),
    [
        (row(3, server=0.9, postgres=0.1, worker=0.5), "the Temporal dev server (0.90 cores at 3 workers)"),
        (row(3, server=0.3, postgres=0.95, worker=0.5), "the PostgreSQL (0.95 cores at 3 workers)"),
        (row(3, server=0.6, postgres=0.1, worker=1.1), "the machine's 2 cores"),
        (row(3, server=0.3, postgres=0.1, worker=0.4), "none of the parts"),
        (
            {**row(3, 0.3, 0.1, 0.6), "cores_busy": {WORKER: 0.6, SERVER: 0.3, POSTGRES: 0.1, BENCH: 0.9}},
            "the bench process (client, scripted model) (0.90 cores at 3 workers)",
        ),
    ],
)
def test_what_saturates_is_read_from_the_largest_worker_count(last: dict[str, object], says: str) -> None:
    assert saturated([row(1, 0.2, 0.1, 0.3), last]).startswith(says)


RESULTS = {
    "command": ".venv/bin/python -m bench.waiting",
    "duration_s": 99.0,
    "machine": {"load_average_at_start": [5.0, 5.0, 5.0], "load_average_at_end": [6.0, 6.0, 6.0]},
    "waiting": {
        "conversations": 2000,
        "max_cached_workflows": 250,
        "idle_rss_mb": 120.0,
        "rss_mb": 230.0,
        "rss_after_approvals_mb": 231.0,
        "started_s": 40.0,
        "all_awaiting_after_s": 90.0,
        "inbox": {
            "items": 2000,
            "page": 50,
            "page_cold_ms": 310.0,
            "page_warm_ms": 40.0,
            "full_cold_ms": 9000.0,
            "full_warm_ms": 250.0,
        },
        "approval_to_execution_ms": {"n": 20, "p50": 60.0, "p95": 120.0, "mean": 70.0, "max": 130.0},
    },
    "scale_out": [row(1, 0.3, 0.05, 0.7), row(2, 0.5, 0.07, 0.9), row(3, 0.92, 0.08, 1.0)],
}


def test_the_section_says_each_target_and_the_extrapolation() -> None:
    text = render(RESULTS)
    rss = "| worker RSS at 10,000 waiting | ≤ 1024 MB | 230.0 MB at 2,000 (from 2,000: 230.0 MB) | **met** |"
    assert rss in text
    page = "| the inbox's page (50 of 2,000 waiting, the rest counted), "
    assert page + "cold | ≤ 300 ms | 310.0 ms | **not met** |" in text
    assert page + "warm | ≤ 300 ms | 40.0 ms | **met** |" in text
    assert "| the full list of all 2,000 waiting calls, cold |  | 9000.0 ms |  |" in text
    assert "60.0 / 120.0 ms | **not met** |" in text
    assert "Tool calls/s against one worker: 1.00 x, 1.00 x, 1.00 x." in text
    assert "What saturates first: the Temporal dev server (0.92 cores at 3 workers)." in text


def test_a_run_from_before_paging_renders_its_full_list() -> None:
    before = {**RESULTS["waiting"], "inbox": {"items": 1000, "cold_ms": 2950.0, "warm_ms": 384.0}}  # type: ignore[dict-item]
    text = render({**RESULTS, "waiting": before})
    assert "| the full list of all 1,000 waiting calls, warm |  | 384.0 ms |  |" in text
    assert "the inbox's page" not in text


def test_render_rewrites_the_section_from_the_recorded_json(tmp_path: Path) -> None:
    out, markdown = tmp_path / "w.json", tmp_path / "b.md"
    out.write_text(json.dumps({k: v for k, v in RESULTS.items() if k != "waiting"}))
    markdown.write_text("# Benchmark\n")
    main(["--render", "--out", str(out), "--markdown", str(markdown)])
    text = markdown.read_text()
    assert text.startswith("# Benchmark\n\n<!-- bench.waiting -->\n## Waiting at scale")
    assert "**Waiting**" not in text and "**Scale-out**" in text


def test_the_bench_process_is_counted_without_the_parts_it_started() -> None:
    """Its descendants are the worker processes, the dev server and PostgreSQL, measured apart."""
    busy = subprocess.Popen([sys.executable, "-c", "import time; sum(range(30_000_000)); time.sleep(30)"])
    try:
        time.sleep(1.5)
        assert part_cpu_s(BENCH, os.getpid()) == pytest.approx(
            stack.cpu_s(os.getpid(), children=False), abs=0.05
        )
        assert part_cpu_s(SERVER, os.getpid()) > part_cpu_s(BENCH, os.getpid()) + 0.2  # the busy child
    finally:
        busy.kill()
        busy.wait()

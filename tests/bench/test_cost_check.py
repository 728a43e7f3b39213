"""bench.cost --check: the regression gate judges the ratios of a run against TARGETS (no run here).

Issue 52's gate: Countersign ahead of both durable peers on step, throughput and worker CPU, and its
worker CPU per tool call within 1.3x the minimal loop's."""

import copy
import json
from pathlib import Path

import pytest

from bench.cost import AGENTS, BARE, COUNTERSIGN, MINIMAL, PYDANTIC, TARGETS, main, missed, ratios, verdict

WITHIN = {
    **{f"{f}:{peer}": v for peer in (AGENTS, PYDANTIC)
       for f, v in (("step_wall", 0.9), ("tool_calls_per_s", 1.1), ("worker_cpu", 0.9))},
    f"worker_cpu:{MINIMAL}": 1.2,
}  # fmt: skip


def test_ratios_within_their_targets_pass() -> None:
    assert missed(WITHIN) == []
    assert verdict(WITHIN).splitlines()[-1] == "bench.cost --check: every ratio within its target"


@pytest.mark.parametrize(
    ("ratio", "value"),
    [
        (f"step_wall:{AGENTS}", 1.01),
        (f"tool_calls_per_s:{PYDANTIC}", 0.99),
        (f"worker_cpu:{PYDANTIC}", 1.05),
        (f"worker_cpu:{MINIMAL}", 1.31),
    ],
)
def test_a_ratio_past_its_target_fails_and_is_named(ratio: str, value: float) -> None:
    q = {**WITHIN, ratio: value}
    (failed,) = missed(q)
    assert failed.ratio == ratio
    lines = verdict(q).splitlines()
    assert lines[-1] == f"bench.cost --check: failed: {failed.label}"
    (line,) = [x for x in lines if x.startswith(failed.label)]
    assert f"{value:.3f} x" in line and failed.wanted() in line and line.endswith("FAILED")


def test_level_with_a_peer_is_not_ahead_but_the_minimal_loop_bound_is_inclusive() -> None:
    level = {t.ratio: t.bound for t in TARGETS}
    assert [t.ratio for t in missed(level)] == [t.ratio for t in TARGETS if t.strict]
    assert f"worker_cpu:{MINIMAL}" not in [t.ratio for t in missed(level)]


def test_every_miss_is_listed() -> None:
    q = {k: (2.0 if k.startswith(("step", "worker")) else 0.5) for k in WITHIN}
    assert [t.ratio for t in missed(q)] == [t.ratio for t in TARGETS]


def side(step: float, cpu: float, per_s: float) -> dict[str, dict[str, object]]:
    summary = {"n": 1, "p50": step, "p95": step, "mean": step, "max": step}
    return {
        "steps": {
            "step_wall_ms": summary,
            "own_ms": summary,
            "orchestration_ms": summary,
            "events_per_step": 7,
        },
        "concurrent": {
            "tool_calls_per_s": per_s,
            "transactions_per_tool_call": 1.0,
            "cpu_ms_per_tool_call": {"worker": cpu, "Temporal dev server": 1.0, "PostgreSQL": 1.0},
        },
    }


def results(step_ms: float, cpu_ms: float, rate: float) -> dict[str, object]:
    """A recorded run's JSON, Countersign's figures given; the minimal loop's 10 ms of CPU per call,
    the peers' 10 ms steps, 10 calls/s and 20 ms of CPU, the bare loop's all 10."""
    found = {
        COUNTERSIGN: side(step_ms, cpu_ms, rate),
        MINIMAL: side(5, 10, 30),
        AGENTS: side(10, 20, 10),
        PYDANTIC: side(10, 20, 10),
        BARE: side(10, 10, 10),
    }
    return {
        "steps": {name: s["steps"] for name, s in found.items()},
        "concurrent": {name: s["concurrent"] for name, s in found.items()},
        "sizes": {"steps": 5, "conversations": 1, "rounds": 1, "batch": 1, "concurrency": 10},
        "duration_s": 1.0,
        "machine": {"load_average_at_start": [1.0], "load_average_at_end": [1.0]},
        "command": ".venv/bin/python -m bench.cost",
    }


def test_ratios_are_countersign_over_each_other_implementation() -> None:
    q = ratios(results(step_ms=8, cpu_ms=13, rate=12))
    assert q[f"step_wall:{AGENTS}"] == 0.8 and q[f"tool_calls_per_s:{PYDANTIC}"] == 1.2
    assert q[f"worker_cpu:{MINIMAL}"] == 1.3 and q[f"worker_cpu:{AGENTS}"] == 0.65
    assert f"step_wall:{COUNTERSIGN}" not in q


def test_render_check_judges_the_recorded_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, markdown = tmp_path / "cost.json", tmp_path / "benchmark.md"
    passing = results(step_ms=9, cpu_ms=13, rate=11)  # ahead of both peers; 1.3x the minimal loop's CPU
    out.write_text(json.dumps(passing))
    argv = ["--render", "--check", "--out", str(out), "--markdown", str(markdown)]
    assert main(argv) == 0
    assert "**not met**" not in markdown.read_text().split("orchestration per step")[0]

    failing = copy.deepcopy(passing)
    failing["concurrent"][COUNTERSIGN]["cpu_ms_per_tool_call"]["worker"] = 14  # type: ignore[index]
    out.write_text(json.dumps(failing))
    capsys.readouterr()
    assert main(argv) == 1
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"bench.cost --check: failed: worker CPU per tool call vs {MINIMAL}"
    )
    assert main(["--render", "--out", str(out), "--markdown", str(markdown)]) == 0  # no --check: no verdict

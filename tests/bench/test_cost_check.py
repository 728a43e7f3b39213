"""bench.cost --check: the regression gate judges the ratios of a run against TARGETS (no run here)."""

import copy
import json
from pathlib import Path

import pytest

from bench.cost import BARE, COUNTERSIGN, TARGETS, main, missed, verdict

WITHIN = {"step_wall": 1.1, "worker_cpu": 1.2, "tool_calls_per_s": 0.9}


def test_ratios_within_their_targets_pass() -> None:
    assert missed(WITHIN) == []
    assert verdict(WITHIN).splitlines()[-1] == "bench.cost --check: every ratio within its target"


@pytest.mark.parametrize(
    ("ratio", "value"), [("step_wall", 1.21), ("worker_cpu", 1.31), ("tool_calls_per_s", 0.79)]
)
def test_a_ratio_past_its_target_fails_and_is_named(ratio: str, value: float) -> None:
    q = {**WITHIN, ratio: value}
    (failed,) = missed(q)
    assert failed.ratio == ratio
    lines = verdict(q).splitlines()
    assert lines[-1] == f"bench.cost --check: failed: {failed.label}"
    (line,) = [x for x in lines if x.startswith(failed.label)]
    assert f"{value:.3f} x" in line and failed.wanted() in line and line.endswith("FAILED")


def test_a_ratio_exactly_at_its_target_passes() -> None:
    assert missed({t.ratio: t.bound for t in TARGETS}) == []


def test_every_miss_is_listed() -> None:
    q = {"step_wall": 1.55, "worker_cpu": 2.11, "tool_calls_per_s": 0.49}  # issue 36's main
    assert [t.ratio for t in missed(q)] == ["step_wall", "worker_cpu", "tool_calls_per_s"]
    assert verdict(q).splitlines()[-1] == (
        "bench.cost --check: failed: step wall p50, worker CPU per tool call, tool calls/s at c=10"
    )


def results(step_ms: float, cpu_ms: float, rate: float) -> dict[str, object]:
    """A recorded run's JSON, Countersign's figures given, the bare loop's all 10."""

    def side(step: float, cpu: float, per_s: float) -> dict[str, object]:
        summary = {"n": 1, "p50": step, "p95": step, "mean": step, "max": step}
        return {
            "steps": {"step_wall_ms": summary, "own_ms": summary, "orchestration_ms": summary},
            "concurrent": {
                "tool_calls_per_s": per_s,
                "transactions_per_tool_call": 1.0,
                "cpu_ms_per_tool_call": {"worker": cpu, "Temporal dev server": 1.0, "PostgreSQL": 1.0},
            },
        }

    ours, bare = side(step_ms, cpu_ms, rate), side(10, 10, 10)
    return {
        "steps": {COUNTERSIGN: ours["steps"], BARE: bare["steps"]},
        "concurrent": {COUNTERSIGN: ours["concurrent"], BARE: bare["concurrent"]},
        "sizes": {"steps": 5, "conversations": 1, "rounds": 1, "batch": 1, "concurrency": 10},
        "duration_s": 1.0,
        "machine": {"load_average_at_start": [1.0], "load_average_at_end": [1.0]},
        "command": ".venv/bin/python -m bench.cost",
    }


def test_render_check_judges_the_recorded_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, markdown = tmp_path / "cost.json", tmp_path / "benchmark.md"
    passing = results(step_ms=12, cpu_ms=13, rate=8)  # 1.2x, 1.3x, 0.8x: every bound exactly
    out.write_text(json.dumps(passing))
    argv = ["--render", "--check", "--out", str(out), "--markdown", str(markdown)]
    assert main(argv) == 0
    assert "**not met**" not in markdown.read_text().split("orchestration per step")[0]

    failing = copy.deepcopy(passing)
    failing["concurrent"][COUNTERSIGN]["cpu_ms_per_tool_call"]["worker"] = 14  # type: ignore[index]
    out.write_text(json.dumps(failing))
    capsys.readouterr()
    assert main(argv) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "bench.cost --check: failed: worker CPU per tool call"
    assert main(["--render", "--out", str(out), "--markdown", str(markdown)]) == 0  # no --check: no verdict

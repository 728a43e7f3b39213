"""The soak's pure parts: the chaos schedule, and the judge that finds what was lost or doubled."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest

from bench.soak import FAULT_KINDS, FaultKind, Strike, chaos_schedule, judge, section
from tests.fixtures.fault_scripts import SOAK_KINDS, Conversation, Effects, expected

COUNTS: dict[FaultKind, int] = {"worker_killed": 20, "temporal_restarted": 15, "postgres_restarted": 15}


@pytest.mark.parametrize("seed", range(20))
def test_the_schedule_has_every_fault_inside_the_window_and_apart(seed: int) -> None:
    schedule = chaos_schedule(random.Random(seed), COUNTS, window_s=900.0, gap_s=12.0)
    assert {k: [s.kind for s in schedule].count(k) for k in FAULT_KINDS} == COUNTS
    assert schedule == sorted(schedule)
    assert 0 <= schedule[0].at_s and schedule[-1].at_s <= 900.0
    gaps = [b.at_s - a.at_s for a, b in itertools.pairwise(schedule)]
    assert min(gaps) >= 12.0 - 0.002  # rounded to the millisecond


def test_the_schedule_is_the_seeds() -> None:
    first = chaos_schedule(random.Random(7), COUNTS, 900.0, 12.0)
    assert first == chaos_schedule(random.Random(7), COUNTS, 900.0, 12.0)
    assert first != chaos_schedule(random.Random(8), COUNTS, 900.0, 12.0)
    assert len({s.kind for s in first[:10]}) > 1, "the kinds are mixed, not one kind after another"


def test_a_tight_schedule_fills_the_window_and_a_too_tight_one_is_refused() -> None:
    exact = chaos_schedule(random.Random(1), {"worker_killed": 3}, window_s=20.0, gap_s=10.0)
    assert [s.at_s for s in exact] == [0.0, 10.0, 20.0]
    assert chaos_schedule(random.Random(1), {}, 10.0, 5.0) == []
    with pytest.raises(ValueError, match="do not fit"):
        chaos_schedule(random.Random(1), {"worker_killed": 4}, window_s=20.0, gap_s=10.0)
    assert Strike(1.0, "worker_killed") < Strike(2.0, "postgres_restarted")


def conversations() -> list[Conversation]:
    return [Conversation(n, kind, "t") for n, kind in enumerate(SOAK_KINDS, start=1)]


def as_expected(cs: list[Conversation]) -> dict[str, Effects]:
    return {c.workflow_id: expected(c) for c in cs}


def by_kind(cs: list[Conversation], kind: str) -> Conversation:
    return next(c for c in cs if c.kind == kind)


def test_everything_as_scripted_is_clean() -> None:
    cs = conversations()
    verdict = judge(cs, as_expected(cs))
    assert verdict.clean and verdict.lost == verdict.doubled == verdict.unwanted == verdict.unexpected == []


def test_an_email_sent_twice_and_a_task_made_twice_are_doubled() -> None:
    cs = conversations()
    found = as_expected(cs)
    tool = by_kind(cs, "tool")
    found[tool.workflow_id] = replace(found[tool.workflow_id], delivered=2, tasks=["open", "open"])
    verdict = judge(cs, found)
    assert verdict.doubled == [
        f"{tool.workflow_id}: tasks 2, expected 1",
        f"{tool.workflow_id}: delivered 2, expected 1",
    ]
    assert verdict.lost == verdict.unwanted == verdict.unexpected == []


def test_an_approved_change_missing_and_an_audit_row_missing_are_lost() -> None:
    cs = conversations()
    found = as_expected(cs)
    approval = by_kind(cs, "approval")
    found[approval.workflow_id] = replace(found[approval.workflow_id], lead="new", audit_rows=0)
    verdict = judge(cs, found)
    assert verdict.lost == [
        f"{approval.workflow_id}: audit_rows 0, expected 1",
        f"{approval.workflow_id}: lead new, expected qualified",
    ]
    assert verdict.doubled == verdict.unwanted == []


def test_a_rejected_change_made_and_an_undo_not_done_are_unwanted() -> None:
    cs = conversations()
    found = as_expected(cs)
    rejected, undone = by_kind(cs, "rejected"), by_kind(cs, "compensation")
    found[rejected.workflow_id] = replace(found[rejected.workflow_id], lead="qualified")
    found[undone.workflow_id] = replace(found[undone.workflow_id], lead="contacted", tasks=["open"])
    verdict = judge(cs, found)
    assert sorted(verdict.unwanted) == sorted(
        [
            f"{rejected.workflow_id}: lead qualified, expected new",
            f"{undone.workflow_id}: lead contacted, expected new",
        ]
    )
    assert verdict.unexpected == [
        f"{undone.workflow_id}: (expected, found) {{'tasks': (['cancelled'], ['open'])}}"
    ]
    assert verdict.lost == verdict.doubled == []


def test_a_conversation_that_did_not_complete_is_unexpected() -> None:
    cs = conversations()
    found = as_expected(cs)
    question = by_kind(cs, "question")
    found[question.workflow_id] = replace(found[question.workflow_id], status="RUNNING", reply=None)
    verdict = judge(cs, found)
    assert not verdict.clean
    assert verdict.unexpected == [
        f"{question.workflow_id}: (expected, found) "
        f"{{'status': ('COMPLETED', 'RUNNING'), 'reply': ('[scripted model] done', None)}}"
    ]


def test_the_section_tables_the_results_and_lists_every_finding() -> None:
    results = {
        "sizes": {"conversations": 2, "window_s": 10.0, "seed": 3},
        "kinds": {"tool": 1, "rejected": 1},
        "faults": {"worker_killed": 2, "temporal_restarted": 1, "postgres_restarted": 0},
        "completed": 2,
        "wall_s": 40,
        "verdict": {"lost": [], "doubled": ["w1: tasks 2, expected 1"], "unwanted": [], "unexpected": []},
        "replayed": 2,
        "replay_failures": [],
        "retried_activities": 3,
        "workflow_tasks_lost": 1,
        "audit_chain_broken": "record 4 (tool_executions 12) does not verify: the row was changed",
        "machine": {"load_average_at_start": [1.0, 1.0, 1.0], "load_average_at_end": [2.0, 2.0, 2.0]},
        "command": ".venv/bin/python -m bench.soak",
    }
    text = section(results)
    assert "| doubled | 1 |" in text and "| lost | 0 |" in text
    assert "| faults: worker killed | 2 |" in text and "| faults: postgres restarted | 0 |" in text
    assert "| histories replayed with the current code | 2 of 2 |" in text
    assert "- doubled: w1: tasks 2, expected 1" in text
    assert "| audit chain (`audit verify --tenant acme`) | broken |" in text
    assert "- audit chain: record 4 (tool_executions 12) does not verify: the row was changed" in text
    assert "Nothing lost" not in text

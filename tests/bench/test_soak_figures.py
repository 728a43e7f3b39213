"""The soak's report of the design's success figures (bench/soak.py `figures`, `figures_table`,
`clarifying_turns`): its arithmetic on a recorded run, without a stack."""

from __future__ import annotations

from bench.soak import Request, clarifying_turns, figures, figures_table, section

# A recorded run, cut short: 1,000 requests of which 3 got no answer (PostgreSQL down), 2 a 503,
# and 6 answered after more than 3 s (a held decision, Temporal restarting).
RECORDED = (
    [Request("POST messages", 0.2, 202)] * 980
    + [Request("GET /api/approvals", 0.4, 200)] * 6
    + [Request("GET /api/approvals", 4.5, 200)] * 6
    + [Request("PUT 1", 0.1, 404)]  # a refusal is an answer
    + [Request("GET /api/approvals", 30.0, None)] * 3
    + [Request("POST /api/conversations", 0.3, 503)] * 2
    + [Request("PUT 1", 0.1, 200)] * 2
)
VERDICT = {
    "lost": ["conv-acme-key-a: tasks 0, expected 1"],
    "doubled": [],
    "unwanted": [],
    "unexpected": ["conv-acme-key-a: (expected, found) {...}", "conv-acme-key-b: (expected, found) {...}"],
}
# (workflow_id, seq, role, tool name, answered needs), out of order as a query may return them
MESSAGES = [
    ("a", 3, "tool", "ask_human", False),
    ("a", 1, "user", None, False),
    ("a", 2, "assistant", None, False),
    ("a", 5, "tool", "ask_human", False),  # the same turn asks twice: one clarifying turn
    ("a", 6, "user", None, False),
    ("a", 7, "tool", "search_leads", False),
    ("b", 1, "user", None, False),
    ("b", 2, "tool", "get_lead", True),
    ("c", 1, "user", None, False),
    ("c", 2, "tool", "create_task", False),
]


def test_the_figures_of_a_recorded_run() -> None:
    assert len(RECORDED) == 1000
    assert clarifying_turns(MESSAGES) == (4, 2)
    f = figures(RECORDED, 20, VERDICT, 4, 2, {"helpful": 15, "not_helpful": 4})
    assert f == {
        "requests": 1000,
        "answered": 995,
        "answered_within_3s": 989,
        "availability": 0.995,
        "availability_within_3s": 0.989,
        "conversations": 20,
        "conversations_with_errors": 2,  # a and b, each once
        "error_rate": 0.1,
        "turns": 4,
        "clarifying_turns": 2,
        "clarification_rate": 0.5,
        "rated": 19,
        "rated_helpful": 15,
        "satisfaction": 0.789474,
        "unanswered": {"GET /api/approvals: no answer": 3, "POST /api/conversations: 503": 2},
        "slow": {"GET /api/approvals": 6},
    }
    table = figures_table(f)
    assert "| availability: requests answered | 99.5 % (995 of 1000) | ≥ 99.9 % | **not met** |" in table
    assert "| availability: answered within 3 s | 98.9 % (989 of 1000) | ≥ 99.9 % | **not met** |" in table
    assert (
        "| error rate: conversations not ending as scripted | 10.0 % (2 of 20) | < 1.0 % | **not met** |"
        in table
    )
    assert (
        "| clarification rate: turns that asked a person | 50.0 % (2 of 4) | < 10.0 % | **not met** |"
        in table
    )
    assert "| satisfaction: replies rated helpful | 78.9 % (15 of 19) | none in the design | - |" in table
    assert "- unanswered: GET /api/approvals: no answer (3), POST /api/conversations: 503 (2)" in table
    assert "- answered after 3 s: GET /api/approvals (6)" in table


def test_a_clean_run_meets_the_targets_and_an_empty_one_says_nothing() -> None:
    clean = figures(
        [Request("GET /api/approvals", 0.1, 200)] * 2000, 21, {"lost": []}, 22, 2, {"helpful": 21}
    )
    table = figures_table(clean)
    assert "| 100.0 % (2000 of 2000) | ≥ 99.9 % | met |" in table
    assert "| 0.0 % (0 of 21) | < 1.0 % | met |" in table and "| 9.1 % (2 of 22) | < 10.0 % | met |" in table
    empty = figures([], 0, {}, 0, 0, {})
    assert empty["availability"] is None and "| - (0 of 0) |" in figures_table(empty)


def test_the_section_carries_the_figures_beside_their_targets() -> None:
    results = {
        "sizes": {"conversations": 20, "window_s": 60.0, "seed": 38},
        "kinds": {"tool": 20},
        "faults": {"worker_killed": 1, "temporal_restarted": 1, "postgres_restarted": 1},
        "completed": 20,
        "wall_s": 200,
        "verdict": {"lost": [], "doubled": [], "unwanted": [], "unexpected": []},
        "replayed": 20,
        "replay_failures": [],
        "retried_activities": 0,
        "workflow_tasks_lost": 0,
        "audit_chain_broken": "",
        "machine": {"load_average_at_start": [1.0, 1.0, 1.0], "load_average_at_end": [2.0, 2.0, 2.0]},
        "command": ".venv/bin/python -m bench.soak",
        "figures": figures(RECORDED, 20, VERDICT, 4, 2, {"helpful": 15, "not_helpful": 4}),
    }
    text = section(results)
    assert "| Figure | Measured | Target | |" in text
    assert "| availability: requests answered | 99.5 % (995 of 1000) | ≥ 99.9 % | **not met** |" in text

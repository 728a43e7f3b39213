"""`starter.py stats`: the audit summarised per tool and per agent, over a recent window.

Per tool (from `tool_executions`): calls, success rate (ran and answered ok, of the calls no
reviewer rejected and no approval expired: a person's "no" is not the tool failing), mean and p95 duration
of the calls that ran, `needs` rate (the tool asked for clarification), outcomes and error codes.
Per tool and per agent: the ratings people gave the replies (from `reply_ratings`, rated in the
window; a reply counts for each tool its turn called). Per agent: turns, model calls and tokens
(from `model_calls`), tool calls, and approvals requested,
approved, rejected and expired (a call that needed approval is audited with `approved_by` when
approved, or with outcome `rejected` / `expired`); a call still waiting has no audit row yet, so
`stats` adds the pending ones from the running conversations (`approvals_pending`) when Temporal
answers.

Everything is aggregated in PostgreSQL: the command reads a few rows per tool, however large the
audit.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Integer, and_, cast, distinct, func, select, true, tuple_
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.elements import ColumnElement

from countersign.db.schema import ModelCall, ReplyRating, ToolExecution

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
MAX_SINCE = timedelta(days=3660)
PEOPLE_SAID_NO = ("rejected", "expired")  # outcomes that are a reviewer's decision, not the tool's
RATED_HEADER = ("HELPFUL", "NOT_HELPFUL")  # the replies people rated, each way
AGENT_HEADER = (
    *("AGENT", "TURNS", "MODEL_CALLS", "TOKENS_IN", "TOKENS_OUT", "TOOL_CALLS"),
    *("APPROVALS", "PENDING", "APPROVED", "REJECTED", "EXPIRED", *RATED_HEADER),
)


def parse_duration(text: str) -> timedelta:
    """`90s`, `30m`, `24h`, `7d`, `2w` (or combined: `1h30m`) as a timedelta."""
    parts = re.findall(r"(\d+)\s*([smhdw])", text.strip().lower())
    if not parts or re.sub(r"(\d+)\s*([smhdw])", "", text.strip().lower()).strip():
        raise ValueError(f"{text!r} is not a duration like 90s, 30m, 24h, 7d or 1h30m")
    seconds = sum(int(n) * UNITS[unit] for n, unit in parts)
    if not 0 < seconds <= MAX_SINCE.total_seconds():
        raise ValueError(f"{text!r} must be more than 0 s and at most {MAX_SINCE.days} days")
    return timedelta(seconds=seconds)


@dataclass
class ToolStats:
    tool: str
    calls: int
    success_rate: float | None  # None: every call was rejected or expired, none could succeed
    needs_rate: float
    mean_ms: float | None  # of the calls that ran (executed, failed, invalid)
    p95_ms: float | None
    outcomes: dict[str, int] = field(default_factory=dict)
    error_codes: dict[str, int] = field(default_factory=dict)
    rated_helpful: int = 0  # replies of turns that called the tool, rated helpful
    rated_not_helpful: int = 0


@dataclass
class AgentStats:
    agent: str
    turns: int = 0
    model_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: int = 0
    approvals_requested: int = 0
    approvals_approved: int = 0
    approvals_rejected: int = 0
    approvals_expired: int = 0
    approvals_pending: int | None = None  # waiting now (from Temporal; None when not asked)
    rated_helpful: int = 0  # its replies people rated helpful
    rated_not_helpful: int = 0


@dataclass
class Stats:
    since: datetime
    tenant: str | None
    tools: list[ToolStats]
    agents: list[AgentStats]

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"since": self.since.isoformat()}


def _count(condition: ColumnElement[bool]) -> ColumnElement[int]:
    return func.count().filter(condition)


async def collect(
    session: AsyncSession, since: datetime, tenant: str | None = None, pending: dict[str, int] | None = None
) -> Stats:
    """The summary; `pending` counts the approvals waiting now per agent (None: unknown)."""
    te = ToolExecution
    window = [te.created_at >= since, *([te.tenant_id == tenant] if tenant else [])]
    ok = te.result["ok"].as_boolean()
    needs = te.result.has_key("needs")  # JSONB `?`
    tools: dict[str, ToolStats] = {}
    for row in await session.execute(
        select(
            te.tool,
            func.count(),
            _count(and_(te.outcome == "executed", ok)),
            _count(te.outcome.not_in(PEOPLE_SAID_NO)),
            _count(needs),
            func.avg(te.duration_ms),
            func.percentile_cont(0.95).within_group(te.duration_ms),
        )
        .where(*window)
        .group_by(te.tool)
        .order_by(te.tool)
    ):
        tool, calls, succeeded, could, needing, mean, p95 = row
        tools[tool] = ToolStats(
            tool=tool,
            calls=calls,
            success_rate=round(succeeded / could, 4) if could else None,
            needs_rate=round(needing / calls, 4),
            mean_ms=round(float(mean), 1) if mean is not None else None,
            p95_ms=round(float(p95), 1) if p95 is not None else None,
        )
    for tool, outcome, n in await session.execute(
        select(te.tool, te.outcome, func.count()).where(*window).group_by(te.tool, te.outcome)
    ):
        tools[tool].outcomes[outcome] = n
    code = te.result["error"]["code"].astext
    for tool, error_code, n in await session.execute(
        select(te.tool, code, func.count()).where(*window, code.is_not(None)).group_by(te.tool, code)
    ):
        tools[tool].error_codes[error_code] = n

    agents: dict[str, AgentStats] = {}
    for agent, calls, requested, approved, rejected, expired in await session.execute(
        select(
            te.agent,
            func.count(),
            _count(te.approved_by.is_not(None) | te.outcome.in_(("rejected", "expired"))),
            _count(te.approved_by.is_not(None)),
            _count(te.outcome == "rejected"),
            _count(te.outcome == "expired"),
        )
        .where(*window)
        .group_by(te.agent)
    ):
        agents[agent] = AgentStats(
            agent=agent,
            tool_calls=calls,
            approvals_requested=requested,
            approvals_approved=approved,
            approvals_rejected=rejected,
            approvals_expired=expired,
        )
    mc = ModelCall
    model_window = [mc.created_at >= since, *([mc.tenant_id == tenant] if tenant else [])]
    for agent, turns, calls, prompt, completion in await session.execute(
        select(
            mc.agent,
            func.count(distinct(tuple_(mc.workflow_id, mc.turn))),
            func.count(),
            cast(func.sum(mc.prompt_tokens), Integer),
            cast(func.sum(mc.completion_tokens), Integer),
        )
        .where(*model_window)
        .group_by(mc.agent)
    ):
        stats = agents.setdefault(agent, AgentStats(agent=agent))
        stats.turns, stats.model_calls = turns, calls
        stats.prompt_tokens, stats.completion_tokens = prompt, completion
    rr = ReplyRating
    rated_window = [rr.updated_at >= since, *([rr.tenant_id == tenant] if tenant else [])]
    helpful, unhelpful = _count(rr.rating == "helpful"), _count(rr.rating == "not_helpful")
    for agent, yes, no in await session.execute(
        select(rr.agent, helpful, unhelpful).where(*rated_window).group_by(rr.agent)
    ):
        stats = agents.setdefault(agent, AgentStats(agent=agent))
        stats.rated_helpful, stats.rated_not_helpful = yes, no
    called = func.jsonb_array_elements_text(rr.tools).table_valued("value").lateral("called")
    for tool, yes, no in await session.execute(
        select(called.c.value, helpful, unhelpful)
        .select_from(rr)
        .join(called, true())
        .where(*rated_window)
        .group_by(called.c.value)
    ):
        found = tools.setdefault(tool, ToolStats(tool, 0, None, 0.0, None, None))
        found.rated_helpful, found.rated_not_helpful = yes, no
    for agent, waiting in (pending or {}).items():
        agents.setdefault(agent, AgentStats(agent=agent)).approvals_pending = waiting
    if pending is not None:
        for stats in agents.values():
            stats.approvals_pending = stats.approvals_pending or 0
    return Stats(
        since=since,
        tenant=tenant,
        tools=sorted(tools.values(), key=lambda t: t.tool),
        agents=sorted(agents.values(), key=lambda a: a.agent),
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))) or "-"


def render(stats: Stats) -> list[list[tuple[str, ...]]]:
    """The two tables `stats` prints (header row first), tools then agents."""
    tools: list[tuple[str, ...]] = [
        ("TOOL", "CALLS", "SUCCESS", "NEEDS", "MEAN_MS", "P95_MS", "OUTCOMES", "ERRORS", *RATED_HEADER)
    ]
    tools += [
        (
            t.tool,
            str(t.calls),
            "-" if t.success_rate is None else f"{t.success_rate:.0%}",
            f"{t.needs_rate:.0%}",
            _ms(t.mean_ms),
            _ms(t.p95_ms),
            _counts(t.outcomes),
            _counts(t.error_codes),
            str(t.rated_helpful),
            str(t.rated_not_helpful),
        )
        for t in stats.tools
    ]
    agents: list[tuple[str, ...]] = [AGENT_HEADER]
    agents += [
        (
            a.agent,
            str(a.turns),
            str(a.model_calls),
            str(a.prompt_tokens),
            str(a.completion_tokens),
            str(a.tool_calls),
            str(a.approvals_requested + (a.approvals_pending or 0)),
            "?" if a.approvals_pending is None else str(a.approvals_pending),
            str(a.approvals_approved),
            str(a.approvals_rejected),
            str(a.approvals_expired),
            str(a.rated_helpful),
            str(a.rated_not_helpful),
        )
        for a in stats.agents
    ]
    return [tools, agents]

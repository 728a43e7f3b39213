"""A lead's score (0-100) from what the workspace knows about it, with the parts that make it up.

Pure: the storage layer (`countersign/db/leads.py`) gathers the facts and stores the result each time
an engagement is recorded; the qualifier agent reads the parts through `get_lead_score`. The rules are
deliberately few and additive, so a person can check a score by reading its parts:

- where the lead came from (a referral is worth more than a cold list), and whether its company is known;
- engagement: emails delivered to it, replies it sent, meetings booked with it (each capped, so one
  kind of contact cannot carry a lead alone);
- its status, and its history: every step back (qualified -> contacted, or a reopened disqualified
  lead) costs points; a lead that is disqualified now scores 0 whatever else is true.
"""

from __future__ import annotations

from dataclasses import dataclass

# Points by source, matched case-insensitively on the stored text; anything else is "other".
SOURCE_POINTS = {
    "referral": 25,
    "trade show": 20,
    "inbound email": 15,
    "website": 15,
    "webinar": 10,
    "cold outreach": 5,
}
OTHER_SOURCE_POINTS = 5
COMPANY_POINTS = 10
DELIVERED_POINTS, DELIVERED_CAP = 3, 9
ANSWERED_POINTS, ANSWERED_CAP = 15, 30
MEETING_POINTS, MEETING_CAP = 20, 40
STATUS_POINTS = {"new": 0, "contacted": 5, "qualified": 15, "converted": 25}
STEP_BACK_POINTS = -10
# A lead's progress, for telling a step back from a step forward; disqualified is below them all.
PROGRESS = {"disqualified": -1, "new": 0, "contacted": 1, "qualified": 2, "converted": 3}


@dataclass(frozen=True)
class LeadFacts:
    """What the score is computed from. `status_changes` are (previous, new) pairs, oldest first."""

    status: str
    source: str | None = None
    company: str | None = None
    emails_delivered: int = 0
    emails_answered: int = 0
    meetings_booked: int = 0
    status_changes: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ScorePart:
    name: str  # source, company, emails_delivered, emails_answered, meetings_booked, status, history
    points: int
    why: str


@dataclass(frozen=True)
class LeadScore:
    score: int  # the parts' sum, within 0-100
    parts: tuple[ScorePart, ...]


def capped(count: int, each: int, cap: int) -> int:
    return min(max(count, 0) * each, cap)


def step_backs(changes: tuple[tuple[str, str], ...]) -> int:
    """How many changes moved the lead back (an unknown status counts as a fresh "new")."""
    return sum(1 for before, after in changes if PROGRESS.get(after, 0) < PROGRESS.get(before, 0))


def score_lead(facts: LeadFacts) -> LeadScore:
    """The score and its parts; the parts always add up to the score before it is held within 0-100."""
    source = (facts.source or "").strip().lower()
    parts = [
        ScorePart(
            "source",
            SOURCE_POINTS.get(source, OTHER_SOURCE_POINTS if source else 0),
            f"source: {facts.source}" if source else "no source recorded",
        ),
        ScorePart(
            "company",
            COMPANY_POINTS if facts.company else 0,
            f"company known: {facts.company}" if facts.company else "no company recorded",
        ),
        ScorePart(
            "emails_delivered",
            capped(facts.emails_delivered, DELIVERED_POINTS, DELIVERED_CAP),
            f"{facts.emails_delivered} email(s) delivered ({DELIVERED_POINTS} each, at most {DELIVERED_CAP})",
        ),
        ScorePart(
            "emails_answered",
            capped(facts.emails_answered, ANSWERED_POINTS, ANSWERED_CAP),
            f"{facts.emails_answered} answer(s) from the lead ("
            f"{ANSWERED_POINTS} each, at most {ANSWERED_CAP})",
        ),
        ScorePart(
            "meetings_booked",
            capped(facts.meetings_booked, MEETING_POINTS, MEETING_CAP),
            f"{facts.meetings_booked} meeting(s) booked ({MEETING_POINTS} each, at most {MEETING_CAP})",
        ),
    ]
    backs = step_backs(facts.status_changes)
    parts.append(
        ScorePart("history", backs * STEP_BACK_POINTS, f"{backs} step(s) back in its status history")
    )
    if facts.status == "disqualified":
        earned = sum(part.points for part in parts)
        parts.append(ScorePart("status", -earned, "disqualified: a ruled-out lead scores 0"))
    else:
        parts.append(ScorePart("status", STATUS_POINTS.get(facts.status, 0), f"status: {facts.status}"))
    total = sum(part.points for part in parts)
    return LeadScore(score=min(max(total, 0), 100), parts=tuple(parts))

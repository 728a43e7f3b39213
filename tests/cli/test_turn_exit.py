"""`start --wait` and `send` exit statuses: a script tells a reply from a pause and from a turn that
stopped short (issue 41, item 9: a token-budget refusal exited 0, its "LIMIT_REACHED: …" read as the
agent's answer)."""

from __future__ import annotations

import pytest

from countersign.cli.conversations import turn_exit
from countersign.cli.ux import EXIT_STOPPED, EXIT_WAITING
from countersign.core.contract import StatusView, TurnResult, TurnStop
from countersign.core.messages import Usage


def turn(stop: TurnStop) -> TurnResult:
    return TurnResult(
        turn=1, reply="LIMIT_REACHED: the tenant's daily token budget is spent", stop=stop, usage=Usage()
    )


@pytest.mark.parametrize("stop", ["limit_reached", "error"])
def test_a_turn_that_stopped_short_exits_non_zero(stop: TurnStop) -> None:
    with pytest.raises(SystemExit) as exited:
        turn_exit(turn(stop))
    assert exited.value.code == EXIT_STOPPED


def test_a_completed_turn_exits_zero() -> None:
    turn_exit(turn("completed"))
    turn_exit(None)  # not followed (--no-wait)


def test_a_turn_waiting_for_a_person_exits_three() -> None:
    waiting = StatusView(state="awaiting_approval", turn=1)
    with pytest.raises(SystemExit) as exited:
        turn_exit(waiting)
    assert exited.value.code == EXIT_WAITING == 3

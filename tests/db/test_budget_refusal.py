"""A tenant over its daily token budget is refused as a benign failure (issue 41, item 9): the turn
ends with LIMIT_REACHED, and the worker's log does not carry a traceback for a refusal the tenant's
own budget asked for (the SDK logs benign failures without one)."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import AsyncSession
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from countersign.db.messages import refuse_over_budget


async def test_a_spent_budget_is_a_benign_non_retryable_refusal(db_session: AsyncSession) -> None:
    with pytest.raises(ApplicationError) as refused:
        await refuse_over_budget(db_session, "acme", 0)
    assert refused.value.type == "LimitReached" and refused.value.non_retryable
    assert refused.value.category == ApplicationErrorCategory.BENIGN
    assert refused.value.message.startswith("LIMIT_REACHED: tenant acme used")
    await refuse_over_budget(db_session, "acme", None)  # no budget: nothing to refuse

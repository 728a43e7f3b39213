"""Which activity failures are worth retrying.

Activities whose I/O is PostgreSQL retry for DB_OUTAGE_TOLERANCE (workflows/agent.py): a restart or
failover delays a call, it does not fail it. A statement the database refuses (a value a column
cannot hold, a constraint, a bug in SQL) fails the same way on every attempt: retrying it holds the
conversation for minutes and fails anyway. `DatabaseRefusals` turns such a failure, in any
activity, into a non-retryable `ApplicationError` of type `DatabaseRefused`, whose message names
the SQLSTATE and never the statement or its parameters (the worker's log has those).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import asyncpg
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.exc import TimeoutError as SQLAlchemyTimeoutError
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

# What a restart, failover or overload of PostgreSQL raises: socket errors, PostgreSQL class 08
# (connection) and 57P0x (shutdown, cannot connect now), and the pool timing out.
TRANSIENT: tuple[type[BaseException], ...] = (
    OSError,  # ConnectionRefusedError, ConnectionResetError, ...
    TimeoutError,
    SQLAlchemyTimeoutError,  # no pooled connection came free in time
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
)
# SQLSTATE classes that fail the same way on every attempt: data exceptions (22: a value the column
# or type cannot hold), integrity constraints (23), syntax or access rules (42), program limits (54).
# Serialization failures and deadlocks (40), lock timeouts (55P03) and class 08/57 are retried.
REFUSED_CLASSES = frozenset({"22", "23", "42", "54"})


def causes(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and everything that caused it: `__cause__`, `__context__` and a driver error's `orig`."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        e = pending.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        pending += [e.__cause__, e.__context__, getattr(e, "orig", None)]


def is_connection_error(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it) means the database was out of reach: only that is worth
    retrying. Anything else a tool raises would fail the same way on every attempt."""
    return any(
        (isinstance(e, DBAPIError) and e.connection_invalidated) or isinstance(e, TRANSIENT)
        for e in causes(exc)
    )


def refused_by_database(exc: BaseException) -> str | None:
    """The SQLSTATE (or, for a value that could not even be bound, its error's type) when `exc` means
    the database refused a statement for good; None when it is anything else, or the database was
    out of reach."""
    if is_connection_error(exc):
        return None
    for e in causes(exc):
        if isinstance(e, StatementError) and not isinstance(e, DBAPIError) and e.orig is not None:
            return type(e.orig).__name__  # raised binding a parameter, before PostgreSQL saw it
        sqlstate = getattr(e, "sqlstate", None)
        if isinstance(sqlstate, str) and sqlstate[:2] in REFUSED_CLASSES:
            return sqlstate
    return None


class DatabaseRefusals(Interceptor):
    """Worker interceptor: a statement the database refused fails its activity once, never in a
    retry loop (see the module's docstring)."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Refusals(next)


class _Refusals(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await super().execute_activity(input)
        except ApplicationError:
            raise
        except Exception as exc:
            sqlstate = refused_by_database(exc)
            if sqlstate is None:
                raise
            name = activity.info().activity_type
            activity.logger.exception("the database refused what %s wrote (%s)", name, sqlstate)
            # `from None`: the statement and its parameters stay in the log, out of workflow history
            raise ApplicationError(
                f"the database refused what {name} wrote (SQLSTATE {sqlstate}); the worker's log has"
                " the details",
                type="DatabaseRefused",
                non_retryable=True,
            ) from None

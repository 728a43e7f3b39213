"""Shared helpers of the catalog tools: resolving human identifiers, typed arguments, views of rows,
recorded changes.

Resolution. The model names things the way people do (an email, a display name, a title); these
helpers turn a name into one row of the caller's tenant, or stop the call:

- the record a call acts on (the task to update, the event to move) that does not exist is
  `ToolFailure("NOT_FOUND")`;
- a name that matches several rows, or a person that matches nobody, raises `NeedsInput`; a write
  whose plan raises it, or a read decorated with `@answers_needs`, returns its `Needs`
  (`{"ok": false, "needs": {field: true}}` plus the candidates), so the model asks instead of
  guessing.

Every query filters on `ctx.tenant_id`; no helper takes a tenant from anywhere else.

Changes and their undo. Update tools record `previous` and `changed` (JSON values keyed by column)
in their result; `restore_fields` puts back exactly the fields the call changed, and only where the
current value is still the one the call set, so an undo never clobbers a later human change. Created
rows are undone by `cancel_created`: they are marked cancelled (keeping their history), never deleted.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Annotated, Any, ClassVar, Generic, TypeVar, cast

import structlog
from pydantic import AfterValidator, BaseModel, ConfigDict, EmailStr, model_validator
from pydantic_core import to_jsonable_python
from sqlalchemy import (
    Boolean,
    ColumnElement,
    CompoundSelect,
    Date,
    DateTime,
    Integer,
    Row,
    Select,
    String,
    and_,
    bindparam,
    case,
    func,
    literal_column,
    null,
    or_,
    select,
    union_all,
)
from sqlalchemy.orm import InstrumentedAttribute

from countersign.db.schema import Base, CalendarEvent, Contact, User
from tools.registry import (
    Needs,
    NeedsInput,
    ToolArgs,
    ToolContext,
    ToolFailure,
    UndoOutcome,
    out_of_range,
    record_id,
)

log = structlog.get_logger(__name__)

M = TypeVar("M", bound=Base)
A = TypeVar("A", bound=ToolArgs)
R = TypeVar("R", bound=BaseModel)
V = TypeVar("V", bound=BaseModel)

MAX_CANDIDATES = 10
# What `countersign.core.guards.sanitize` leaves in a recorded result it had to cut or redact: such a value
# is not the original and must not be written back by an undo.
UNFAITHFUL_MARKERS = ("[REDACTED]", "…[truncated ")


# --- arguments -------------------------------------------------------------------------------------


def _require_timezone(value: datetime) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("needs a time zone, e.g. 2026-12-08T16:00:00Z (UTC) or 2026-12-08T17:00:00+01:00")
    problem = out_of_range(value)  # before converting: year 1 or 9999 with an offset overflows
    if problem is not None:
        raise ValueError(problem)
    return value.astimezone(UTC)


# An ISO 8601 date-time with an explicit offset, normalized to UTC; a naive value is a validation error.
UtcDatetime = Annotated[datetime, AfterValidator(_require_timezone)]

# An email address in its one canonical spelling: trimmed and lowercased (shared/CONTRACT.md), so a
# plan, a policy's `context.args` and the message that leaves all read the same text.
Address = Annotated[EmailStr, AfterValidator(str.lower)]


class ChangeArgs(ToolArgs):
    """Arguments of an update tool: `target` names the record, every other field is an optional change.

    A null (or absent) field is left as it is; an empty string clears an optional text field.
    """

    target: ClassVar[str]

    @model_validator(mode="after")
    def _changes_something(self) -> ChangeArgs:
        if not any(
            getattr(self, name) is not None for name in type(self).model_fields if name != self.target
        ):
            raise ValueError("give at least one field to change")
        return self

    def provided(self, *names: str) -> dict[str, Any]:
        """The given values of `names` (column-named fields), with "" meaning "clear it" (None)."""
        values = {name: getattr(self, name) for name in names if getattr(self, name) is not None}
        return {name: (None if value == "" else value) for name, value in values.items()}


# --- needs -----------------------------------------------------------------------------------------


def answers_needs(
    fn: Callable[[ToolContext, A], Awaitable[R]],
) -> Callable[[ToolContext, A], Awaitable[R | Needs]]:
    """Let a tool's resolvers stop it with `NeedsInput`: the tool then returns the `Needs`.

    Put it under `@tool`; the registry reads the wrapped function's signature and docstring.
    """

    @functools.wraps(fn)
    async def wrapper(ctx: ToolContext, args: A) -> R | Needs:
        try:
            return await fn(ctx, args)
        except NeedsInput as stop:
            return stop.needs

    return wrapper


def needs(field: str, candidates: Sequence[dict[str, Any]] = ()) -> NeedsInput:
    return NeedsInput(Needs(fields={field: True}, candidates=list(candidates)[:MAX_CANDIDATES]))


# --- generic lookups -------------------------------------------------------------------------------


def _column(model: type[Base], name: str) -> ColumnElement[Any]:
    return cast(ColumnElement[Any], model.__table__.c[name])


async def match_first(
    ctx: ToolContext, model: type[M], *clauses: ColumnElement[bool], lock: bool = False
) -> list[M]:
    """The tenant's rows of `model` matching the first of `clauses` that matches any (best first).

    Callers order clauses from exact to loose, so "Bob" finds "Bob Brennan" but "bob" the user id wins.
    """
    for clause in clauses:
        query = (
            select(model)
            .where(_column(model, "tenant_id") == ctx.tenant_id, clause)
            .order_by(*model.__mapper__.primary_key)
            .limit(MAX_CANDIDATES + 1)
        )
        if lock:
            query = query.with_for_update()
        rows = list((await ctx.session.scalars(query)).all())
        if rows:
            return rows
    return []


def same_text(
    column: InstrumentedAttribute[str] | InstrumentedAttribute[str | None], ref: str
) -> ColumnElement[bool]:
    """Case-insensitive equality."""
    return func.lower(column) == ref.lower()


def like_pattern(ref: str) -> str:
    """An ILIKE pattern for `ref` anywhere, its LIKE wildcards taken literally (escape `\\`)."""
    escaped = ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def containing(
    column: InstrumentedAttribute[str] | InstrumentedAttribute[str | None], ref: str
) -> ColumnElement[bool]:
    """Case-insensitive substring, with LIKE wildcards in `ref` taken literally."""
    return column.ilike(like_pattern(ref), escape="\\")


async def find_record(
    ctx: ToolContext,
    model: type[M],
    ref: str,
    *,
    field: str,
    label: InstrumentedAttribute[str],
    describe: Callable[[M], dict[str, Any]],
    lock: bool = False,
) -> M:
    """The record a call acts on, by numeric id or exact (case-insensitive) `label`.

    Missing: NOT_FOUND. Several with that label: `Needs` listing them, to be named by id.
    """
    number = record_id(ref)
    by_id = [_column(model, "id") == number] if number is not None else []
    rows = await match_first(ctx, model, *by_id, same_text(label, ref), lock=lock)
    if not rows:
        raise ToolFailure("NOT_FOUND", f"no {field} {ref!r} in this workspace")
    if len(rows) > 1:
        raise needs(field, [describe(row) for row in rows])
    return rows[0]


# --- people ----------------------------------------------------------------------------------------


def user_candidate(user: User) -> dict[str, Any]:
    return {"kind": "user", "id": user.id, "name": user.display_name, "email": user.email}


def contact_candidate(contact: Contact) -> dict[str, Any]:
    return {"kind": "contact", "name": contact.name, "email": contact.email, "company": contact.company}


# A deactivated user (`users deactivate`) is nobody a tool can name: not a counterpart, assignee or owner.
ACTIVE_USER = User.deactivated_at.is_(None)


@dataclass(frozen=True)
class Ref:
    """A name as the people clauses compare it: as given (a user id), lowercased (emails and names)
    and as a LIKE pattern, each a value or a bound parameter. Lowercased in Python, not by SQL's
    `lower()`, so a bound name matches exactly what the literal one does."""

    given: Any
    lowered: Any
    pattern: Any

    @classmethod
    def of(cls, ref: str) -> Ref:
        return cls(ref, ref.lower(), like_pattern(ref))

    @classmethod
    def bound(cls, i: int) -> Ref:
        """The parameters of the `i`th name in a cached statement (`values` fills them)."""
        return cls(*(bindparam(f"{part}_{i}", type_=String) for part in ("given", "lowered", "pattern")))

    @staticmethod
    def values(i: int, ref: str) -> dict[str, str]:
        of = Ref.of(ref)
        return {f"given_{i}": of.given, f"lowered_{i}": of.lowered, f"pattern_{i}": of.pattern}


def user_clauses(ref: Ref) -> tuple[ColumnElement[bool], ...]:
    """How `ref` names active users, from exact (id, email, name) to loose (part of the name)."""
    exact = or_(
        User.id == ref.given,
        func.lower(User.email) == ref.lowered,
        func.lower(User.display_name) == ref.lowered,
    )
    return ACTIVE_USER & exact, ACTIVE_USER & User.display_name.ilike(ref.pattern, escape="\\")


def contact_clauses(ref: Ref) -> tuple[ColumnElement[bool], ...]:
    """How `ref` names contacts, from exact (email, name) to loose (part of the name)."""
    exact = or_(func.lower(Contact.email) == ref.lowered, func.lower(Contact.name) == ref.lowered)
    return exact, Contact.name.ilike(ref.pattern, escape="\\")


async def match_users(ctx: ToolContext, ref: str) -> list[User]:
    return await match_first(ctx, User, *user_clauses(Ref.of(ref)))


async def match_contacts(ctx: ToolContext, ref: str) -> list[Contact]:
    return await match_first(ctx, Contact, *contact_clauses(Ref.of(ref)))


def _best_first(
    model: type[Base],
    columns: Sequence[ColumnElement[Any] | InstrumentedAttribute[Any]],
    clauses: Sequence[ColumnElement[bool]],
    tenant_id: Any,
) -> Select[Any]:
    """`match_first`'s answer as one ranked select: the rows matching any of `clauses`, each ranked by
    the first it matches, best rank first, then in key order (`n`), at most one more than shown.
    The rows of the best rank present are exactly what `match_first` returns."""
    rank = case(*((clause, i) for i, clause in enumerate(clauses)), else_=len(clauses))
    order = (rank, *model.__mapper__.primary_key)
    return (
        select(rank.label("rank"), func.row_number().over(order_by=order).label("n"), *columns)
        .where(_column(model, "tenant_id") == tenant_id, or_(*clauses))
        .order_by(*order)
        .limit(MAX_CANDIDATES + 1)
    )


def _best_rank(rows: Sequence[Row[Any]]) -> list[Row[Any]]:
    return [row for row in rows if row.rank == rows[0].rank]


def _user_columns() -> list[ColumnElement[Any] | InstrumentedAttribute[Any]]:
    return [
        literal_column("false", Boolean).label("contact"),
        User.id.label("user_id"),
        User.display_name.label("name"),
        User.email,
        null().label("company"),
        User.tz,
    ]


def _caller_branch() -> Select[Any]:
    """The caller's own row shaped as a branch of the people union (ref -1, so it sorts first): read
    by key, active or not, as `session.get` would, in the same round trip as the people named."""
    return select(
        literal_column("0", Integer).label("rank"),
        literal_column("1", Integer).label("n"),
        literal_column("-1", Integer).label("ref"),
        *_user_columns(),
    ).where(User.tenant_id == bindparam("tenant_id"), User.id == bindparam("caller_id"))


def _user_of(ctx: ToolContext, row: Row[Any]) -> User:
    return User(tenant_id=ctx.tenant_id, id=row.user_id, display_name=row.name, email=row.email, tz=row.tz)


@functools.lru_cache(maxsize=64)
def _people_statement(refs: int, with_caller: bool) -> CompoundSelect[Any]:
    """The people union for `refs` names (and the caller), built once per shape with every value a
    bound parameter: building it per call, and generating its cache key, cost more Python than its
    round trip (docs/benchmark.md, "schedule_meeting, third pass")."""
    contact_columns: list[ColumnElement[Any] | InstrumentedAttribute[Any]] = [
        literal_column("true", Boolean).label("contact"),
        null().label("user_id"),
        Contact.name,
        Contact.email,
        Contact.company,
        null().label("tz"),
    ]
    tenant = bindparam("tenant_id", type_=String)
    branches = [_caller_branch()] if with_caller else []
    for i in range(refs):
        index = literal_column(str(i), Integer).label("ref")  # which ref a row answers
        ref = Ref.bound(i)
        users = _best_first(User, [index, *_user_columns()], user_clauses(ref), tenant)
        contacts = _best_first(Contact, [index, *contact_columns], contact_clauses(ref), tenant)
        branches += [users, contacts]
    # by output names: no subqueries to build column collections for
    return union_all(*branches).order_by("ref", "contact", "n")


async def _read_people(
    ctx: ToolContext, refs: Sequence[str], *, with_caller: bool
) -> tuple[User | None, list[tuple[list[User], list[Contact]]]]:
    """The caller's row (when `with_caller`, else None) and, for each of `refs`, what `match_users`
    and `match_contacts` find, all in one round trip (a union of their ranked selects). The rows
    come back as unattached `User` and `Contact` objects holding what a person is made of."""
    if not refs and not with_caller:
        return None, []
    values = {"tenant_id": ctx.tenant_id} | ({"caller_id": ctx.caller.user_id} if with_caller else {})
    for i, ref in enumerate(refs):
        values |= Ref.values(i, ref)
    statement = _people_statement(len(refs), with_caller)
    rows = (await ctx.session.execute(statement, values)).all()
    caller = next((_user_of(ctx, row) for row in rows if row.ref == -1), None)
    found = []
    for i in range(len(refs)):
        user_rows = _best_rank([row for row in rows if row.ref == i and not row.contact])
        contact_rows = _best_rank([row for row in rows if row.ref == i and row.contact])
        contacts_found = [
            Contact(tenant_id=ctx.tenant_id, name=r.name, email=r.email, company=r.company)
            for r in contact_rows
        ]
        found.append(([_user_of(ctx, r) for r in user_rows], contacts_found))
    return caller, found


async def match_people(ctx: ToolContext, refs: Sequence[str]) -> list[tuple[list[User], list[Contact]]]:
    """For each of `refs`, what `match_users` and `match_contacts` find, all in one round trip."""
    return (await _read_people(ctx, refs, with_caller=False))[1]


async def resolve_user(ctx: ToolContext, ref: str, *, field: str) -> User:
    """A user of the tenant by id, email or display name (or part of it); `Needs` unless exactly one."""
    users = await match_users(ctx, ref)
    if len(users) == 1:
        return users[0]
    if not users:  # offer the tenant's people, so the model can ask "which of these?"
        users = list(
            (
                await ctx.session.scalars(select(User).where(User.tenant_id == ctx.tenant_id, ACTIVE_USER))
            ).all()
        )
    raise needs(field, [user_candidate(user) for user in users])


async def resolve_contact(ctx: ToolContext, ref: str, *, field: str) -> Contact:
    """A contact by email or name (or part of it); NOT_FOUND when none, `Needs` when several."""
    contacts = await match_contacts(ctx, ref)
    if not contacts:
        raise ToolFailure("NOT_FOUND", f"no contact {ref!r} in this workspace")
    if len(contacts) > 1:
        raise needs(field, [contact_candidate(contact) for contact in contacts])
    return contacts[0]


@dataclass(frozen=True)
class Person:
    """Someone whose calendar matters: a user of the tenant or a contact (known by email only).

    `key` names them canonically (for locks); `handles` are the values that mark them in an event's
    `attendees` (an event also belongs to the user who owns it). `tz` is a user's time zone, read
    with them (so no call reads the user twice); a contact has none.
    """

    key: str
    name: str
    email: str | None
    user_id: str | None
    handles: tuple[str, ...]
    tz: str | None = None

    def attendee(self) -> str:
        """How this person is written in a new event's `attendees`."""
        return self.user_id or self.email or self.name

    @classmethod
    def of_user(cls, user: User) -> Person:
        handles = (user.id, user.email.lower())
        return cls(f"user:{user.id}", user.display_name, user.email, user.id, handles, user.tz)

    @classmethod
    def of_contact(cls, contact: Contact) -> Person:
        email = (contact.email or "").lower()
        return cls(f"email:{email}", contact.name, contact.email, None, (email,) if email else ())


def person_named(ref: str, users: Sequence[User], matched: Sequence[Contact], *, field: str) -> Person:
    """The one person `ref` names among the users and contacts it matched (`match_people`). A contact
    with a user's email is that user.

    `Needs` when several people match (listing them), NOT_FOUND when nobody does.
    """
    user_emails = {user.email.lower() for user in users}
    contacts = [c for c in matched if (c.email or "").lower() not in user_emails]
    people = [Person.of_user(user) for user in users] + [Person.of_contact(c) for c in contacts]
    if not people:
        raise ToolFailure("NOT_FOUND", f"nobody named {ref!r} in this workspace (users or contacts)")
    if len(people) > 1:
        raise needs(field, [user_candidate(u) for u in users] + [contact_candidate(c) for c in contacts])
    if people[0].user_id is None and not people[0].handles:
        raise ToolFailure("NOT_FOUND", f"contact {people[0].name!r} has no email address to invite")
    return people[0]


async def resolve_person(ctx: ToolContext, ref: str, *, field: str) -> Person:
    """A user or a contact by id, email or name (`person_named`)."""
    [(users, contacts)] = await match_people(ctx, [ref])
    return person_named(ref, users, contacts, field=field)


def not_a_user() -> ToolFailure:
    return ToolFailure("UNAUTHORIZED", "the conversation's user is not a user of this workspace")


async def resolve_caller(ctx: ToolContext) -> Person:
    user = await ctx.session.get(User, (ctx.tenant_id, ctx.caller.user_id))
    if user is None:
        raise not_a_user()
    return Person.of_user(user)


async def caller_and_person(ctx: ToolContext, ref: str, *, field: str) -> tuple[Person, Person]:
    """`resolve_caller` and `resolve_person` in one round trip: the caller's row rides in the people
    union (the caller checked first, as when read apart)."""
    caller, [(users, contacts)] = await _read_people(ctx, [ref], with_caller=True)
    if caller is None:
        raise not_a_user()
    return Person.of_user(caller), person_named(ref, users, contacts, field=field)


async def resolve_attendees(ctx: ToolContext, refs: Sequence[str]) -> list[str]:
    """How each invitee is written in `attendees`: a user's id, a contact's email, or an outside email.
    All of them are read in one round trip; the first that names nobody usable stops the call."""
    handles = []
    for ref, (users, contacts) in zip(refs, await match_people(ctx, refs), strict=True):
        try:
            handles.append(person_named(ref, users, contacts, field="attendees").attendee())
        except ToolFailure:
            if "@" not in ref:
                raise needs("attendees") from None
            handles.append(ref.lower())  # someone outside the workspace's records, invited by address
    return handles


def belongs_to(person: Person) -> ColumnElement[bool]:
    """Events on `person`'s calendar: owned by them, or listing one of their handles as an attendee."""
    return events_of(person.user_id, person.handles)


def events_of(user_id: Any | None, handles: Sequence[Any]) -> ColumnElement[bool]:
    """`belongs_to` from a person's user id (None: a contact) and handles, values or bound parameters."""
    owned = [CalendarEvent.owner_user_id == user_id] if user_id is not None else []
    invited = [CalendarEvent.attendees.op("?")(handle) for handle in handles]
    return or_(*owned, *invited)


def overlapping(start: datetime | None, end: datetime | None) -> ColumnElement[bool]:
    """Live (not cancelled) events overlapping [start, end); a None bound is open."""
    clauses = [CalendarEvent.status != "cancelled"]
    if start is not None:
        clauses.append(CalendarEvent.ends_at > start)
    if end is not None:
        clauses.append(CalendarEvent.starts_at < end)
    return and_(*clauses)


# --- records as tools answer with them, changes and their undo -------------------------------------


class RowView(BaseModel):
    """Base of a result model read from a database row: `View.model_validate(row)` takes each field
    from the row's attribute of its name, or of its `validation_alias` where the model's name is
    not the column's (`owner` for `owner_user_id`); the name is accepted too."""

    model_config = ConfigDict(from_attributes=True, validate_by_name=True)


def as_json(value: Any) -> Any:
    """The JSON form a value takes in a tool's recorded result (dates as ISO strings)."""
    return to_jsonable_python(value)


class Updated(BaseModel, Generic[V]):
    """What an update tool did: the record as it is now, and the old and new values of changed columns."""

    record: V
    previous: dict[str, Any]
    changed: dict[str, Any]


def apply_changes(row: Base, wanted: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Set the `wanted` column values that differ from the row's; return (previous, changed) as JSON."""
    previous: dict[str, Any] = {}
    changed: dict[str, Any] = {}
    for name, value in wanted.items():
        current = getattr(row, name)
        if as_json(current) != as_json(value):
            previous[name], changed[name] = as_json(current), as_json(value)
            setattr(row, name, value)
    return previous, changed


def _from_json(row: Base, name: str, value: Any) -> Any:
    column_type = row.__table__.c[name].type
    if value is not None and isinstance(column_type, DateTime):
        return datetime.fromisoformat(value)
    if value is not None and isinstance(column_type, Date):
        return date.fromisoformat(value)
    return value


def _faithful(value: Any) -> bool:
    text = str(value)
    return not any(marker in text for marker in UNFAITHFUL_MARKERS)


def restore_fields(
    row: Base, previous: dict[str, Any], changed: dict[str, Any], *, together: Sequence[set[str]] = ()
) -> UndoOutcome:
    """Undo an update: put back `previous` for each field still holding its `changed` value.

    "undone" when every changed field is back, "already_undone" when they all were already. A field a
    later change moved on (or whose recorded old value was redacted or truncated) is left as it is,
    and so are the other fields of its `together` group (an event's start and end, say); that is
    logged and makes the outcome "irreversible", so the saga flags it to a human.
    """
    pending = {name for name, new in changed.items() if as_json(getattr(row, name)) != previous.get(name)}
    kept = {
        name
        for name in pending
        if as_json(getattr(row, name)) != changed[name] or not _faithful(previous.get(name))
    }
    for group in together:
        if kept & group:
            kept |= group & pending
    for name in sorted(pending - kept):
        setattr(row, name, _from_json(row, name, previous.get(name)))
    if kept:
        log.warning("undo left fields changed since", table=row.__tablename__, kept=sorted(kept))
        return "irreversible"
    return "undone" if pending else "already_undone"


async def locked_row(ctx: ToolContext, model: type[M], row_id: Any) -> M | None:
    """The tenant's row of `model` with this id, locked for the rest of the transaction."""
    if not isinstance(row_id, int):
        return None
    rows = await match_first(ctx, model, _column(model, "id") == row_id, lock=True)
    return rows[0] if rows else None


async def undo_update(
    ctx: ToolContext, model: type[Base], result: dict[str, Any] | None, *, together: Sequence[set[str]] = ()
) -> UndoOutcome:
    """The compensation of an update tool whose result is an `Updated` record."""
    if result is None or not result.get("changed"):
        return "never_happened"  # not committed, or the call changed nothing
    row = await locked_row(ctx, model, result.get("record", {}).get("id"))
    if row is None:
        return "irreversible"  # deleted since: nothing left to restore
    return restore_fields(row, result.get("previous", {}), result["changed"], together=together)


async def cancel_created(ctx: ToolContext, model: type[Base], result: dict[str, Any] | None) -> UndoOutcome:
    """The compensation of a create tool: mark the created row cancelled, unless someone moved it on.

    The result must carry the row's `id` and the `status` it was created with. A row whose status was
    changed since (a task done, an event moved to tentative) is left alone: "irreversible".
    """
    if result is None:
        return "never_happened"
    row = await locked_row(ctx, model, result.get("id"))
    if row is None:
        return "never_happened"
    return restore_fields(row, {"status": "cancelled"}, {"status": result.get("status")})


async def saved(ctx: ToolContext, row: M) -> M:
    """Flush a new or changed row and reload it, so server-set columns (ids, timestamps) are readable."""
    ctx.session.add(row)
    await ctx.session.flush()
    await ctx.session.refresh(row)
    return row

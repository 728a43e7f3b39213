"""Generic record tools for the admin-assistant: read any whitelisted collection, and (admins) write.

`COLLECTIONS` is the whole whitelist, in one place: which tables the model may name, and for each the
fields it sees, may write and may search. The read list and the write list are apart, as the design's
read/write whitelist: every collection is readable, only `WRITABLE_COLLECTIONS` (the business records
people keep by hand) can be written, and a write to a read-only one is refused while the arguments
are validated, naming the collections that can be written. Internal tables (approvals, proofs, audit,
people, tokens, conversations, permissions) are in neither list: no tool can name them.

A collection or field name is only ever a key into that map, never text put into SQL: queries are
SQLAlchemy Core built from the ORM tables, values are bound parameters coerced to their column's
type, and every statement is scoped to the caller's tenant. `tenant_id` and internal columns are in
no list, so they can be neither read, filtered, ordered nor written. Names and values are checked
while the arguments are validated, so a bad call fails with VALIDATION_ERROR before a reviewer is
ever asked to approve it.

write_record returns what it changed (`written`) and, for an update, what was there before
(`previous`), with a checksum over both: its compensation restores exactly that, and only while the
record still holds what the call wrote. The checksum catches a result the guards redacted or
truncated (a before-image with "[REDACTED]" in it must not be written back).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any, Literal, cast, get_args

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic.config import JsonDict
from pydantic_core import to_jsonable_python
from sqlalchemy import (
    JSON,
    Column,
    ColumnElement,
    Date,
    DateTime,
    Float,
    Integer,
    Select,
    String,
    Table,
    delete,
    func,
    insert,
    literal,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import REGCONFIG
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.expression import cast as sql_cast

from countersign.core.authority import ADMIN
from countersign.core.effects import Creation, Effect, one_line
from countersign.core.guards import MAX_ROWS
from countersign.db.leads import forget_status_change, record_lead_event, rescore_attendees, rescore_ids
from countersign.db.schema import (
    CASE_STATUSES,
    EMAIL_STATUSES,
    EVENT_STATUSES,
    EVENT_TYPES,
    LEAD_STATUSES,
    MEETING_SESSION_STATUSES,
    NOTIFICATION_STATUSES,
    PROJECT_STATUSES,
    TASK_STATUSES,
    Base,
    CalendarEvent,
    Case,
    Contact,
    EmailDraft,
    EmailOutbox,
    Lead,
    MeetingSession,
    Notification,
    Project,
    Task,
)
from tools.effects import json_fields, record_change
from tools.registry import (
    Plan,
    ToolArgs,
    ToolContext,
    ToolFailure,
    UndoOutcome,
    compensates,
    out_of_range,
    tool,
)

# --- the whitelist -----------------------------------------------------------------------------------

WritableCollection = Literal["leads", "contacts", "tasks", "projects", "calendar_events"]
ReadOnlyCollection = Literal["cases", "notifications", "email_drafts", "email_outbox", "meeting_sessions"]
CollectionName = Literal[WritableCollection, ReadOnlyCollection]
FilterOp = Literal["eq", "ne", "lt", "lte", "gt", "gte", "contains", "in"]
Kind = Literal["text", "integer", "number", "date", "datetime", "string_list"]

# Columns no one writes through a generic tool, whatever a collection declares.
NEVER_WRITABLE = frozenset({"id", "tenant_id", "created_at", "updated_at"})


@dataclass(frozen=True)
class Collection:
    model: type[Base]
    fields: tuple[str, ...]  # what the model sees, in this order; `id` first
    writable: tuple[str, ...]  # empty for a read-only collection
    searchable: tuple[str, ...]  # text fields search_text looks in
    choices: Mapping[str, tuple[str, ...]]  # fields restricted to a set of values
    # Undoing a create: set `status` to this (rows others may reference, history worth keeping), or
    # delete the row when None.
    cancelled_status: str | None = None
    creator_field: str | None = None  # stamped with the caller's user id on create
    # A field holding a parent record's id, and the parent's collection: `tasks.project_id ->
    # projects.id`. The schema map states each link, so the model resolves a parent named in words
    # to its id before it filters the children (tests hold these against the tables' foreign keys).
    links: Mapping[str, str] = field(default_factory=dict)

    @property
    def table(self) -> Table:
        return cast(Table, self.model.__table__)

    def column(self, name: str) -> Column[Any]:
        return self.table.c[name]

    def kind(self, name: str) -> Kind:
        return kind_of(self.column(name))

    def required_on_create(self) -> tuple[str, ...]:
        """Writable fields the database needs on insert: not nullable and without a server default."""
        return tuple(
            name
            for name in self.writable
            if not self.column(name).nullable and self.column(name).server_default is None
        )

    def select(self, tenant_id: str, names: Iterable[str] | None = None) -> Select[Any]:
        """SELECT the given (default: all exposed) fields of this tenant's rows."""
        return select(*(self.column(n) for n in (names or self.fields))).where(
            self.column("tenant_id") == tenant_id
        )


COLLECTIONS: dict[CollectionName, Collection] = {
    "leads": Collection(
        Lead,
        fields=("id", "email", "name", "company", "status", "source", "notes", "owner_user_id",
                "score", "last_engaged_at", "created_at", "updated_at"),
        writable=("email", "name", "company", "status", "source", "notes", "owner_user_id"),
        searchable=("name", "email", "company", "notes"),
        choices={"status": LEAD_STATUSES},
    ),
    "contacts": Collection(
        Contact,
        fields=("id", "name", "email", "phone", "company", "notes", "created_at", "updated_at"),
        writable=("name", "email", "phone", "company", "notes"),
        searchable=("name", "email", "company", "notes"),
        choices={},
    ),
    "tasks": Collection(
        Task,
        fields=("id", "title", "description", "status", "due_date", "assignee_user_id", "project_id",
                "created_by", "created_at", "updated_at"),
        writable=("title", "description", "status", "due_date", "assignee_user_id", "project_id"),
        searchable=("title", "description"),
        choices={"status": TASK_STATUSES},
        cancelled_status="cancelled",
        creator_field="created_by",
        links={"project_id": "projects"},
    ),
    "projects": Collection(
        Project,
        fields=("id", "name", "description", "status", "owner_user_id", "due_date", "created_at",
                "updated_at"),
        writable=("name", "description", "status", "owner_user_id", "due_date"),
        searchable=("name", "description"),
        choices={"status": PROJECT_STATUSES},
        cancelled_status="cancelled",
    ),
    "calendar_events": Collection(
        CalendarEvent,
        fields=("id", "title", "description", "starts_at", "ends_at", "attendees", "location",
                "owner_user_id", "status", "type", "created_at", "updated_at"),
        writable=("title", "description", "starts_at", "ends_at", "attendees", "location", "owner_user_id",
                  "status", "type"),
        searchable=("title", "description", "location"),
        choices={"status": EVENT_STATUSES, "type": EVENT_TYPES},
        cancelled_status="cancelled",
    ),
    # --- read only: records other tools (or people) own; the agent reads them, never writes them ---
    "cases": Collection(  # update_case (approval, compensable) is the one way to change a case
        Case,
        fields=("id", "title", "status", "contact_email", "notes", "created_at", "updated_at"),
        writable=(),
        searchable=("title", "contact_email", "notes"),
        choices={"status": CASE_STATUSES},
    ),
    "notifications": Collection(  # workflow_id / call_id are internal links to the raising call
        Notification,
        fields=("id", "user_id", "kind", "message", "status", "created_at", "resolved_at", "resolved_by"),
        writable=(),
        searchable=("kind", "message"),
        choices={"status": NOTIFICATION_STATUSES},
    ),
    "email_drafts": Collection(  # idempotency_key is internal
        EmailDraft,
        fields=("id", "created_by", "to_address", "subject", "body", "lead_id", "created_at"),
        writable=(),
        searchable=("to_address", "subject", "body"),
        choices={},
        links={"lead_id": "leads"},
    ),
    "email_outbox": Collection(  # what was sent or queued; errors and attempts are the operator's
        EmailOutbox,
        fields=("id", "to_address", "subject", "body", "status", "lead_id", "created_at", "sent_at"),
        writable=(),
        searchable=("to_address", "subject", "body"),
        choices={"status": EMAIL_STATUSES},
        links={"lead_id": "leads"},
    ),
    "meeting_sessions": Collection(  # proposals (JSON slots) are read through the scheduler's tools
        MeetingSession,
        fields=("id", "requested_by", "counterpart_name", "counterpart_email", "title", "duration_minutes",
                "status", "expires_at", "event_id", "created_at"),
        writable=(),
        searchable=("counterpart_name", "counterpart_email", "title"),
        choices={"status": MEETING_SESSION_STATUSES},
        links={"event_id": "calendar_events"},
    ),
}  # fmt: skip

# A writable collection's records by the kind every other tool's plan names them with (a lead is a
# "lead" whichever tool changes it), so one policy on `context.effect` covers them all.
RECORD_KINDS: dict[WritableCollection, str] = {
    "leads": "lead",
    "contacts": "contact",
    "tasks": "task",
    "projects": "project",
    "calendar_events": "event",
}
WRITABLE_COLLECTIONS: tuple[WritableCollection, ...] = get_args(WritableCollection)
READ_ONLY_COLLECTIONS: tuple[ReadOnlyCollection, ...] = get_args(ReadOnlyCollection)

# The names any collection exposes, as an enum in the schemas; which apply is checked per collection.
FIELD_NAMES: JsonDict = {"enum": [*sorted({name for c in COLLECTIONS.values() for name in c.fields})]}

OPS_BY_KIND: dict[Kind, tuple[FilterOp, ...]] = {
    "text": ("eq", "ne", "lt", "lte", "gt", "gte", "contains", "in"),
    "integer": ("eq", "ne", "lt", "lte", "gt", "gte", "in"),
    "number": ("eq", "ne", "lt", "lte", "gt", "gte", "in"),
    "date": ("eq", "ne", "lt", "lte", "gt", "gte", "in"),
    "datetime": ("eq", "ne", "lt", "lte", "gt", "gte", "in"),
    "string_list": ("contains",),  # "has this element"
}


def kind_of(column: Column[Any]) -> Kind:
    """The kind of value a column holds, from its SQLAlchemy type (JSON columns here hold string lists)."""
    kinds: list[tuple[type[Any], Kind]] = [
        (JSON, "string_list"),
        (DateTime, "datetime"),
        (Date, "date"),
        (Integer, "integer"),
        (Float, "number"),
        (String, "text"),
    ]
    for sql_type, kind in kinds:
        if isinstance(column.type, sql_type):
            return kind
    raise TypeError(f"column {column} has a type the record tools do not handle: {column.type}")


def check_whitelist() -> None:
    """Refuse, at import, a whitelist that would expose or write what it must not."""
    if set(WRITABLE_COLLECTIONS) | set(READ_ONLY_COLLECTIONS) != set(COLLECTIONS):
        raise TypeError("the read and write lists and COLLECTIONS name different collections")
    for name, c in COLLECTIONS.items():
        if bool(c.writable) != (name in WRITABLE_COLLECTIONS):
            raise TypeError(f"{name}: writable fields exactly when it is in the write list")
        unknown = set(c.fields) - set(c.table.c.keys())
        bad_writes = (set(c.writable) - set(c.fields)) | (set(c.writable) & NEVER_WRITABLE)
        bad_search = {f for f in c.searchable if f not in c.fields or c.kind(f) != "text"}
        if "tenant_id" in c.fields or unknown or bad_writes or bad_search or c.fields[0] != "id":
            raise TypeError(f"whitelist of {name} is wrong: {unknown=} {bad_writes=} {bad_search=}")
        for f in c.fields:
            c.kind(f)  # every exposed type is one we coerce


check_whitelist()


# --- the schema map in the prompt ------------------------------------------------------------------

# The record tools whose agent gets the schema map in its prompt (load_conversation_context).
RECORD_TOOLS = frozenset(
    {"query_records", "get_record", "count_records", "describe_collection", "search_text"}
)
# The design spends about 2,000 tokens on its schema map; ours must stay under that (tested).
SCHEMA_MAP_TOKENS = 2_000
SHORT_KIND: dict[Kind, str] = {
    "text": "text",
    "integer": "int",
    "number": "num",
    "date": "date",
    "datetime": "time",
    "string_list": "list",
}


def field_line(c: Collection, name: str, required: tuple[str, ...]) -> str:
    """One field as the map shows it: `name:kind`, `!` when a create needs it, `^` when a writable
    collection's field cannot be written, `=a|b` its choices."""
    mark = "!" if name in required else "^" if c.writable and name not in c.writable else ""
    choices = f"={'|'.join(c.choices[name])}" if name in c.choices else ""
    return f"{name}:{SHORT_KIND[c.kind(name)]}{mark}{choices}"


@functools.cache
def schema_map() -> str:
    """Every whitelisted collection with its fields, types, choices and whether it can be written:
    what describe_collection would answer, in one compact text for the system prompt, so the model
    spends no iteration on learning the schema. Generated from COLLECTIONS, so it cannot drift from
    what the tools accept; deterministic (the whitelist's order), the same for every conversation."""
    lines = [
        "Collections you can read (fields as name:type; `!` = needed to create; `^` = never written; "
        "a=b|c = allowed values; time = ISO 8601, UTC by default; date = YYYY-MM-DD). write_record "
        "writes only the collections marked WRITABLE; no need to call describe_collection for these:"
    ]
    for name, c in COLLECTIONS.items():
        required = c.required_on_create()
        access = "WRITABLE" if c.writable else "read-only"
        fields = " ".join(field_line(c, f, required) for f in c.fields)
        lines.append(f"- {name} ({access}; search_text: {','.join(c.searchable)}): {fields}")
    links = ", ".join(
        f"{name}.{child} -> {parent}.id"
        for name, c in COLLECTIONS.items()
        for child, parent in c.links.items()
    )
    lines.append(
        f"Links (a child's field holds its parent's id): {links}. To read the children of a parent named "
        "in words (the open tasks of project Apollo), first find the parent's id (query_records projects "
        "where name contains Apollo), then filter the children by it (tasks where project_id eq that id "
        "and status eq open). A question about one collection alone needs no join."
    )
    return "\n".join(lines)


def known_field(collection: CollectionName, name: str, where: str) -> Collection:
    """The collection, once `name` is one of its exposed fields; ValueError otherwise."""
    c = COLLECTIONS[collection]
    if name not in c.fields:
        raise ValueError(f"{where}: {collection} has no field {name!r} (fields: {', '.join(c.fields)})")
    return c


# --- values ------------------------------------------------------------------------------------------

Value = str | int | float | bool | list[str | int | float] | None
MAX_TEXT = 20_000
MAX_LIST = 100
INTEGER = re.compile(r"-?\d{1,18}")


def as_text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("expected a string")
    if len(value) > MAX_TEXT:
        raise ValueError(f"longer than {MAX_TEXT} characters")
    return value


def as_integer(value: Any) -> int:
    if isinstance(value, str) and INTEGER.fullmatch(value.strip()):
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("expected an integer")
    return value


def as_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError("expected a number")
    try:
        return float(value)
    except ValueError:
        raise ValueError("expected a number") from None


def as_date(value: Any) -> date:
    if not isinstance(value, str):
        raise ValueError("expected a date as YYYY-MM-DD")
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a date as YYYY-MM-DD") from None


def as_datetime(value: Any) -> datetime:
    """An ISO 8601 date-time; one without an offset is taken as UTC (what the agents' prompts say)."""
    if not isinstance(value, str):
        raise ValueError("expected an ISO 8601 date-time")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an ISO 8601 date-time") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def as_string_list(value: Any) -> list[str]:
    if not isinstance(value, list) or len(value) > MAX_LIST:
        raise ValueError(f"expected a list of at most {MAX_LIST} strings")
    return [as_text(v) for v in value]


COERCE = {
    "text": as_text,
    "integer": as_integer,
    "number": as_number,
    "date": as_date,
    "datetime": as_datetime,
    "string_list": as_string_list,
}


def coerce(c: Collection, name: str, value: Any) -> Any:
    """`value` as the Python type of field `name`, or ValueError naming the field and the problem."""
    if value is None:
        if not c.column(name).nullable:
            raise ValueError(f"{name} cannot be null")
        return None
    try:
        result = COERCE[c.kind(name)](value)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    problem = out_of_range(result)
    if problem is not None:
        raise ValueError(f"{name}: {problem}")
    allowed = c.choices.get(name)
    if allowed is not None and result not in allowed:
        raise ValueError(f"{name}: {result!r} is not one of {', '.join(allowed)}")
    return result


def jsonable(row: Mapping[Any, Any]) -> dict[str, Any]:
    """A row as the JSON the model sees (ISO dates and times)."""
    return {str(k): to_jsonable_python(v) for k, v in row.items()}


# --- filters and ordering ----------------------------------------------------------------------------


class Filter(ToolArgs):
    field: str = Field(description="A field of the collection", json_schema_extra=FIELD_NAMES)
    op: FilterOp = Field(description="contains: case-insensitive substring (text) or list element")
    value: Value = Field(description="Compared value; a list for `in`; null with eq/ne tests emptiness")


class Order(ToolArgs):
    field: str = Field(description="A field of the collection", json_schema_extra=FIELD_NAMES)
    direction: Literal["asc", "desc"] | None = Field(None, description="asc (the default) or desc")


def escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def compare(column: Column[Any], op: FilterOp, value: Any) -> ColumnElement[bool]:
    comparisons = {
        "eq": column.__eq__,
        "ne": column.is_distinct_from,  # unlike `!=`, keeps rows where the field is empty
        "lt": column.__lt__,
        "lte": column.__le__,
        "gt": column.__gt__,
        "gte": column.__ge__,
    }
    return comparisons[op](value)


def condition(collection: CollectionName, f: Filter, where: str) -> ColumnElement[bool]:
    """The SQL condition of one filter; ValueError explains a filter that makes no sense."""
    c = known_field(collection, f.field, where)
    column, kind = c.column(f.field), c.kind(f.field)
    if f.op not in OPS_BY_KIND[kind]:
        raise ValueError(f"{where}: {f.field} ({kind}) supports {', '.join(OPS_BY_KIND[kind])}, not {f.op}")
    if f.op == "in":
        if not isinstance(f.value, list) or not 1 <= len(f.value) <= MAX_LIST:
            raise ValueError(f"{where}: `in` takes a list of 1 to {MAX_LIST} values (no nulls)")
        return column.in_([coerce(c, f.field, v) for v in f.value])
    if isinstance(f.value, list):
        raise ValueError(f"{where}: only `in` takes a list")
    if f.value is None:
        if f.op not in ("eq", "ne"):
            raise ValueError(f"{where}: null only works with eq and ne")
        return column.is_(None) if f.op == "eq" else column.is_not(None)
    if f.op == "contains":
        try:
            text = as_text(f.value)
        except ValueError as exc:
            raise ValueError(f"{where}: {f.field}: {exc}") from None
        if kind == "string_list":
            return column.contains([text])
        return column.ilike(f"%{escape_like(text)}%", escape="\\")
    return compare(column, f.op, coerce(c, f.field, f.value))


def conditions(collection: CollectionName, filters: Sequence[Filter]) -> list[ColumnElement[bool]]:
    return [condition(collection, f, f"filters[{i}]") for i, f in enumerate(filters)]


def ordering(collection: CollectionName, orders: Sequence[Order]) -> list[ColumnElement[Any]]:
    """ORDER BY terms, ending with `id` so that pages are stable."""
    terms: list[ColumnElement[Any]] = []
    for i, o in enumerate(orders):
        c = known_field(collection, o.field, f"order_by[{i}]")
        if c.kind(o.field) == "string_list":
            raise ValueError(f"order_by[{i}]: cannot order by the list field {o.field}")
        terms.append(c.column(o.field).desc() if o.direction == "desc" else c.column(o.field).asc())
    return [*terms, COLLECTIONS[collection].column("id").asc()]


# --- arguments and results -----------------------------------------------------------------------------

COLLECTION_DESCRIPTION = "One of the whitelisted collections (describe_collection lists its fields)"


class FilteredArgs(ToolArgs):
    collection: CollectionName = Field(description=COLLECTION_DESCRIPTION)
    filters: list[Filter] = Field([], max_length=20, description="All must hold")

    @model_validator(mode="after")
    def _filters_fit_collection(self) -> FilteredArgs:
        conditions(self.collection, self.filters)
        return self


class QueryRecordsArgs(FilteredArgs):
    order_by: list[Order] = Field([], max_length=5, description="Sort keys, first is most significant")
    limit: int = Field(20, ge=1, le=MAX_ROWS, description="Most records to return")

    @model_validator(mode="after")
    def _order_fits_collection(self) -> QueryRecordsArgs:
        ordering(self.collection, self.order_by)
        return self


class CountRecordsArgs(FilteredArgs):
    pass


class CollectionArgs(ToolArgs):
    collection: CollectionName = Field(description=COLLECTION_DESCRIPTION)


class GetRecordArgs(CollectionArgs):
    id: int = Field(ge=1, description="The record's id, as query_records or search_text returned it")


class SearchTextArgs(ToolArgs):
    query: str = Field(
        min_length=1, max_length=200, description='Words to find; "quoted phrase", OR, -excluded work'
    )
    collections: list[CollectionName] | None = Field(
        None, min_length=1, description="Where to look (default: every searchable collection)"
    )
    limit: int = Field(10, ge=1, le=50, description="Most hits to return, best first")


class FieldValue(ToolArgs):
    field: str = Field(description="A writable field", json_schema_extra=FIELD_NAMES)
    value: Value = Field(description="The new value (dates YYYY-MM-DD, times ISO 8601, UTC by default)")


def write_refusal(collection: Any) -> str | None:
    """Why write_record may not write `collection` (a read-only or unknown one), or None."""
    if collection in WRITABLE_COLLECTIONS:
        return None
    writable = ", ".join(WRITABLE_COLLECTIONS)
    if collection in READ_ONLY_COLLECTIONS:
        return f"{collection} is read-only: it can be read, never written (write_record writes {writable})"
    return f"{collection!r} is not a collection write_record writes (it writes {writable})"


class WriteRecordArgs(ToolArgs):
    collection: WritableCollection = Field(description="One of the collections that can be written")
    id: int | None = Field(None, ge=1, description="The record to update; omit to create one")
    values: list[FieldValue] = Field(min_length=1, max_length=30, description="Fields to set")

    @field_validator("collection", mode="before")
    @classmethod
    def _writable_collection(cls, value: Any) -> Any:
        """Name the read list's refusal instead of the schema's bare enum mismatch."""
        refusal = write_refusal(value)
        if refusal is not None:
            raise ValueError(refusal)
        return value

    @field_validator("values", mode="before")
    @classmethod
    def _mapping_to_pairs(cls, value: Any) -> Any:
        """Also accept `{"field": value, ...}`: the schema says pairs only because strict mode must."""
        if isinstance(value, Mapping):
            return [{"field": k, "value": v} for k, v in value.items()]
        return value

    @model_validator(mode="after")
    def _values_fit_collection(self) -> WriteRecordArgs:
        coerced_values(self)
        return self


def coerced_values(args: WriteRecordArgs) -> dict[str, Any]:
    """The values to write, coerced; ValueError for an unwritable field or a missing required one."""
    c = COLLECTIONS[args.collection]
    values: dict[str, Any] = {}
    for i, pair in enumerate(args.values):
        known_field(args.collection, pair.field, f"values[{i}]")
        if pair.field not in c.writable:
            raise ValueError(f"values[{i}]: {pair.field} is read-only (writable: {', '.join(c.writable)})")
        if pair.field in values:
            raise ValueError(f"values[{i}]: {pair.field} is given twice")
        values[pair.field] = coerce(c, pair.field, pair.value)
    missing = [f for f in c.required_on_create() if f not in values] if args.id is None else []
    if missing:
        raise ValueError(f"creating a record in {args.collection} needs {', '.join(missing)}")
    return values


class RecordList(BaseModel):
    collection: str
    records: list[dict[str, Any]]
    count: int


class Record(BaseModel):
    collection: str
    record: dict[str, Any]


class RecordCount(BaseModel):
    collection: str
    count: int


class FieldInfo(BaseModel):
    name: str
    type: Kind
    nullable: bool
    filter_ops: list[FilterOp]
    sortable: bool
    writable: bool
    required_on_create: bool
    searchable: bool
    choices: list[str] | None


class CollectionInfo(BaseModel):
    collection: str
    fields: list[FieldInfo]


class SearchHit(BaseModel):
    collection: str
    id: int
    rank: float
    record: dict[str, Any]


class SearchResults(BaseModel):
    hits: list[SearchHit]
    count: int


class WriteResult(BaseModel):
    collection: str
    id: int
    created: bool
    written: dict[str, Any]  # the written fields as stored now (for a create: every writable field)
    previous: dict[str, Any] | None  # an update's written fields as they were before
    checksum: str  # over the above: a redacted or truncated copy is refused by the compensation


# --- read tools --------------------------------------------------------------------------------------


@tool(risk="low", category="read")
async def describe_collection(ctx: ToolContext, args: CollectionArgs) -> CollectionInfo:
    """Describe a collection: its fields, their types, which can be filtered, sorted, written, searched."""
    c = COLLECTIONS[args.collection]
    required = c.required_on_create()
    fields = [
        FieldInfo(
            name=name,
            type=c.kind(name),
            nullable=bool(c.column(name).nullable),
            filter_ops=list(OPS_BY_KIND[c.kind(name)]),
            sortable=c.kind(name) != "string_list",
            writable=name in c.writable,
            required_on_create=name in required,
            searchable=name in c.searchable,
            choices=list(c.choices[name]) if name in c.choices else None,
        )
        for name in c.fields
    ]
    return CollectionInfo(collection=args.collection, fields=fields)


@tool(risk="low", category="read")
async def query_records(ctx: ToolContext, args: QueryRecordsArgs) -> RecordList:
    """Read records of a collection that match all filters, sorted, at most `limit` of them."""
    query = (
        COLLECTIONS[args.collection]
        .select(ctx.tenant_id)
        .where(*conditions(args.collection, args.filters))
        .order_by(*ordering(args.collection, args.order_by))
        .limit(args.limit)
    )
    records = [jsonable(row) for row in (await ctx.session.execute(query)).mappings()]
    return RecordList(collection=args.collection, records=records, count=len(records))


@tool(risk="low", category="read")
async def count_records(ctx: ToolContext, args: CountRecordsArgs) -> RecordCount:
    """Count the records of a collection that match all filters."""
    c = COLLECTIONS[args.collection]
    query = (
        select(func.count())
        .select_from(c.table)
        .where(c.column("tenant_id") == ctx.tenant_id, *conditions(args.collection, args.filters))
    )
    return RecordCount(collection=args.collection, count=await ctx.session.scalar(query) or 0)


@tool(risk="low", category="read")
async def get_record(ctx: ToolContext, args: GetRecordArgs) -> Record:
    """Read one record of a collection by id."""
    c = COLLECTIONS[args.collection]
    row = (await ctx.session.execute(c.select(ctx.tenant_id).where(c.column("id") == args.id))).mappings()
    found = row.one_or_none()
    if found is None:
        raise ToolFailure("NOT_FOUND", f"no record {args.id} in {args.collection}")
    return Record(collection=args.collection, record=jsonable(found))


SIMPLE = sql_cast(literal("simple"), REGCONFIG)  # no stemming, no stop words: names and emails match


def text_search(c: Collection, tenant_id: str, text: str, limit: int) -> Select[Any]:
    """The collection's matching rows with their `ts_rank` as `_rank`, best first."""
    document = func.to_tsvector(SIMPLE, func.concat_ws(" ", *(c.column(f) for f in c.searchable)))
    query = func.websearch_to_tsquery(SIMPLE, text)
    rank = func.ts_rank(document, query).label("_rank")
    return (
        c.select(tenant_id)
        .add_columns(rank)
        .where(document.bool_op("@@")(query))
        .order_by(rank.desc(), c.column("id"))
        .limit(limit)
    )


@tool(risk="low", category="read")
async def search_text(ctx: ToolContext, args: SearchTextArgs) -> SearchResults:
    """Full-text search over the text fields of one or more collections (whole words; "phrases",
    OR and -word work). Best matches first."""
    hits: list[SearchHit] = []
    for name in args.collections or list(COLLECTIONS):
        rows = await ctx.session.execute(
            text_search(COLLECTIONS[name], ctx.tenant_id, args.query, args.limit)
        )
        for row in rows.mappings():
            record = jsonable({k: v for k, v in row.items() if k != "_rank"})
            hits.append(SearchHit(collection=name, id=record["id"], rank=row["_rank"], record=record))
    hits.sort(key=lambda h: (-h.rank, h.collection, h.id))
    return SearchResults(hits=hits[: args.limit], count=min(len(hits), args.limit))


# --- write_record and its compensation ---------------------------------------------------------------


def checksum(collection: str, record_id: int, written: Any, previous: Any) -> str:
    payload = json.dumps([collection, record_id, written, previous], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def write_result(
    collection: str, record_id: int, written: dict[str, Any], previous: dict[str, Any] | None
) -> WriteResult:
    return WriteResult(
        collection=collection,
        id=record_id,
        created=previous is None,
        written=written,
        previous=previous,
        checksum=checksum(collection, record_id, written, previous),
    )


def refused_fields(c: Collection, constraint: str | None) -> str:
    """The fields a constraint of the table covers, named as the model knows them (never tenant_id)."""
    for candidate in c.table.constraints:
        if candidate.name == constraint:
            names = [col.name for col in getattr(candidate, "columns", ()) if col.name != "tenant_id"]
            if names:
                return ", ".join(names)
    return "the values"


def refusal(exc: IntegrityError, c: Collection) -> ToolFailure:
    """What the database refused, in terms the model can act on (no SQL, no tenant)."""
    cause = getattr(exc.orig, "__cause__", None)
    state = getattr(cause, "sqlstate", None)
    fields = refused_fields(c, getattr(cause, "constraint_name", None))
    if state == "23505":
        return ToolFailure("CONFLICT", f"another record already has this {fields}")
    if state == "23503":
        return ToolFailure("VALIDATION_ERROR", f"{fields}: no such user or project in this workspace")
    return ToolFailure("VALIDATION_ERROR", f"{fields}: the values break a rule of the collection")


async def lock_row(
    ctx: ToolContext, c: Collection, record_id: int, names: Iterable[str], *, lock: bool = True
) -> dict[str, Any] | None:
    """The given fields of one of the tenant's records, locked until the transaction ends (`lock`)."""
    query = c.select(ctx.tenant_id, names).where(c.column("id") == record_id)
    query = query.with_for_update() if lock else query
    row = (await ctx.session.execute(query)).mappings().one_or_none()
    return None if row is None else jsonable(row)


async def write(ctx: ToolContext, c: Collection, statement: Any) -> dict[str, Any] | None:
    """Run an INSERT/UPDATE … RETURNING in a savepoint; a refused write becomes a ToolFailure."""
    try:
        async with ctx.session.begin_nested():
            row = (await ctx.session.execute(statement)).mappings().one_or_none()
    except IntegrityError as exc:
        raise refusal(exc, c) from exc
    return None if row is None else jsonable(row)


async def create_record(ctx: ToolContext, name: CollectionName, values: dict[str, Any]) -> WriteResult:
    c = COLLECTIONS[name]
    stamp = {c.creator_field: ctx.caller.user_id} if c.creator_field else {}
    statement = (
        insert(c.table)
        .values(tenant_id=ctx.tenant_id, **stamp, **values)
        .returning(c.column("id"), *(c.column(f) for f in c.writable))
    )
    row = await write(ctx, c, statement)
    assert row is not None  # an INSERT that did not fail returns its row
    record_id = row.pop("id")
    return write_result(name, record_id, row, None)


async def update_record(
    ctx: ToolContext, name: CollectionName, record_id: int, values: dict[str, Any], previous: dict[str, Any]
) -> WriteResult:
    """Write `values` over the record whose fields the plan read (and locked) as `previous`."""
    c = COLLECTIONS[name]
    statement = (
        update(c.table)
        .where(c.column("tenant_id") == ctx.tenant_id, c.column("id") == record_id)
        .values(**values)
        .returning(*(c.column(f) for f in values))
    )
    written = await write(ctx, c, statement)
    assert written is not None  # the row is locked: it is still there
    return write_result(name, record_id, written, previous)


def admin_values(ctx: ToolContext, args: WriteRecordArgs) -> dict[str, Any]:
    """The values to write, for an administrator only (the workflow checks roles first; this is
    defence in depth)."""
    if ADMIN not in ctx.caller.roles:
        raise ToolFailure("FORBIDDEN", "write_record is for administrators")
    return coerced_values(args)


@dataclass(kw_only=True)
class WritePlan(Plan):
    """The values to write (coerced to their columns); for a change, the fields as the plan read
    (and locked, when it runs) them: `previous`, None for a creation."""

    args: WriteRecordArgs
    values: dict[str, Any]
    previous: dict[str, Any] | None

    def effect(self) -> Effect:
        args, kind = self.args, RECORD_KINDS[self.args.collection]
        if self.previous is None:
            label = f"a {kind} in {args.collection}"
            created = Creation(kind=kind, label=label, fields=json_fields(self.values))
            return Effect(summary=one_line(f"Creates {label}: {created.fields}"), creates=[created])
        label = f"{kind} {args.id} in {args.collection}"
        return record_change(kind, args.id, label, self.previous, self.values)


async def plan_write_record(ctx: ToolContext, args: WriteRecordArgs) -> WritePlan:
    values = admin_values(ctx, args)
    if args.id is None:
        return WritePlan(args=args, values=values, previous=None)
    c = COLLECTIONS[args.collection]
    previous = await lock_row(ctx, c, args.id, values, lock=ctx.lock_reads)
    if previous is None:
        raise ToolFailure("NOT_FOUND", f"no record {args.id} in {args.collection}")
    return WritePlan(args=args, values=values, previous=previous)


@tool(risk="high", category="write", roles=(ADMIN,), plan=plan_write_record)
async def write_record(ctx: ToolContext, plan: WritePlan) -> WriteResult:
    """Create a record (no id) or change fields of one (with its id) in a collection. Administrators
    only. describe_collection tells which fields are writable and which a new record needs."""
    args, values = plan.args, plan.values
    if plan.previous is None or args.id is None:
        result = await create_record(ctx, args.collection, values)
    else:
        result = await update_record(ctx, args.collection, args.id, values, plan.previous)
        await lead_history(ctx, result, undone=False)
    await rescore_touched(ctx, result)
    return result


async def lead_history(ctx: ToolContext, recorded: WriteResult, *, undone: bool) -> None:
    """A lead's status changed by write_record is in its history, as update_lead_status's is (a step
    back costs points, countersign/core/leadscore.py): the change is recorded, and its undo forgets
    it. Both rescore the lead."""
    if recorded.collection != "leads" or recorded.previous is None:
        return
    before, after = recorded.previous.get("status"), recorded.written.get("status")
    if before is None or after is None or before == after:  # the status was not written, or kept
        return
    lead = await ctx.session.get(Lead, recorded.id, populate_existing=True)
    if lead is None:
        return
    if undone:
        await forget_status_change(ctx.session, lead, before, after)
    else:
        await record_lead_event(
            ctx.session,
            lead,
            "status_changed",
            ctx.caller.user_id,
            note="write_record",
            previous_status=before,
        )


async def rescore_touched(ctx: ToolContext, recorded: WriteResult) -> None:
    """Keep the score of every lead the write (or its undo) touched current, in the same transaction
    (countersign/db/leads.py): a lead's own fields (status, source, company, email) are facts of its
    score, and so is a calendar event booked with it (its type, status and attendees, before and after)."""
    if recorded.collection == "leads":
        await rescore_ids(ctx.session, ctx.tenant_id, [recorded.id])
    elif recorded.collection == "calendar_events":
        attendees = await ctx.session.scalar(
            select(CalendarEvent.attendees).where(
                CalendarEvent.tenant_id == ctx.tenant_id, CalendarEvent.id == recorded.id
            )
        )
        before = (recorded.previous or {}).get("attendees") or []
        written = recorded.written.get("attendees") or []
        await rescore_attendees(ctx.session, ctx.tenant_id, [*(attendees or []), *written, *before])


def recorded_write(result: dict[str, Any]) -> WriteResult:
    """The forward call's result, refused when the guards altered it (its checksum no longer matches)."""
    recorded = WriteResult.model_validate(result)
    if recorded.checksum != checksum(recorded.collection, recorded.id, recorded.written, recorded.previous):
        raise ToolFailure(
            "CONFLICT",
            f"the recorded change of {recorded.collection} {recorded.id} was redacted or truncated; "
            "it cannot be undone automatically",
        )
    return recorded


def changed_since(recorded: WriteResult, current: dict[str, Any]) -> ToolFailure:
    fields = sorted(f for f, v in recorded.written.items() if current.get(f) != v)
    return ToolFailure(
        "CONFLICT",
        f"{recorded.collection} {recorded.id} changed since it was written ({', '.join(fields)}); not undone",
    )


async def undo_create(ctx: ToolContext, c: Collection, recorded: WriteResult) -> UndoOutcome:
    """Cancel (or delete) the created row while it still holds what the call created."""
    current = await lock_row(ctx, c, recorded.id, recorded.written)
    if current is None:
        return "already_undone"
    where = (c.column("tenant_id") == ctx.tenant_id, c.column("id") == recorded.id)
    if c.cancelled_status is None:
        if current != recorded.written:
            raise changed_since(recorded, current)
        await ctx.session.execute(delete(c.table).where(*where))
        return "undone"
    if current == {**recorded.written, "status": c.cancelled_status}:
        return "already_undone"
    if current != recorded.written:
        raise changed_since(recorded, current)
    await ctx.session.execute(update(c.table).where(*where).values(status=c.cancelled_status))
    return "undone"


async def undo_update(ctx: ToolContext, c: Collection, recorded: WriteResult) -> UndoOutcome:
    """Put the previous values back while the row still holds what the call wrote."""
    assert recorded.previous is not None
    current = await lock_row(ctx, c, recorded.id, recorded.written)
    if current is None:
        raise ToolFailure("CONFLICT", f"{recorded.collection} {recorded.id} was deleted since it was written")
    if current == recorded.written:
        previous = {f: coerce(c, f, v) for f, v in recorded.previous.items()}
        await ctx.session.execute(
            update(c.table)
            .where(c.column("tenant_id") == ctx.tenant_id, c.column("id") == recorded.id)
            .values(**previous)
        )
        return "undone"
    if current == recorded.previous:
        return "already_undone"
    raise changed_since(recorded, current)


@compensates(write_record)
async def undo_write_record(
    ctx: ToolContext, args: WriteRecordArgs, result: dict[str, Any] | None
) -> UndoOutcome:
    """Undo a write_record: cancel or delete what it created, or restore what it overwrote."""
    if result is None:
        return "never_happened"
    recorded = recorded_write(result)
    c = COLLECTIONS.get(cast(CollectionName, recorded.collection))
    if c is None:
        raise ToolFailure("CONFLICT", f"{recorded.collection} is not a whitelisted collection")
    outcome = await (undo_create if recorded.created else undo_update)(ctx, c, recorded)
    if outcome == "undone":
        await lead_history(ctx, recorded, undone=True)
    await rescore_touched(ctx, recorded)
    return outcome

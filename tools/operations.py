"""Operations tools: the tenant's tasks, projects and calendar events.

People are named by user id, display name or email and resolved in the caller's tenant; projects by
name; tasks and events by id or exact title. Writes are medium risk and compensable: a created row is
cancelled (never deleted), an update puts back the fields it changed unless someone changed them since.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy import ColumnElement, select

from countersign.core.guards import MAX_ROWS
from countersign.db.leads import rescore_attendees
from countersign.db.schema import CalendarEvent, Project, Task
from tools.effects import RowCreation, RowUpdate
from tools.registry import ToolArgs, ToolContext, ToolFailure, UndoOutcome, compensates, tool
from tools.resolve import (
    ChangeArgs,
    RowView,
    Updated,
    UtcDatetime,
    answers_needs,
    as_json,
    belongs_to,
    cancel_created,
    find_record,
    overlapping,
    resolve_attendees,
    resolve_person,
    resolve_user,
    same_text,
    saved,
    undo_update,
)

TaskStatus = Literal["open", "in_progress", "done", "cancelled"]
ProjectStatus = Literal["planned", "active", "on_hold", "done", "cancelled"]
EventStatus = Literal["tentative", "confirmed", "cancelled"]
EventType = Literal["meeting", "call", "demo", "deadline", "reminder", "other"]  # schema.EVENT_TYPES

TITLE = Field(min_length=1, max_length=200)
DESCRIPTION_HELP = "Free text; an empty string clears it"


# --- views -----------------------------------------------------------------------------------------


class TaskView(BaseModel):
    id: int
    title: str
    description: str | None
    status: str
    due_date: date | None
    assignee: str | None  # user id
    project: str | None  # project name
    created_by: str


class TaskList(BaseModel):
    tasks: list[TaskView]
    count: int


class ProjectView(RowView):
    id: int
    name: str
    description: str | None
    status: str
    owner: str | None = Field(validation_alias="owner_user_id")
    due_date: date | None


class ProjectList(BaseModel):
    projects: list[ProjectView]
    count: int


class EventView(RowView):
    id: int
    title: str
    description: str | None
    starts_at: datetime
    ends_at: datetime
    attendees: list[str]  # user ids and emails
    location: str | None
    owner: str | None = Field(validation_alias="owner_user_id")
    status: str
    type: str = "meeting"


class EventList(BaseModel):
    events: list[EventView]
    count: int


async def task_views(ctx: ToolContext, tasks: Sequence[Task]) -> list[TaskView]:
    """Tasks as the model sees them, with their project's name rather than its id."""
    ids = {task.project_id for task in tasks if task.project_id is not None}
    names: dict[int, str] = {}
    if ids:
        rows = await ctx.session.execute(
            select(Project.id, Project.name).where(Project.tenant_id == ctx.tenant_id, Project.id.in_(ids))
        )
        names = {project_id: name for project_id, name in rows}
    return [
        TaskView(
            id=task.id,
            title=task.title,
            description=task.description,
            status=task.status,
            due_date=task.due_date,
            assignee=task.assignee_user_id,
            project=names.get(task.project_id) if task.project_id is not None else None,
            created_by=task.created_by,
        )
        for task in tasks
    ]


async def task_view(ctx: ToolContext, task: Task) -> TaskView:
    return (await task_views(ctx, [task]))[0]


# --- finding records -------------------------------------------------------------------------------


async def find_task(ctx: ToolContext, ref: str, *, lock: bool = False) -> Task:
    return await find_record(
        ctx,
        Task,
        ref,
        field="task",
        label=Task.title,
        lock=lock,
        describe=lambda t: {
            "id": t.id,
            "title": t.title,
            "status": t.status,
            "due_date": as_json(t.due_date),
        },
    )


async def find_project(ctx: ToolContext, ref: str, *, lock: bool = False) -> Project:
    return await find_record(
        ctx,
        Project,
        ref,
        field="project",
        label=Project.name,
        lock=lock,
        describe=lambda p: {"id": p.id, "name": p.name, "status": p.status},
    )


async def find_event(ctx: ToolContext, ref: str, *, lock: bool = False) -> CalendarEvent:
    return await find_record(
        ctx,
        CalendarEvent,
        ref,
        field="event",
        label=CalendarEvent.title,
        lock=lock,
        describe=lambda e: {
            "id": e.id,
            "title": e.title,
            "starts_at": as_json(e.starts_at),
            "status": e.status,
        },
    )


async def ensure_project_name_free(ctx: ToolContext, name: str) -> None:
    """Project names are unique per tenant (case-insensitively, for people's sake)."""
    taken = await ctx.session.scalar(
        select(Project.id).where(Project.tenant_id == ctx.tenant_id, same_text(Project.name, name))
    )
    if taken is not None:
        raise ToolFailure("CONFLICT", f"a project named {name!r} already exists (id {taken})")


# --- tasks -----------------------------------------------------------------------------------------


class ListTasksArgs(ToolArgs):
    status: TaskStatus | None = Field(None, description="Only tasks with this status")
    assignee: str | None = Field(None, description="Only tasks of this person: user id, name or email")
    project: str | None = Field(None, description="Only tasks of this project: its name or id")
    limit: int = Field(20, ge=1, le=MAX_ROWS, description="Most rows to return")


class CreateTaskArgs(ToolArgs):
    title: str = TITLE
    description: str | None = Field(None, max_length=2000, description="Details")
    due_date: date | None = Field(None, description="ISO date, YYYY-MM-DD")
    assignee: str | None = Field(None, description="Who does it: user id, display name or email")
    project: str | None = Field(None, description="The project it belongs to: its name or id")
    status: TaskStatus = Field("open", description="Initial status; open unless said otherwise")


class UpdateTaskArgs(ChangeArgs):
    target: ClassVar[str] = "task"
    task: str = Field(min_length=1, max_length=200, description="The task's id or exact title")
    status: TaskStatus | None = Field(None, description="New status")
    title: str | None = Field(None, min_length=1, max_length=200, description="New title")
    description: str | None = Field(None, max_length=2000, description=DESCRIPTION_HELP)
    due_date: date | None = Field(None, description="New due date, YYYY-MM-DD")
    assignee: str | None = Field(None, description="New assignee: user id, display name or email")
    project: str | None = Field(None, description="Move it to this project: its name or id")


async def task_filters(ctx: ToolContext, args: ListTasksArgs) -> list[ColumnElement[bool]]:
    filters = [Task.tenant_id == ctx.tenant_id]
    if args.status is not None:
        filters.append(Task.status == args.status)
    if args.assignee is not None:
        filters.append(Task.assignee_user_id == (await resolve_user(ctx, args.assignee, field="assignee")).id)
    if args.project is not None:
        filters.append(Task.project_id == (await find_project(ctx, args.project)).id)
    return filters


@tool(risk="low", category="read")
@answers_needs
async def list_tasks(ctx: ToolContext, args: ListTasksArgs) -> TaskList:
    """List the workspace's tasks, soonest due first, optionally only those with a status, of an
    assignee (user id, name or email) or of a project (name or id)."""
    rows = await ctx.session.scalars(
        select(Task)
        .where(*await task_filters(ctx, args))
        .order_by(Task.due_date.asc().nulls_last(), Task.id)
        .limit(args.limit)
    )
    tasks = await task_views(ctx, list(rows))
    return TaskList(tasks=tasks, count=len(tasks))


async def task_references(ctx: ToolContext, assignee: str | None, project: str | None) -> dict[str, Any]:
    """Column values for a task's assignee and project, resolved from the names the model gave."""
    values: dict[str, Any] = {}
    if assignee is not None:
        values["assignee_user_id"] = (await resolve_user(ctx, assignee, field="assignee")).id
    if project is not None:
        values["project_id"] = (await find_project(ctx, project)).id
    return values


async def new_task(ctx: ToolContext, args: CreateTaskArgs) -> dict[str, Any]:
    """The columns of the task `args` creates, its assignee and project resolved."""
    return {
        "title": args.title,
        "status": args.status,
        "description": args.description or None,
        "due_date": args.due_date,
        "created_by": ctx.caller.user_id,
        **await task_references(ctx, args.assignee, args.project),
    }


async def plan_create_task(ctx: ToolContext, args: CreateTaskArgs) -> RowCreation:
    return RowCreation(args=args, kind="task", label=f"task “{args.title}”", values=await new_task(ctx, args))


@tool(risk="medium", category="write", plan=plan_create_task)
async def create_task(ctx: ToolContext, plan: RowCreation) -> TaskView:
    """Create a task, optionally with a description, a due date (YYYY-MM-DD), an assignee (user id,
    display name or email), a project (name or id) and an initial status (open unless given). It is
    created by the user."""
    task = Task(tenant_id=ctx.tenant_id, **plan.values)
    return await task_view(ctx, await saved(ctx, task))


@compensates(create_task)
async def cancel_created_task(
    ctx: ToolContext, args: CreateTaskArgs, result: dict[str, Any] | None
) -> UndoOutcome:
    return await cancel_created(ctx, Task, result)


async def plan_update_task(ctx: ToolContext, args: UpdateTaskArgs) -> RowUpdate[Task]:
    """The task an update names and the column values it sets."""
    wanted = args.provided("status", "title", "description", "due_date")
    wanted |= await task_references(ctx, args.assignee, args.project)
    task = await find_task(ctx, args.task, lock=ctx.lock_reads)
    label = f"task {task.id} “{task.title}”"
    return RowUpdate(args=args, kind="task", row=task, label=label, wanted=wanted, ref="task")


@tool(risk="medium", category="write", plan=plan_update_task)
async def update_task(ctx: ToolContext, plan: RowUpdate[Task]) -> Updated[TaskView]:
    """Change a task, named by its id or exact title: its status (open, in_progress, done, cancelled),
    title, description, due date, assignee (user id, name or email) or project. Only the fields given
    change; the result lists their previous and new values."""
    previous, changed = plan.write()
    task = await saved(ctx, plan.row)
    return Updated[TaskView](record=await task_view(ctx, task), previous=previous, changed=changed)


@compensates(update_task)
async def restore_updated_task(
    ctx: ToolContext, args: UpdateTaskArgs, result: dict[str, Any] | None
) -> UndoOutcome:
    return await undo_update(ctx, Task, result)


# --- projects --------------------------------------------------------------------------------------


class ListProjectsArgs(ToolArgs):
    status: ProjectStatus | None = Field(None, description="Only projects with this status")
    limit: int = Field(20, ge=1, le=MAX_ROWS, description="Most rows to return")


class CreateProjectArgs(ToolArgs):
    name: str = Field(min_length=1, max_length=200, description="A name not used by another project")
    description: str | None = Field(None, max_length=2000, description="What it is about")
    due_date: date | None = Field(None, description="ISO date, YYYY-MM-DD")


class UpdateProjectArgs(ChangeArgs):
    target: ClassVar[str] = "project"
    project: str = Field(min_length=1, max_length=200, description="The project's name or id")
    status: ProjectStatus | None = Field(None, description="New status")
    description: str | None = Field(None, max_length=2000, description=DESCRIPTION_HELP)
    due_date: date | None = Field(None, description="New due date, YYYY-MM-DD")
    name: str | None = Field(None, min_length=1, max_length=200, description="New name")


@tool(risk="low", category="read")
async def list_projects(ctx: ToolContext, args: ListProjectsArgs) -> ProjectList:
    """List the workspace's projects by name, optionally only those with a status
    (planned, active, on_hold, done, cancelled)."""
    query = select(Project).where(Project.tenant_id == ctx.tenant_id)
    if args.status is not None:
        query = query.where(Project.status == args.status)
    rows = await ctx.session.scalars(query.order_by(Project.name, Project.id).limit(args.limit))
    projects = [ProjectView.model_validate(project) for project in rows]
    return ProjectList(projects=projects, count=len(projects))


async def new_project(ctx: ToolContext, args: CreateProjectArgs) -> dict[str, Any]:
    """The columns of the project `args` creates, once its name is known to be free."""
    await ensure_project_name_free(ctx, args.name)
    return {
        "name": args.name,
        "status": "planned",
        "description": args.description or None,
        "due_date": args.due_date,
        "owner_user_id": ctx.caller.user_id,
    }


async def plan_create_project(ctx: ToolContext, args: CreateProjectArgs) -> RowCreation:
    values = await new_project(ctx, args)
    return RowCreation(args=args, kind="project", label=f"project “{args.name}”", values=values)


@tool(risk="medium", category="write", plan=plan_create_project)
async def create_project(ctx: ToolContext, plan: RowCreation) -> ProjectView:
    """Create a project owned by the user, with a unique name, an optional description and due date
    (YYYY-MM-DD). It starts as planned."""
    project = Project(tenant_id=ctx.tenant_id, **plan.values)
    return ProjectView.model_validate(await saved(ctx, project))


@compensates(create_project)
async def cancel_created_project(
    ctx: ToolContext, args: CreateProjectArgs, result: dict[str, Any] | None
) -> UndoOutcome:
    return await cancel_created(ctx, Project, result)


async def plan_update_project(ctx: ToolContext, args: UpdateProjectArgs) -> RowUpdate[Project]:
    """The project an update names and the column values it sets (a new name must be free)."""
    project = await find_project(ctx, args.project, lock=ctx.lock_reads)
    if args.name is not None and args.name.lower() != project.name.lower():
        await ensure_project_name_free(ctx, args.name)
    wanted = args.provided("status", "description", "due_date", "name")
    label = f"project {project.id} “{project.name}”"
    return RowUpdate(args=args, kind="project", row=project, label=label, wanted=wanted, ref="project")


@tool(risk="medium", category="write", plan=plan_update_project)
async def update_project(ctx: ToolContext, plan: RowUpdate[Project]) -> Updated[ProjectView]:
    """Change a project, named by its name or id: its status (planned, active, on_hold, done,
    cancelled), description, due date or name. Only the fields given change; the result lists their
    previous and new values."""
    previous, changed = plan.write()
    project = await saved(ctx, plan.row)
    return Updated[ProjectView](
        record=ProjectView.model_validate(project), previous=previous, changed=changed
    )


@compensates(update_project)
async def restore_updated_project(
    ctx: ToolContext, args: UpdateProjectArgs, result: dict[str, Any] | None
) -> UndoOutcome:
    return await undo_update(ctx, Project, result)


# --- calendar events -------------------------------------------------------------------------------


class ListEventsArgs(ToolArgs):
    start: UtcDatetime | None = Field(
        None, alias="from", description="Events ending after this ISO date-time with time zone (default: now)"
    )
    end: UtcDatetime | None = Field(None, alias="to", description="Events starting before this ISO date-time")
    attendee: str | None = Field(
        None, description="Only this person's events: user id, name, or contact email"
    )
    limit: int = Field(20, ge=1, le=MAX_ROWS, description="Most rows to return")

    model_config = ConfigDict(serialize_by_alias=True)


class CreateEventArgs(ToolArgs):
    title: str = TITLE
    starts_at: UtcDatetime = Field(description="ISO date-time with time zone, e.g. 2026-12-08T16:00:00Z")
    ends_at: UtcDatetime = Field(description="ISO date-time with time zone, after starts_at")
    attendees: list[str] = Field(
        default_factory=list, max_length=50, description="People: user ids, names or emails"
    )
    location: str | None = Field(None, max_length=200, description="Room, address or 'Video call'")
    description: str | None = Field(None, max_length=2000, description="Agenda or notes")
    type: EventType = Field("meeting", description="meeting, call, demo, deadline, reminder or other")

    @model_validator(mode="after")
    def _ends_after_start(self) -> CreateEventArgs:
        if self.ends_at <= self.starts_at:
            raise ValueError("ends_at must be after starts_at")
        return self


class UpdateEventArgs(ChangeArgs):
    target: ClassVar[str] = "event"
    event: str = Field(min_length=1, max_length=200, description="The event's id or exact title")
    title: str | None = Field(None, min_length=1, max_length=200, description="New title")
    starts_at: UtcDatetime | None = Field(None, description="New start, ISO date-time with time zone")
    ends_at: UtcDatetime | None = Field(None, description="New end, ISO date-time with time zone")
    attendees: list[str] | None = Field(
        None, max_length=50, description="The new full list of people: user ids, names or emails"
    )
    location: str | None = Field(None, max_length=200, description="Free text; an empty string clears it")
    description: str | None = Field(None, max_length=2000, description=DESCRIPTION_HELP)
    status: EventStatus | None = Field(None, description="tentative, confirmed or cancelled")
    type: EventType | None = Field(None, description="meeting, call, demo, deadline, reminder or other")


async def attendee_handles(ctx: ToolContext, refs: Sequence[str]) -> list[str]:
    """Resolve invitees, keeping their order and dropping duplicates."""
    return list(dict.fromkeys(await resolve_attendees(ctx, refs)))


@tool(risk="low", category="read")
@answers_needs
async def list_events(ctx: ToolContext, args: ListEventsArgs) -> EventList:
    """List calendar events (not cancelled ones) in time order, from `from` (default: now) to `to`
    (ISO date-times with a time zone), optionally only those of one attendee (user id, name or
    contact email). Times are UTC."""
    query = select(CalendarEvent).where(
        CalendarEvent.tenant_id == ctx.tenant_id, overlapping(args.start or ctx.now, args.end)
    )
    if args.attendee is not None:
        query = query.where(belongs_to(await resolve_person(ctx, args.attendee, field="attendee")))
    rows = await ctx.session.scalars(
        query.order_by(CalendarEvent.starts_at, CalendarEvent.id).limit(args.limit)
    )
    events = [EventView.model_validate(event) for event in rows]
    return EventList(events=events, count=len(events))


async def new_event(ctx: ToolContext, args: CreateEventArgs) -> dict[str, Any]:
    """The columns of the event `args` creates, its attendees resolved."""
    return {
        "title": args.title,
        "description": args.description or None,
        "starts_at": args.starts_at,
        "ends_at": args.ends_at,
        "attendees": await attendee_handles(ctx, args.attendees),
        "location": args.location or None,
        "owner_user_id": ctx.caller.user_id,
        "status": "confirmed",
        "type": args.type,
    }


async def plan_create_event(ctx: ToolContext, args: CreateEventArgs) -> RowCreation:
    label = f"{args.type} “{args.title}” at {args.starts_at.isoformat()}"
    return RowCreation(args=args, kind="event", label=label, values=await new_event(ctx, args))


@tool(risk="medium", category="write", plan=plan_create_event)
async def create_event(ctx: ToolContext, plan: RowCreation) -> EventView:
    """Put a confirmed event on the calendar, owned by the user. Times are ISO date-times with a time
    zone; attendees are user ids, names or emails (outside emails are invited as written); `type` is
    meeting (the default), call, demo, deadline, reminder or other. This does not check for conflicts:
    look at list_events first."""
    event = CalendarEvent(tenant_id=ctx.tenant_id, **plan.values)
    event = await saved(ctx, event)
    await rescore_attendees(ctx.session, ctx.tenant_id, event.attendees)
    return EventView.model_validate(event)


@compensates(create_event)
async def cancel_created_event(
    ctx: ToolContext, args: CreateEventArgs, result: dict[str, Any] | None
) -> UndoOutcome:
    outcome = await cancel_created(ctx, CalendarEvent, result)
    await rescore_attendees(ctx.session, ctx.tenant_id, (result or {}).get("attendees", []))
    return outcome


async def plan_update_event(ctx: ToolContext, args: UpdateEventArgs) -> RowUpdate[CalendarEvent]:
    """The event an update names and the column values it sets (it must still end after it starts)."""
    wanted = args.provided("title", "starts_at", "ends_at", "location", "description", "status", "type")
    if args.attendees is not None:
        wanted["attendees"] = await attendee_handles(ctx, args.attendees)
    event = await find_event(ctx, args.event, lock=ctx.lock_reads)
    if wanted.get("ends_at", event.ends_at) <= wanted.get("starts_at", event.starts_at):
        raise ToolFailure("VALIDATION_ERROR", "the event would end before it starts")
    label = f"event {event.id} “{event.title}” at {event.starts_at.isoformat()}"
    return RowUpdate(args=args, kind="event", row=event, label=label, wanted=wanted, ref="event")


@tool(risk="medium", category="write", plan=plan_update_event)
async def update_event(ctx: ToolContext, plan: RowUpdate[CalendarEvent]) -> Updated[EventView]:
    """Change a calendar event, named by its id or exact title: title, start or end (ISO date-times
    with a time zone), the full attendee list, location, description, status (tentative, confirmed,
    cancelled) or type. Only the fields given change; the result lists their previous and new values."""
    event = plan.row
    before = list(event.attendees)
    previous, changed = plan.write()
    event = await saved(ctx, event)
    await rescore_attendees(ctx.session, ctx.tenant_id, [*before, *event.attendees])
    return Updated[EventView](record=EventView.model_validate(event), previous=previous, changed=changed)


@compensates(update_event)
async def restore_updated_event(
    ctx: ToolContext, args: UpdateEventArgs, result: dict[str, Any] | None
) -> UndoOutcome:
    outcome = await undo_update(ctx, CalendarEvent, result, together=[{"starts_at", "ends_at"}])
    if result is not None:  # the leads among the attendees it had and has (autoflush shows the undo)
        attendees = [
            *result.get("record", {}).get("attendees", []),
            *result.get("previous", {}).get("attendees", []),
        ]
        await rescore_attendees(ctx.session, ctx.tenant_id, attendees)
    return outcome

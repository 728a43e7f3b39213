"""Commands: `dev up | down | status [--json]`, the embedded stack (countersign.devstack.stack)."""

from __future__ import annotations

import asyncio
import os

import click

from countersign.cli.app import cli, print_json, run
from countersign.devstack import stack
from countersign.identity.mode import deployment_mode
from countersign.runtime.config import DATA_DIR, load_settings


def _plan() -> stack.StackPlan:
    try:
        return stack.plan_from_env(os.environ, DATA_DIR)
    except stack.StackError as exc:
        raise click.ClickException(str(exc)) from exc


@cli.group()
def dev() -> None:
    """The embedded stack: PostgreSQL, Temporal dev server, scripted model, worker (data in .data/)."""


@dev.command()
def up() -> None:
    """Start what is not running yet (each env override replaces its component); idempotent."""
    run(stack.up(_plan(), click.echo))


@dev.command()
def down() -> None:
    """Stop what `dev up` started, keeping the data; idempotent."""
    run(asyncio.to_thread(stack.down, _plan(), click.echo))


@dev.command()
@click.option("--json", "as_json", is_flag=True, help="Print the addresses and components as JSON.")
def status(as_json: bool) -> None:
    """Show each component and the addresses clients use."""
    plan = _plan()
    components = stack.status(plan)
    scenario = _scenario(plan, components)
    mode = run(running_mode())
    if as_json:
        settings = load_settings()
        print_json(
            {
                "temporal_address": settings.temporal_address,
                "namespace": settings.namespace,
                "task_queue": settings.task_queue,
                "database_url": settings.database_url,
                "llm_base_url": settings.llm_base_url,
                "ui_url": settings.ui_url,
                "scenario": scenario,
                "approver_auth": mode,
                "auth_mode": mode,
                "components": {c.name: c.to_json() for c in components},
            }
        )
        return
    rows = [("component", "state", "pid", "address", "log")]
    rows += [(c.name, c.state, str(c.pid or "-"), c.address, c.log or "-") for c in components]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        click.echo("  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]]))
    if scenario:
        click.echo(f"scripted model scenario: {scenario}")
    click.echo(approver_auth_line(mode))


def _scenario(plan: stack.StackPlan, components: list[stack.ComponentStatus]) -> str | None:
    """The scenario the scripted model serves (or will serve at the next `dev up`); None for a real model."""
    model = next(c for c in components if c.name == "model")
    if model.state == stack.EXTERNAL:
        return None
    _, records = stack.read_stack(plan.stack_file)
    running = records.get("model") if model.state == "running" else None
    return (stack.scenario_of(running) if running else None) or plan.scenario


async def running_mode() -> str:
    """The mode of what runs: the deployment's, recorded in its database (the environment's when
    the database cannot be read: not started yet)."""
    settings = load_settings()
    if settings.database_url:
        try:
            recorded = await asyncio.wait_for(deployment_mode(settings.database_url), 5)
        except Exception:  # not running: say what the next start would use
            recorded = None
        if recorded:
            return recorded
    return settings.approver_auth


def approver_auth_line(mode: str) -> str:
    if mode == "signed":
        return (
            "auth: COUNTERSIGN_AUTH=signed (the deployment's): starts, messages, answers, rollbacks, "
            "ends and decisions count only with a proof the server minted"
        )
    return (
        "auth: COUNTERSIGN_AUTH=names (the deployment's; demo): a bare name counts for requesters and "
        "approvers; actions are recorded as claimed, not proven. Set COUNTERSIGN_AUTH=signed and run "
        "`db upgrade` to require proofs."
    )

"""Commands: `dev up | down | status [--json] | temporal …`, the embedded stack
(countersign.devstack.stack)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import click

from countersign.cli.app import cli, print_json, run
from countersign.cli.ux import command, shown_path, stack_down
from countersign.devstack import stack
from countersign.devstack.temporal import temporal_binary
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
    """Start what is not running yet (each env override replaces its component); idempotent.

    COUNTERSIGN_AUTH (or APPROVER_AUTH) and COUNTERSIGN_METRICS_PORT set the worker's and inbox's
    modes; asking for another mode than the running ones' is refused (`dev down` first)."""
    plan = _plan()
    run(stack.up(plan, click.echo))
    running = running_modes(plan)
    for line in mode_lines(plan, running, run(running_mode(running))):
        click.echo(line)


@dev.command()
def down() -> None:
    """Stop what `dev up` started, keeping the data; idempotent."""
    run(asyncio.to_thread(stack.down, _plan(), click.echo))


@dev.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("temporal_args", nargs=-1, type=click.UNPROCESSED)
def temporal(temporal_args: tuple[str, ...]) -> None:
    """The Temporal CLI `make` installed, on the stack's server and namespace (TEMPORAL_ADDRESS and
    TEMPORAL_NAMESPACE when set): `dev temporal worker deployment describe --deployment-name
    countersign`. Needs no activated virtualenv and follows the stack's ports."""
    down = stack_down("temporal", "TEMPORAL_ADDRESS")
    if down:
        raise click.ClickException(down)
    settings = load_settings()
    env = os.environ | {"TEMPORAL_ADDRESS": settings.temporal_address}
    env["TEMPORAL_NAMESPACE"] = settings.namespace
    try:
        binary = temporal_binary()
    except RuntimeError as missing:
        raise click.ClickException(str(missing)) from None
    sys.exit(subprocess.run([binary, *temporal_args], env=env, check=False).returncode)


@dev.command()
@click.option("--json", "as_json", is_flag=True, help="Print the addresses and components as JSON.")
def status(as_json: bool) -> None:
    """Show each component and the addresses clients use."""
    plan = _plan()
    components = stack.status(plan)
    scenario = _scenario(plan, components)
    running = running_modes(plan)
    mode = run(running_mode(running))
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
                "metrics_url": running.metrics_url if running else None,
                "components": {c.name: c.to_json() for c in components},
            }
        )
        return
    rows = [("component", "state", "pid", "address", "log")]
    rows += [
        (c.name, c.state, str(c.pid or "-"), c.address, shown_path(Path(c.log)) if c.log else "-")
        for c in components
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        click.echo("  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]]))
    if scenario:
        click.echo(f"scripted model scenario: {shown_path(Path(scenario))}")
    for line in mode_lines(plan, running, mode):
        click.echo(line)


def _scenario(plan: stack.StackPlan, components: list[stack.ComponentStatus]) -> str | None:
    """The scenario the scripted model serves (or will serve at the next `dev up`); None for a real model."""
    model = next(c for c in components if c.name == "model")
    if model.state == stack.EXTERNAL:
        return None
    _, records = stack.read_stack(plan.stack_file)
    running = records.get("model") if model.state == "running" else None
    return (stack.scenario_of(running) if running else None) or plan.scenario


async def running_mode(running: stack.StackPlan | None) -> str:
    """The mode of what runs: the deployment's, recorded in its database; else what the running
    stack's processes were started with; else what the next start would use."""
    settings = load_settings()
    if settings.database_url:
        try:
            recorded = await asyncio.wait_for(deployment_mode(settings.database_url), 5)
        except Exception:  # not running: fall back to the stack file, then the environment
            recorded = None
        if recorded:
            return recorded
    return (running.approver_auth if running else None) or settings.approver_auth or "names"


def running_modes(plan: stack.StackPlan) -> stack.StackPlan | None:
    """The plan with the modes of the stack's running worker and inbox, None when neither runs."""
    recorded, records = stack.read_stack(plan.stack_file)
    live = [c.name for c in stack.status(plan) if c.name in ("worker", "inbox") and c.state == "running"]
    if not live:
        return None
    asked_nothing = dataclasses.replace(plan, approver_auth=None, metrics_port=None)
    return stack.with_running_modes(asked_nothing, recorded, records)


def mode_lines(plan: stack.StackPlan, running: stack.StackPlan | None, mode: str) -> list[str]:
    """How the running stack decides who acts and where its worker serves metrics, and a warning
    when this shell asks for another mode."""
    if running is None:
        return [f"auth: not running (`dev up` starts it with COUNTERSIGN_AUTH={plan.approver_auth or mode})"]
    lines = [approver_auth_line(mode)]
    if running.metrics_url:
        lines.append(f"metrics: the worker serves {running.metrics_url}")
    if plan.approver_auth not in (None, mode):
        lines.append(
            f"warning: this shell sets COUNTERSIGN_AUTH={plan.approver_auth} but the stack runs with "
            f"{mode}: CLI commands from this shell will be refused; unset it, or `{command()} dev down` "
            f"and `COUNTERSIGN_AUTH={plan.approver_auth} {command()} dev up`"
        )
    return lines


def approver_auth_line(mode: str) -> str:
    if mode == "signed":
        return (
            "auth: COUNTERSIGN_AUTH=signed: starts, messages, answers, rollbacks, ends and decisions "
            "count only with a proof the server minted "
            f"(log in first: `{command()} login --tenant TENANT --as USER`)"
        )
    return (
        "auth: COUNTERSIGN_AUTH=names (demo): a bare name counts for requesters and approvers; actions "
        "are recorded as claimed, not proven. For proofs: `dev down`, then `COUNTERSIGN_AUTH=signed dev up`."
    )

"""Commands: `model serve`, the scripted model server in the foreground."""

from __future__ import annotations

import asyncio
import signal

import click

from countersign.cli.app import cli, run
from countersign.runtime.config import SCRIPTED_LABEL
from countersign.scripted_model.scenario import Scenario, ScenarioError, load_scenarios
from countersign.scripted_model.server import ScriptedModelServer

DEFAULT_PORT = 8400


@cli.group()
def model() -> None:
    """The scripted, OpenAI-compatible model that stands in for an LLM."""


@model.command()
@click.option(
    "--scenario",
    "scenario_path",
    envvar="SCENARIO",
    show_envvar=True,
    type=click.Path(),
    help="Scenario file (.yaml/.yml/.json), or a directory of them (one per agent).",
)
@click.option(
    "--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535), help="0: any free port."
)
@click.option("--host", default="127.0.0.1", show_default=True)
def serve(scenario_path: str | None, port: int, host: str) -> None:
    """Serve the scenario at http://HOST:PORT/v1 until Ctrl-C or SIGTERM."""
    if scenario_path is None:
        raise click.UsageError("give --scenario FILE|DIR or set SCENARIO")
    try:
        scenarios = load_scenarios(scenario_path)
    except ScenarioError as exc:
        raise click.ClickException(str(exc)) from exc
    run(_serve(scenarios, host, port))


async def _serve(scenarios: list[Scenario], host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with ScriptedModelServer(scenarios, host=host, port=port) as server:
        names = ", ".join(f"{s.name!r}" + (f" ({s.agent})" if s.agent else "") for s in scenarios)
        click.echo(f"{SCRIPTED_LABEL} serving scenarios {names} on {server.base_url}")
        await stop.wait()

"""`starter.py demo`: bring the embedded stack up and run the scripted lead-qualification conversation."""

from __future__ import annotations

import os

import click

from countersign.cli.app import cli, run
from countersign.cli.stack_client import query_transcript
from countersign.cli.ux import command
from countersign.client.ended import with_stored_results
from countersign.client.handles import render_transcript, start_conversation
from countersign.client.temporal_client import connect
from countersign.core.contract import ConversationResult, StartConversation
from countersign.core.summaries import usage_line
from countersign.devstack import stack
from countersign.runtime.config import DATA_DIR, load_settings

DEMO = StartConversation(
    tenant_id="acme",
    user_id="alice",
    agent="lead-qualifier",
    message="Find Jane Doe and tell me about her",
    single_turn=True,
)


@cli.command()
def demo() -> None:
    """Start the embedded stack (if needed) and run the demo conversation end to end."""

    async def body() -> None:
        await stack.up(stack.plan_from_env(os.environ, DATA_DIR), click.echo)
        settings = load_settings()
        client = await connect(settings)
        handle = await start_conversation(client, settings, DEMO)
        click.echo(f"\nconversation {handle.id}: {DEMO.tenant_id}/{DEMO.user_id} with {DEMO.agent}\n")
        result: ConversationResult = await handle.result()
        messages = await with_stored_results(settings, handle.id, await query_transcript(handle))
        click.echo(render_transcript(messages, scripted=settings.scripted_model))
        u = result.usage
        click.echo("\n" + usage_line(u.model_calls, u.tool_calls, u.total_tokens))
        click.echo(f"workflow id: {handle.id}")
        click.echo(f"Web UI:      {settings.workflow_url(handle.id)}")
        click.echo(f"The stack keeps running; `{command()} dev down` stops it.")

    run(body())

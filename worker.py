"""The Countersign worker: the AgentWorkflow and every activity, on one task queue.

python worker.py      # settings from the environment, or from `starter.py dev up`
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.client import Client
from temporalio.worker import Interceptor, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from activities.approvals import ApprovalActivities
from activities.audit import AuditActivities
from activities.authority import AuthorityActivities
from activities.context import ContextActivities
from activities.email import EmailActivities
from activities.model import ModelActivities
from activities.saga import SagaActivities
from activities.tools import ToolActivities
from countersign.config import Settings, load_settings
from countersign.db.engine import create_engine, session_factory
from countersign.logs import ActivityLogContext, get_logger
from countersign.logs import configure as configure_logging
from countersign.payloads import data_converter
from countersign.ratelimit import RateLimits
from countersign.temporal_client import connect
from workflows.agent import AgentWorkflow

# Pure, deterministic modules the workflow imports: pass them through the sandbox instead of
# re-importing them for every workflow run.
PASSTHROUGH = ("countersign", "pydantic", "pydantic_core", "annotated_types")


def build_worker(
    client: Client,
    settings: Settings,
    sessions: async_sessionmaker[AsyncSession],
    tools: ToolActivities | None = None,
    interceptors: Sequence[Interceptor] = (),
) -> Worker:
    """The worker; `tools` replaces the tool activities (the default's rate limits come from the
    environment: RATE_LIMIT_PER_S, RATE_LIMIT_BURST); `interceptors` run inside the logging one."""
    context = ContextActivities(sessions, settings.email_delivery_delay_s)
    model = ModelActivities(settings)
    tools = tools or ToolActivities(sessions, rate_limits=RateLimits.from_env(os.environ))
    audit = AuditActivities(sessions)
    approvals = ApprovalActivities(sessions)
    saga = SagaActivities(sessions)
    authority = AuthorityActivities(sessions)
    email = EmailActivities(sessions, settings.smtp_host, settings.smtp_port, settings.smtp_sender)
    # Client input is untrusted: signals, updates and start inputs that do not decode reach their
    # handler as `Unreadable` (countersign.payloads), whatever converter the caller's client has.
    config = client.config()
    config["data_converter"] = data_converter
    client = Client(**config)
    return Worker(
        client,
        task_queue=settings.task_queue,
        workflows=[AgentWorkflow],
        activities=[
            context.load_conversation_context,
            model.call_model,
            tools.check_arguments,
            tools.execute_tool,
            audit.record_unexecuted_call,
            approvals.record_decision,
            approvals.send_approval_reminder,
            saga.compensate_call,
            saga.record_compensation_failure,
            saga.authorize_rollback,
            email.deliver_email,
            authority.authorize_action,
            authority.seal_carried,
            authority.verify_carried,
        ],
        interceptors=[ActivityLogContext(), *interceptors],
        max_cached_workflows=settings.max_cached_workflows,
        workflow_runner=SandboxedWorkflowRunner(
            restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH)
        ),
    )


async def main() -> None:
    configure_logging()
    log = get_logger("countersign.worker")
    settings = load_settings()
    if not settings.database_url:
        raise SystemExit("worker: no DATABASE_URL: run `python starter.py dev up` or set DATABASE_URL")
    client = await connect(settings)
    engine = create_engine(settings.database_url)
    try:
        worker = build_worker(client, settings, session_factory(engine))
        log.info(
            "worker started",
            task_queue=settings.task_queue,
            temporal=settings.temporal_address,
            model=settings.llm_model,
            llm_base_url=settings.llm_base_url,
        )
        await worker.run()
    finally:
        await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main())

"""The Countersign worker: the AgentWorkflow and every activity, on one task queue.

python worker.py      # settings from the environment, or from `starter.py dev up`
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.client import Client
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.worker import Interceptor, Worker, WorkerDeploymentConfig
from temporalio.worker.workflow_sandbox import SandboxRestrictions

from activities.approvals import ApprovalActivities
from activities.audit import AuditActivities
from activities.authority import AuthorityActivities
from activities.context import ContextActivities
from activities.email import EmailActivities
from activities.failures import DatabaseRefusals
from activities.mcp import McpActivities
from activities.model import ModelActivities
from activities.notifications import NotificationActivities
from activities.policies import PolicyActivities
from activities.proofs import ProofActivities
from activities.rollback import RollbackActivities
from activities.saga import SagaActivities
from activities.store import StoreActivities
from activities.tools import ToolActivities
from countersign.client.temporal_client import connect
from countersign.db.engine import create_engine, session_factory
from countersign.db.messages import ConversationStore
from countersign.db.ratelimit import RateLimits
from countersign.db.ratings import rating_totals
from countersign.identity.mode import ModeMismatch, deployment_mode, settle
from countersign.identity.proofs import ProofVerifier
from countersign.mcp.pool import McpPool
from countersign.observability.metrics import CountersignMetrics, MetricsInterceptor, WorkerMetrics
from countersign.observability.tracing import GenAiSpans
from countersign.observability.usage import ModelCallAudit
from countersign.runtime.config import Settings, load_settings
from countersign.runtime.logs import ActivityLogContext, get_logger
from countersign.runtime.logs import configure as configure_logging
from countersign.runtime.payloads import data_converter
from countersign.runtime.sandbox import sandbox_runner
from workflows.agent import AgentWorkflow
from workflows.rollback import RollbackWorkflow

# Pure, deterministic modules the workflow imports: pass them through the sandbox instead of
# re-importing them for every workflow run.
PASSTHROUGH = ("countersign", "pydantic", "pydantic_core", "annotated_types")


def build_worker(
    client: Client,
    settings: Settings,
    sessions: async_sessionmaker[AsyncSession],
    tools: ToolActivities | None = None,
    interceptors: Sequence[Interceptor] = (),
    metrics: CountersignMetrics | None = None,
    mcp_pool: McpPool | None = None,
) -> Worker:
    """The worker; `tools` replaces the tool activities (the default's rate limits come from the
    environment: RATE_LIMIT_PER_S, RATE_LIMIT_BURST); `interceptors` run inside the logging one;
    `metrics` is filled by the worker's activities (and watches its circuit breakers); `mcp_pool`
    holds the MCP connections (its owner closes it when the worker stops)."""
    mcp_pool = mcp_pool or McpPool(cool_down_s=settings.breaker_cool_down_s)
    mcp = McpActivities(sessions, mcp_pool, rate_limits=RateLimits.from_env(os.environ))
    context = ContextActivities(sessions, settings.email_delivery_delay_s, mcp_pool)
    store = ConversationStore(sessions)
    model = ModelActivities(settings, store)
    stored = StoreActivities(store)
    tools = tools or ToolActivities(sessions, rate_limits=RateLimits.from_env(os.environ))
    audit = AuditActivities(sessions)
    verifier = ProofVerifier.for_mode(settings.approver_auth, settings.proof_public_key)
    approvals = ApprovalActivities(sessions, verifier)
    saga = SagaActivities(sessions, verifier)
    proofs = ProofActivities(sessions, verifier)
    authority = AuthorityActivities(sessions)
    email = EmailActivities(
        sessions, settings.smtp_host, settings.smtp_port, settings.smtp_sender,
        cool_down_s=settings.breaker_cool_down_s,
    )  # fmt: skip
    notifications = NotificationActivities(
        sessions, settings.inbox_url, settings.smtp_host, settings.smtp_port, settings.smtp_sender,
        smtp_configured=settings.smtp_configured,
    )  # fmt: skip
    observability: list[Interceptor] = [ModelCallAudit(sessions), GenAiSpans(settings.llm_model)]
    if metrics is not None:
        metrics.watch_breakers(lambda: [model.breaker, email.breaker, *mcp_pool.breakers])
        metrics.watch_ratings(lambda: rating_totals(sessions))
        observability.append(MetricsInterceptor(metrics))
    # Client input is untrusted: signals, updates and start inputs that do not decode reach their
    # handler as `Unreadable` (countersign.runtime.payloads), whatever converter the caller's client has.
    config = client.config()
    config["data_converter"] = data_converter
    client = Client(**config)
    return Worker(
        client,
        task_queue=settings.task_queue,
        workflows=[AgentWorkflow, RollbackWorkflow],
        activities=[
            context.load_conversation_context,
            model.call_model,
            model.summarize_conversation,
            stored.append_messages,
            stored.load_turn_reply,
            tools.check_arguments,
            PolicyActivities(sessions).evaluate_policy,
            tools.execute_tool,
            audit.record_unexecuted_call,
            approvals.record_decision,
            approvals.send_approval_reminder,
            approvals.record_approval_request,
            saga.compensate_call,
            saga.record_compensation_failure,
            saga.authorize_rollback,
            RollbackActivities(sessions).load_saga_entries,
            proofs.check_action_proof,
            notifications.notify_approval,
            email.deliver_email,
            mcp.check_mcp_arguments,
            mcp.execute_mcp_tool,
            authority.authorize_action,
            authority.seal_carried,
            authority.verify_carried,
            authority.register_conversation,
        ],
        interceptors=[ActivityLogContext(), DatabaseRefusals(), *observability, *interceptors],
        max_cached_workflows=settings.max_cached_workflows,
        workflow_runner=sandbox_runner(
            restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH)
        ),
        deployment_config=deployment_config(settings),
    )


def settings_refused(invalid: ValidationError) -> str:
    """Why the environment's settings were refused, one clause per setting (COUNTERSIGN_BUILD_ID is
    `build_id`), without the value's repr pydantic appends."""
    return "; ".join(
        f"{'.'.join(map(str, e['loc']))}: {e['msg'].removeprefix('Value error, ')}" for e in invalid.errors()
    )


def deployment_config(settings: Settings) -> WorkerDeploymentConfig | None:
    """The worker's build in its Worker Deployment (COUNTERSIGN_BUILD_ID), or None: unversioned.

    Its workflows are pinned: a run stays on the build that started it, and a conversation moves to
    the deployment's current build when it continues as new (docs/how-to/deploy-a-new-build.md). Set
    here, not on the workflow definitions: a server refuses a versioning behavior from an
    unversioned worker.
    """
    if settings.build_id is None:
        return None
    version = WorkerDeploymentVersion(deployment_name=settings.deployment_name, build_id=settings.build_id)
    return WorkerDeploymentConfig(
        version=version, use_worker_versioning=True, default_versioning_behavior=VersioningBehavior.PINNED
    )


async def main() -> None:
    configure_logging()
    log = get_logger("countersign.worker")
    try:
        settings = load_settings()
    except ValidationError as invalid:  # a setting from the environment: name it, no traceback
        raise SystemExit(f"worker: {settings_refused(invalid)}") from None
    database_url = settings.database_url
    if not database_url:
        raise SystemExit("worker: no DATABASE_URL: run `python starter.py dev up` or set DATABASE_URL")
    # the deployment's mode, not this process's: a worker configured otherwise refuses to start
    recorded = await deployment_mode(database_url)
    try:
        mode = settle(settings.approver_auth if settings.auth_configured else None, recorded)
    except ModeMismatch as err:
        raise SystemExit(f"worker: {err}") from None
    settings = settings.model_copy(update={"approver_auth": mode})
    metrics = WorkerMetrics.from_env()  # COUNTERSIGN_METRICS_PORT
    client = await connect(settings, metrics.runtime if metrics else None)
    engine = create_engine(database_url)
    mcp_pool = McpPool(cool_down_s=settings.breaker_cool_down_s)
    try:
        worker = build_worker(
            client,
            settings,
            session_factory(engine),
            metrics=metrics.metrics if metrics else None,
            mcp_pool=mcp_pool,
        )
        metrics_port = await metrics.server.start() if metrics else None
        log.info(
            "worker started",
            metrics_port=metrics_port,
            task_queue=settings.task_queue,
            temporal=settings.temporal_address,
            model=settings.llm_model,
            approver_auth=settings.approver_auth,
            llm_base_url=settings.llm_base_url,
            build=f"{settings.deployment_name}.{settings.build_id}" if settings.build_id else "unversioned",
        )
        await worker.run()
    finally:
        if metrics:
            await metrics.server.stop()
        await mcp_pool.close()
        await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main())

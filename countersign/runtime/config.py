"""Settings read from the environment (names fixed by CONTRACT.md).

An unset variable means "use the embedded part": `starter.py dev up` writes the addresses of what it
started into `.data/stack.json`, and `load_settings()` fills the gaps from there. A variable that is
set always wins, so production points at real services with plain env vars.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, field_validator

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = Path(os.environ.get("COUNTERSIGN_DATA_DIR", PROJECT_ROOT / ".data"))
STACK_FILE = DATA_DIR / "stack.json"

SCRIPTED_MODEL_NAME = "countersign-scripted"
SCRIPTED_LABEL = "[scripted model]"
# Which agent a model request is for: the call_model activity sends it, the scripted model picks its
# script by it, a real endpoint ignores it.
AGENT_HEADER = "X-Countersign-Agent"


class Settings(BaseModel):
    temporal_address: str = "127.0.0.1:7233"
    namespace: str = "default"
    task_queue: str = "countersign"
    database_url: str | None = None
    llm_base_url: str | None = None
    llm_api_key: str = "scripted"
    llm_model: str = SCRIPTED_MODEL_NAME
    scenario: str | None = None
    # Model replies are streamed (`stream=True`) and their text published to readers as it arrives;
    # LLM_STREAM=false asks for whole replies (an endpoint that cannot stream; the benchmark's baseline).
    llm_stream: bool = True
    ui_url: str = "http://127.0.0.1:8233"
    # Where deliver_email sends the outbox (a local catcher by default; a relay in production).
    smtp_host: str = "127.0.0.1"
    smtp_port: int = 8025
    smtp_sender: str = "agent@countersign.local"
    # Emails go out this long after the turn that queued them: the window in which undoing the
    # turn (or the conversation) cancels them instead of finding them sent.
    email_delivery_delay_s: float = 60.0
    # Conversations a worker keeps in memory between their workflow tasks (the SDK's default is
    # 1000). Each costs ~0.4 MB (its sandboxed copy of the workflow module and its state); one pushed
    # out is rebuilt by replaying its history when it next has work (an approval, a message), which
    # costs milliseconds (docs/benchmark.md, section 4). Env: WORKER_MAX_CACHED_WORKFLOWS.
    max_cached_workflows: int = Field(250, ge=0)
    # Who asked and who decided: `signed` (only a proof the server issued counts) or `names` (a bare
    # name is claimed, the demo's default). COUNTERSIGN_AUTH, or its older name APPROVER_AUTH; the
    # deployment's recorded mode wins (countersign.identity.mode): `auth_configured` says whether
    # this process was given one. Keys: PEM text or a file path; unset, the embedded stack's pair.
    approver_auth: Literal["signed", "names"] = "names"
    auth_configured: bool = False
    proof_public_key: str | None = None
    proof_private_key: str | None = None  # the inbox only: the worker can verify, never sign
    # The key chat channels' secrets are stored with (countersign/db/sealed.py): Fernet keys, comma
    # separated (the first encrypts), or a file; unset, the embedded stack's `.data/secrets.key`.
    secrets_key: str | None = None
    # Where signed checkpoints of each tenant's audit chain head are written (countersign/identity/
    # checkpoints.py): a place the database's users cannot write, e.g. a volume of its own. The
    # server writes one every `checkpoint_interval_s` seconds for each tenant whose head moved (0:
    # never; exports still write one). Env: COUNTERSIGN_CHECKPOINT_DIR, COUNTERSIGN_CHECKPOINT_INTERVAL_S.
    checkpoint_dir: Path = DATA_DIR / "checkpoints"
    # How long an open circuit breaker (the model, the SMTP server, each MCP server) refuses calls
    # before it lets one probe through: five minutes, the design's figure, so an integration that is
    # down is not hammered. Env: COUNTERSIGN_BREAKER_COOL_DOWN_S.
    breaker_cool_down_s: float = Field(300.0, ge=1, le=86_400)
    checkpoint_interval_s: float = Field(300.0, ge=0)
    inbox_port: int = 8300
    inbox_public_url: str | None = None  # what notifications link to, when not http://127.0.0.1:PORT
    # The server's cookies are `Secure` (sent over TLS only): set behind a TLS proxy; a request that
    # arrived over TLS gets them anyway. Env: COUNTERSIGN_COOKIE_SECURE.
    cookie_secure: bool = False
    # Worker Deployment Versioning (docs/how-to/deploy-a-new-build.md): with a build id the worker
    # serves deployment `deployment_name` as that build, and a conversation stays on the build it
    # started on until it continues as new. Unset (the embedded stack, tests): an unversioned worker,
    # which runs every open conversation on its code.
    build_id: str | None = None
    deployment_name: str = "countersign"

    @field_validator("build_id", "deployment_name")
    @classmethod
    def _no_dot(cls, name: str | None) -> str | None:
        """Temporal writes a version as DEPLOYMENT.BUILD_ID (the SDK's canonical string): a dot or a
        space in either part would make it ambiguous, so it is refused here, saying so."""
        if name is not None and (not name or any(c == "." or c.isspace() for c in name)):
            raise ValueError(
                f"{name!r} has a dot or a space: Temporal writes a version as DEPLOYMENT.BUILD_ID, "
                "so use letters, digits, - or _ (e.g. COUNTERSIGN_BUILD_ID=2026-11-25-1)"
            )
        return name

    @property
    def scripted_model(self) -> bool:
        """True when the model is the project's scripted server, not a real LLM endpoint."""
        return self.llm_model == SCRIPTED_MODEL_NAME

    @property
    def smtp_configured(self) -> bool:
        """Whether a mail server was named (SMTP_HOST, or the stack's mail catcher): without one,
        reviewers' notices by email are recorded as undeliverable once, not retried for an hour."""
        return "smtp_host" in self.model_fields_set

    @property
    def inbox_url(self) -> str:
        return self.inbox_public_url or f"http://127.0.0.1:{self.inbox_port}"

    def workflow_url(self, workflow_id: str) -> str:
        return f"{self.ui_url}/namespaces/{self.namespace}/workflows/{workflow_id}"


def read_stack_file() -> dict[str, str]:
    """What `dev up` recorded of the embedded stack, or {} when it is not running."""
    try:
        data = json.loads(STACK_FILE.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, str)}


def load_settings(env: dict[str, str] | None = None) -> Settings:
    env = dict(os.environ if env is None else env)
    stack = read_stack_file()

    def pick(name: str, stack_key: str | None = None) -> str | None:
        return env.get(name) or (stack.get(stack_key) if stack_key else None)

    auth_mode = (env.get("COUNTERSIGN_AUTH") or env.get("APPROVER_AUTH") or "").strip().lower()
    values: dict[str, str | None] = {
        "temporal_address": pick("TEMPORAL_ADDRESS", "temporal_address"),
        "namespace": env.get("TEMPORAL_NAMESPACE"),
        "task_queue": env.get("TASK_QUEUE"),
        "database_url": pick("DATABASE_URL", "database_url"),
        "llm_base_url": pick("LLM_BASE_URL", "llm_base_url"),
        "llm_api_key": env.get("LLM_API_KEY") or env.get("OPENAI_API_KEY"),
        # A real endpoint without LLM_MODEL gets a common default rather than the scripted model's name.
        "llm_model": env.get("LLM_MODEL") or ("gpt-4o-mini" if env.get("LLM_BASE_URL") else None),
        "scenario": env.get("SCENARIO"),
        "llm_stream": env.get("LLM_STREAM"),
        "ui_url": pick("TEMPORAL_UI_URL", "ui_url"),
        "smtp_host": pick("SMTP_HOST", "smtp_host"),
        "smtp_port": pick("SMTP_PORT", "smtp_port"),
        "smtp_sender": env.get("SMTP_SENDER"),
        "email_delivery_delay_s": env.get("EMAIL_DELIVERY_DELAY_S"),
        "max_cached_workflows": env.get("WORKER_MAX_CACHED_WORKFLOWS"),
        # the deployment's mode: what this process was told, else the running embedded stack's
        "approver_auth": auth_mode or stack.get("approver_auth", ""),
        "auth_configured": "true" if auth_mode else None,
        "proof_public_key": env.get("COUNTERSIGN_PROOF_PUBLIC_KEY"),
        "proof_private_key": env.get("COUNTERSIGN_PROOF_PRIVATE_KEY"),
        "secrets_key": env.get("COUNTERSIGN_SECRETS_KEY"),
        "checkpoint_dir": env.get("COUNTERSIGN_CHECKPOINT_DIR"),
        "breaker_cool_down_s": env.get("COUNTERSIGN_BREAKER_COOL_DOWN_S"),
        "checkpoint_interval_s": env.get("COUNTERSIGN_CHECKPOINT_INTERVAL_S"),
        "inbox_port": env.get("COUNTERSIGN_INBOX_PORT"),
        "inbox_public_url": env.get("COUNTERSIGN_INBOX_URL"),
        "cookie_secure": env.get("COUNTERSIGN_COOKIE_SECURE"),
        "build_id": env.get("COUNTERSIGN_BUILD_ID"),
        "deployment_name": env.get("COUNTERSIGN_DEPLOYMENT"),
    }
    return Settings(**{k: v for k, v in values.items() if v})

"""docker-compose.yml and the Dockerfile, checked without a Docker engine: every reference resolves
(services, files, commands, environment names the code reads, ports, health and start order)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import tomllib
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.fernet import Fernet
from sqlalchemy.engine import make_url
from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import Worker

from countersign.core import history
from countersign.core.bounds import MAX_PAYLOAD_BYTES, SERVER_LIMITS
from countersign.devstack.temporal import DevServerConfig, temporal_binary
from countersign.observability.workflow_metrics import HISTORY_BYTES, HISTORY_BYTES_BUCKETS
from countersign.runtime.config import PROJECT_ROOT, SCRIPTED_MODEL_NAME
from countersign.scripted_model.scenario import load_scenarios

COMPOSE = yaml.safe_load((PROJECT_ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
DOCKERFILE = (PROJECT_ROOT / "Dockerfile").read_text()
BUILT = ("migrate", "worker")  # the services that build this project's image
OURS = (*BUILT, "seed", "model")  # the services running it
ONE_SHOTS = {name for name, s in SERVICES.items() if s.get("restart") == "no"}
# Where the code reads its environment: settings, logging, the worker's rate limits and metrics.
ENV_READERS = (
    "countersign/runtime/config.py",
    "countersign/runtime/logs.py",
    "countersign/db/ratelimit.py",
    "countersign/observability/metrics.py",
    "countersign/identity/carried_key.py",
)
REQUIRED_ENV = {"TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TASK_QUEUE", "DATABASE_URL"} | {
    "LLM_BASE_URL",
    "LLM_API_KEY",
    "LLM_MODEL",
}


def env_names_read() -> set[str]:
    pattern = re.compile(r"""(?:environ\.get|env\.get|pick)\(\s*["']([A-Z][A-Z0-9_]+)["']""")
    return {name for path in ENV_READERS for name in pattern.findall((PROJECT_ROOT / path).read_text())}


def test_every_service_has_an_image_or_a_build() -> None:
    assert all("image" in s or "build" in s for s in SERVICES.values())
    for name in OURS:
        assert SERVICES[name]["image"] == "countersign:latest", name
    for name in BUILT:
        assert SERVICES[name].get("build") == ".", name


@pytest.mark.parametrize(
    ("service", "command"),
    [("worker", ["python", "worker.py"]), ("migrate", ["python", "starter.py", "db", "upgrade"])],
)
def test_commands_exist(service: str, command: list[str]) -> None:
    assert SERVICES[service]["command"] == command
    assert (PROJECT_ROOT / command[1]).is_file()
    if command[1] == "starter.py":  # the CLI parses the sub-command
        subprocess.run(
            [sys.executable, *command[1:], "--help"], cwd=PROJECT_ROOT, check=True, capture_output=True
        )


def test_environment_names_are_the_ones_the_code_reads() -> None:
    known = env_names_read()
    assert REQUIRED_ENV <= known  # the scan works
    for name in ("migrate", "worker", "seed"):
        env = set(SERVICES[name]["environment"])
        assert REQUIRED_ENV <= env, name
        assert env <= known, f"{name} sets names nothing reads: {env - known}"


def published(service: str) -> list[str]:
    return [str(p) for p in SERVICES[service].get("ports", [])]


def test_only_the_tls_proxy_is_public_and_temporal_stays_inside() -> None:
    """The server is the one public door, behind TLS; Temporal, its UI and the metrics are not
    published, or only on 127.0.0.1 (docs/explanation/security.md)."""
    public = {
        name: ports
        for name in SERVICES
        if (ports := [p for p in published(name) if not p.startswith("127.0.0.1:")])
    }
    assert public == {"proxy": ["443:443", "80:80"]}, public
    assert published("temporal") == [] and published("worker") == [] and published("inbox") == []
    assert published("temporal-ui") == ["127.0.0.1:8233:8080"]
    assert SERVICES["temporal-ui"]["environment"]["TEMPORAL_DISABLE_WRITE_ACTIONS"] == "true"
    caddyfile = (PROJECT_ROOT / "deploy" / "Caddyfile").read_text()
    assert "reverse_proxy inbox:8300" in caddyfile and "{$COUNTERSIGN_DOMAIN" in caddyfile
    assert "./deploy/Caddyfile:/etc/caddy/Caddyfile:ro" in SERVICES["proxy"]["volumes"]
    server = SERVICES["inbox"]
    assert server["command"] == ["python", "starter.py", "server", "--host", "0.0.0.0"]
    assert server["environment"]["COUNTERSIGN_COOKIE_SECURE"] == "1"
    assert server["environment"]["COUNTERSIGN_INBOX_URL"].startswith("https://")
    # signed mode, recorded by the migration for every worker
    assert SERVICES["migrate"]["environment"]["COUNTERSIGN_AUTH"] == "signed"
    assert "APPROVER_AUTH" not in SERVICES["worker"]["environment"]


def test_the_worker_scales_out_with_compose() -> None:
    """`docker compose up --scale worker=3`: replicas need no fixed name and publish no port (two
    replicas could not hold either); they poll one task queue, so Temporal spreads the work."""
    worker = SERVICES["worker"]
    assert "container_name" not in worker and "ports" not in worker


def test_healthchecks() -> None:
    long_running = set(SERVICES) - ONE_SHOTS
    assert all("healthcheck" in SERVICES[name] for name in long_running), long_running
    assert all(SERVICES[name].get("restart") == "unless-stopped" for name in long_running)


def test_start_order_is_consistent() -> None:
    for name, service in SERVICES.items():
        for dependency, rule in service.get("depends_on", {}).items():
            assert dependency in SERVICES, f"{name} depends on unknown {dependency}"
            if rule["condition"] == "service_completed_successfully":
                assert dependency in ONE_SHOTS, f"{name} waits for {dependency} to complete, but it restarts"
            else:
                assert rule["condition"] == "service_healthy" and "healthcheck" in SERVICES[dependency]
    assert {"migrate", "temporal-setup"} <= set(SERVICES["worker"]["depends_on"])


def test_mounted_files_exist() -> None:
    for service in SERVICES.values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (PROJECT_ROOT / source).is_file(), source
            else:
                assert source in COMPOSE["volumes"], source


def test_dockerfile_copies_the_code_and_runs_the_worker() -> None:
    copied = {
        part.rstrip("/")
        for line in re.findall(r"^COPY (.+)$", DOCKERFILE, re.M)
        for part in line.split()[:-1]
    }
    imported = {"countersign", "workflows", "activities", "tools", "worker.py", "starter.py"}
    assert imported <= copied
    assert all((PROJECT_ROOT / name).exists() for name in imported)
    assert re.search(r'^CMD \["python", "worker.py"\]$', DOCKERFILE, re.M)


def test_dynamic_config_is_mounted_and_speeds_up_dispatch() -> None:
    mount = next(v for v in SERVICES["temporal"]["volumes"] if "dynamicconfig" in v)
    source, target = mount.split(":")[:2]
    config = yaml.safe_load(Path(PROJECT_ROOT / source).read_text())
    assert config["history.transferProcessorMaxPollRPS"][0]["value"] >= 1000
    assert config["system.enableActivityEagerExecution"][0]["value"] is True
    assert target.endswith(SERVICES["temporal"]["environment"]["DYNAMIC_CONFIG_FILE_PATH"])


def test_the_server_refuses_payloads_over_countersigns_bound_in_compose_and_the_dev_stack() -> None:
    """One bound (MAX_PAYLOAD_BYTES) everywhere: compose's dynamic config, the embedded dev server."""
    config = yaml.safe_load((PROJECT_ROOT / "deploy/dynamicconfig.yaml").read_text())
    assert SERVER_LIMITS["limit.blobSize.error"] == MAX_PAYLOAD_BYTES
    assert SERVER_LIMITS["history.maxInFlightUpdatePayloads"] == MAX_PAYLOAD_BYTES  # an update's
    for key, value in SERVER_LIMITS.items():
        assert config[key] == [{"value": value}], key
        assert f"{key}={value}" in DevServerConfig(port=1, ui_port=2, db_file=Path("x")).dynamic_config


def test_prometheus_scrapes_the_worker_metrics_port_and_grafana_loads_the_dashboard() -> None:
    port = SERVICES["worker"]["environment"]["COUNTERSIGN_METRICS_PORT"]
    mount = next(v for v in SERVICES["prometheus"]["volumes"] if v.startswith("./"))
    config = yaml.safe_load((PROJECT_ROOT / mount.split(":")[0]).read_text())
    (job,) = config["scrape_configs"]
    (found,) = job["dns_sd_configs"]  # each replica of `--scale worker=N` a target of its own
    assert found == {"names": ["worker"], "type": "A", "port": int(port)}
    mounted = {v.split(":")[1]: v.split(":")[0] for v in SERVICES["grafana"]["volumes"]}
    provider = yaml.safe_load(
        (PROJECT_ROOT / mounted["/etc/grafana/provisioning/dashboards/countersign.yml"]).read_text()
    )
    dashboards_dir = provider["providers"][0]["options"]["path"]
    assert any(target.startswith(dashboards_dir + "/") and target.endswith(".json") for target in mounted)
    datasource = yaml.safe_load(
        (PROJECT_ROOT / mounted["/etc/grafana/provisioning/datasources/countersign.yml"]).read_text()
    )
    assert datasource["datasources"][0]["uid"] == "prometheus"
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"


# --- after `up`: what a person does next --------------------------------------------------------

COMPOSE_TEXT = (PROJECT_ROOT / "docker-compose.yml").read_text()
COUNTERSIGN_ENV: dict[str, str] = SERVICES["worker"]["environment"]
INTERPOLATION = re.compile(r"\$\{([A-Z0-9_]+)(:?[-?+])?([^}]*)\}")


def with_defaults(value: str) -> str:
    """A compose value with each `${VAR:-default}` replaced by its default; `${VAR:?…}` stays."""
    return INTERPOLATION.sub(lambda m: m.group(3) if m.group(2) == ":-" else m.group(0), value)


def default_of(value: str) -> str:
    """A compose value with every `${VAR:-default}` replaced by its default (no variable exported)."""
    assert ":?" not in value, f"{value} has no default"
    return INTERPOLATION.sub(lambda m: m.group(3), value)


# No default: a default password is the one nobody changes (issue 40: Grafana's `admin` let its
# admin add a PostgreSQL data source with the superuser's default `postgres`).
SECRETS = {"POSTGRES_PASSWORD", "COUNTERSIGN_DB_PASSWORD", "GRAFANA_ADMIN_PASSWORD"}


def test_every_variable_but_the_passwords_has_a_default_and_the_passwords_none() -> None:
    """A password is required (`:?`, compose refuses to run without it); everything else has a
    default, so with the `.env` deploy/secrets.sh writes `ps`, `logs` and `down` need nothing."""
    found = INTERPOLATION.findall(COMPOSE_TEXT)
    assert {name for name, _, _ in found} >= SECRETS
    for name, operator, _ in found:
        assert operator == (":?" if name in SECRETS else ":-"), name


def test_no_password_in_compose_has_a_default() -> None:
    """Every value that carries a password (PostgreSQL's, Temporal's, the countersign role's in
    DATABASE_URL, Grafana's admin's) is one of the required variables, nothing else."""
    carried = 0
    for name, service in SERVICES.items():
        for key, value in (service.get("environment") or {}).items():
            if "PASSWORD" in key or key.endswith("_PWD"):
                match = INTERPOLATION.fullmatch(str(value))
                assert match and match[1] in SECRETS and match[2] == ":?", (name, key, value)
                carried += 1
            elif "://" in str(value) and "@" in str(value):  # credentials in a URL
                assert re.search(r"://\w+:\$\{COUNTERSIGN_DB_PASSWORD:\?[^}]*\}@", value), (name, key)
                carried += 1
    assert carried >= 5


def test_the_secrets_script_writes_each_password_once_for_the_owner_only(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    script = PROJECT_ROOT / "deploy" / "secrets.sh"
    first = subprocess.run(["sh", str(script), str(env_file)], capture_output=True, text=True, check=True)
    assert first.stdout.startswith("created")
    written = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
    assert set(written) == SECRETS
    assert all(re.fullmatch(r"[0-9a-f]{48}", v) for v in written.values()) and len(set(written.values())) == 3
    assert env_file.stat().st_mode & 0o077 == 0
    again = subprocess.run(["sh", str(script), str(env_file)], capture_output=True, text=True, check=True)
    assert again.stdout.startswith("kept") and env_file.read_text().splitlines() == [
        f"{k}={v}" for k, v in written.items()
    ]
    for ignore in (".gitignore", ".dockerignore"):  # never committed, never in the image
        assert ".env" in (PROJECT_ROOT / ignore).read_text().splitlines(), ignore


def test_the_default_model_is_the_scripted_service() -> None:
    model = SERVICES["model"]
    assert model["profiles"] == ["scripted"]
    url = default_of(COUNTERSIGN_ENV["LLM_BASE_URL"])
    assert url == "http://model:8400/v1"
    assert default_of(COUNTERSIGN_ENV["LLM_MODEL"]) == SCRIPTED_MODEL_NAME
    assert model["command"][:3] == ["countersign", "model", "serve"]
    scenario = model["command"][model["command"].index("--scenario") + 1]
    assert load_scenarios(PROJECT_ROOT / scenario)  # the directory the image carries
    assert "countersign" in DOCKERFILE and scenario.split("/")[0] == "countersign"


def test_a_seed_profile_and_the_console_script_for_exec() -> None:
    seed = SERVICES["seed"]
    assert seed["profiles"] == ["seed"]
    assert seed["command"] == ["countersign", "db", "seed"]
    assert seed["depends_on"] == {"migrate": {"condition": "service_completed_successfully"}}
    # `docker compose exec worker countersign …` runs the console script the image installs.
    scripts = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["countersign"] == "countersign.cli:main"
    subprocess.run(
        [sys.executable, "starter.py", "db", "seed", "--help"],
        cwd=PROJECT_ROOT,
        check=True,
        capture_output=True,
    )


def test_the_database_password_reaches_the_init_script() -> None:
    postgres_env = SERVICES["postgresql"]["environment"]
    password = "s3cret-from-env"
    url = make_url(INTERPOLATION.sub(password, COUNTERSIGN_ENV["DATABASE_URL"]))
    # Both come from the same variable, so setting it sets both.
    assert url.password == password and url.username == "countersign"
    assert INTERPOLATION.fullmatch(postgres_env["COUNTERSIGN_DB_PASSWORD"])[1] == "COUNTERSIGN_DB_PASSWORD"  # type: ignore[index]
    mount = next(v for v in SERVICES["postgresql"]["volumes"] if "docker-entrypoint-initdb.d" in v)
    script = (PROJECT_ROOT / mount.split(":")[0]).read_text()
    assert mount.split(":")[1].endswith(".sh")  # the image runs .sh with the container's environment
    assert '-v countersign_password="${COUNTERSIGN_DB_PASSWORD' in script
    assert "WITH PASSWORD :'countersign_password'" in script
    assert password not in script and "PASSWORD '" not in script  # no password written into the script


def test_a_mail_catcher_profile_receives_what_the_worker_delivers() -> None:
    host, port = default_of(COUNTERSIGN_ENV["SMTP_HOST"]), default_of(COUNTERSIGN_ENV["SMTP_PORT"])
    catcher = SERVICES[host]
    assert catcher["profiles"] == ["mail"]
    assert catcher["image"].startswith("axllent/mailpit:")
    assert port == "1025"  # mailpit's SMTP port; its web inbox is 8025
    assert "127.0.0.1:8025:8025" in catcher["ports"]


def test_the_build_context_leaves_out_the_virtualenv_and_the_data() -> None:
    ignored = {
        line.strip()
        for line in (PROJECT_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".venv", ".data", ".git"} <= ignored
    copied = {
        part.rstrip("/")
        for line in re.findall(r"^COPY (.+)$", DOCKERFILE, re.M)
        for part in line.split()[:-1]
    }
    assert not copied & ignored, "the Dockerfile copies something the context leaves out"


def test_the_ui_image_is_the_one_the_dev_server_serves() -> None:
    version = subprocess.run(
        [temporal_binary(), "--version"], capture_output=True, text=True, check=True
    ).stdout
    ui = re.search(r"UI (\d+\.\d+\.\d+)", version)
    assert ui, version
    assert SERVICES["temporal-ui"]["image"] == f"temporalio/ui:{ui.group(1)}"


def test_the_worker_healthcheck_runs_the_healthcheck_command() -> None:
    assert SERVICES["worker"]["healthcheck"]["test"] == ["CMD", "countersign", "healthcheck"]


@pytest.mark.devserver
async def test_the_worker_healthcheck_fails_without_a_polling_worker(dev_server: DevServerConfig) -> None:
    """`countersign healthcheck` passes while a worker of this host polls the queue, and fails otherwise."""
    client = await Client.connect(dev_server.address)
    queue = f"health-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "TEMPORAL_ADDRESS": dev_server.address, "TASK_QUEUE": queue}

    async def healthcheck() -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "starter.py", "healthcheck"],
            cwd=PROJECT_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    down = await healthcheck()
    assert down.returncode == 1 and "no worker" in down.stderr
    async with Worker(client, task_queue=queue, workflows=[Idle]):
        up = await healthcheck()
    assert up.returncode == 0, up.stderr
    assert f"@{socket.gethostname()}" in up.stdout


@workflow.defn(sandboxed=False)
class Idle:
    @workflow.run
    async def run(self) -> None:
        return None


# --- each service's start-up as its image's user (no Docker engine: the same uid, the same ownership) ---

IMAGE_USER = int(re.search(r"useradd [^\n]*--uid (\d+)", DOCKERFILE)[1])  # type: ignore[index]
OUR_IMAGE = {name for name, s in SERVICES.items() if s.get("image") == "countersign:latest"}
# What each long-running service of the image does with its keys when it starts (worker.py builds
# AuthorityActivities, which loads the carried-state key, and the proof verifier; the server loads
# the signing key), printed so that the test can compare what each replica read.
KEY_STARTUP = {
    "worker": (
        "import os; from countersign.identity.carried_key import load_key;"
        " from countersign.identity.proofs import load_public_key;"
        " load_public_key(os.environ['COUNTERSIGN_PROOF_PUBLIC_KEY']); print(load_key().decode())"
    ),
    "inbox": (
        "import os; from countersign.identity.proofs import load_private_key;"
        " load_private_key(os.environ['COUNTERSIGN_PROOF_PRIVATE_KEY']); print('signing key read')"
    ),
}


def user_of(service: str) -> int:
    """The uid a service of this image runs as: compose's `user`, else the Dockerfile's USER."""
    assert re.search(r"^USER countersign$", DOCKERFILE, re.M)
    return int(SERVICES[service].get("user", IMAGE_USER))


class Host:
    """Compose's named volumes and the image's /app as fresh directories: root-owned, 0755, as
    Docker creates an empty named volume and as the Dockerfile leaves WORKDIR."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.chmod(0o755)
        self.app = self._dir("app")
        self.volumes = {name: self._dir(f"volumes/{name}") for name in COMPOSE["volumes"]}

    def _dir(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True)
        for part in (path, path.parent):
            part.chmod(0o755)
        return path

    def mounted(self, service: str, text: str) -> str:
        """`text` with each of the service's volume mount points replaced by its directory here."""
        for volume in SERVICES[service].get("volumes", []):
            source, target = volume.split(":")[:2]
            if source in self.volumes:
                text = text.replace(target, str(self.volumes[source]))
        return text

    def run_as(self, service: str, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        uid = user_of(service)
        return subprocess.run(
            ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv],
            cwd=self.app,
            env={
                "PATH": os.environ["PATH"],
                "PYTHONPATH": str(PROJECT_ROOT),
                # where the embedded stack's keys would go: the image's /app, which root owns
                "COUNTERSIGN_DATA_DIR": str(self.app / ".data"),
                **env,
            },
            capture_output=True,
            text=True,
            timeout=120,
        )

    def environment(self, service: str) -> dict[str, str]:
        """The service's environment as compose gives it with nothing exported (`${VAR:-default}`
        is its default), its volumes' mount points replaced by their directories here."""
        env = SERVICES[service].get("environment") or {}
        return {k: self.mounted(service, with_defaults(str(v))) for k, v in env.items()}

    def one_shot(self, service: str) -> subprocess.CompletedProcess[str]:
        """The one-shot's command, as its user, against these directories."""
        (command,) = SERVICES[service]["command"]
        command = self.mounted(service, command)
        command = command.replace("python starter.py", f"{sys.executable} {PROJECT_ROOT / 'starter.py'}")
        command = command.replace("python -m", f"{sys.executable} -m")
        assert SERVICES[service]["entrypoint"] == ["/bin/sh", "-c"]
        return self.run_as(service, ["/bin/sh", "-c", command], self.environment(service))


@pytest.fixture
def host() -> Any:
    root = Path(tempfile.mkdtemp(prefix="compose-host-", dir="/tmp"))
    try:
        yield Host(root)
    finally:
        shutil.rmtree(root)


@pytest.mark.skipif(os.geteuid() != 0, reason="running as the image's user needs root (setpriv)")
def test_each_service_starts_as_its_images_user_with_keys_made_once_and_shared(host: Host) -> None:
    """Issue 40: the worker ran as uid 10001 with no carried-state key configured and tried to make
    one under /app, which root owns (a crash loop); given a folder of its own, each replica would
    have made its own key. Here the keys one-shot runs as its user against fresh volumes, twice
    (a restart keeps every key), then each service of the image starts as the image's user: two
    worker replicas read the one carried-state key, the server its signing key."""
    assert {"keys", "worker", "inbox"} <= OUR_IMAGE
    for service in ("worker", "inbox"):
        assert SERVICES[service]["depends_on"]["keys"] == {"condition": "service_completed_successfully"}
    made = host.one_shot("keys")
    assert made.returncode == 0, made.stderr
    key_file = Path(host.mounted("worker", SERVICES["worker"]["environment"]["CARRIED_STATE_KEY_FILE"]))
    key = key_file.read_text()
    files = sorted(p for v in host.volumes.values() for p in v.rglob("*") if p.is_file())
    assert files and all(f.stat().st_uid == IMAGE_USER for f in files), [(f, f.stat().st_uid) for f in files]
    assert key_file.stat().st_mode & 0o077 == 0
    again = host.one_shot("keys")
    assert again.returncode == 0, again.stderr
    assert key_file.read_text() == key  # created once
    read = []
    for service in ("worker", "worker", "inbox"):  # two worker replicas
        started = host.run_as(
            service, [sys.executable, "-c", KEY_STARTUP[service]], host.environment(service)
        )
        assert started.returncode == 0, (service, started.stderr)
        read.append(started.stdout.strip())
    assert read == [key.strip(), key.strip(), "signing key read"]
    # the secrets key (chat channels' secrets at rest): made once by the keys one-shot, and every
    # service that reads or writes channels opens what another sealed with it
    secrets_file = Path(host.environment("worker")["COUNTERSIGN_SECRETS_KEY"])
    assert secrets_file.stat().st_uid == IMAGE_USER and secrets_file.stat().st_mode & 0o077 == 0
    sealed = Fernet(secrets_file.read_bytes().strip()).encrypt(b"shared").decode()
    opens = (
        "import os; from countersign.db.sealed import keys_from;"
        f" print(keys_from(os.environ['COUNTERSIGN_SECRETS_KEY']).decrypt(b'{sealed}').decode())"
    )
    for service in ("migrate", "seed", "worker", "inbox"):
        needs = SERVICES[service]["depends_on"]  # the key is made before the service starts
        assert "keys" in needs or ("migrate" in needs and "keys" in SERVICES["migrate"]["depends_on"]), (
            service
        )
        opened = host.run_as(service, [sys.executable, "-c", opens], host.environment(service))
        assert (opened.returncode, opened.stdout.strip()) == (0, "shared"), (service, opened.stderr)
    assert not (host.app / ".data").exists()  # nothing written under the image's /app
    # every file a service of the image names in its environment is readable by its user, and every
    # directory (the audit checkpoints') writable by it
    for service in OUR_IMAGE:
        for value in host.environment(service).values():
            if value.startswith(str(host.root)):
                check = ["test", "-w", value] if Path(value).is_dir() else ["cat", value]
                assert host.run_as(service, check, {}).returncode == 0, (service, value)


def test_prometheus_alerts_on_a_history_that_did_not_continue_as_new() -> None:
    """Issue 40: a burst that force-closes every workflow task keeps a run from continuing as new
    until Temporal terminates it at 50 MB; the workflow measures its history at every signal
    (`workflow_metrics.record_history`) and Prometheus loads a rule that fires past 20 MB."""
    mounted = {
        v.split(":")[1]: v.split(":")[0] for v in SERVICES["prometheus"]["volumes"] if v.startswith("./")
    }
    config = yaml.safe_load((PROJECT_ROOT / mounted["/etc/prometheus/prometheus.yml"]).read_text())
    (rule_file,) = config["rule_files"]
    rules = yaml.safe_load((PROJECT_ROOT / mounted[rule_file]).read_text())
    (rule,) = [
        r for g in rules["groups"] for r in g["rules"] if r["alert"] == "ConversationHistoryNearTemporalLimit"
    ]
    bound = re.search(rf'{HISTORY_BYTES}_bucket\{{le="(\d+)"\}}', rule["expr"])
    assert bound and float(bound[1]) in HISTORY_BYTES_BUCKETS, rule["expr"]
    assert f"{HISTORY_BYTES}_count" in rule["expr"]
    assert (
        history.HISTORY_BYTES_BUDGET < float(bound[1]) < 50_000_000
    )  # past where a run continues, before the end


def test_a_run_is_told_to_continue_as_new_before_the_server_refuses_its_signals() -> None:
    """The per-run signal cap refuses a burst at the door only past the point where every run has
    been told to continue as new (each signal adds at least one event), and Countersign's own
    history budget is never below the server's suggestion."""
    from countersign.core import bounds

    assert bounds.MAX_SIGNALS_PER_RUN > bounds.SUGGEST_CONTINUE_EVENTS
    assert history.HISTORY_EVENTS_BUDGET >= bounds.SUGGEST_CONTINUE_EVENTS
    assert history.HISTORY_BYTES_BUDGET >= bounds.SUGGEST_CONTINUE_BYTES
    assert bounds.MAX_SIGNALS_PER_RUN < 51_200  # the server's own end of a run

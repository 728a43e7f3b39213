"""docker-compose.yml and the Dockerfile, checked without a Docker engine: every reference resolves
(services, files, commands, environment names the code reads, ports, health and start order)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from countersign.config import PROJECT_ROOT

COMPOSE = yaml.safe_load((PROJECT_ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
DOCKERFILE = (PROJECT_ROOT / "Dockerfile").read_text()
OURS = ("migrate", "worker")  # the services running this project's image
ONE_SHOTS = {name for name, s in SERVICES.items() if s.get("restart") == "no"}
# Where the code reads its environment: settings, logging, the worker's rate limits and metrics.
ENV_READERS = (
    "countersign/config.py",
    "countersign/logs.py",
    "countersign/ratelimit.py",
    "countersign/observability/metrics.py",
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
        assert SERVICES[name].get("build") == "." and SERVICES[name]["image"] == "countersign:latest", name


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
    for name in OURS:
        env = set(SERVICES[name]["environment"])
        assert REQUIRED_ENV <= env, name
        assert env <= known, f"{name} sets names nothing reads: {env - known}"


def test_ports_and_healthchecks() -> None:
    assert "7233:7233" in SERVICES["temporal"]["ports"]
    assert "8233:8080" in SERVICES["temporal-ui"]["ports"]
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


def test_prometheus_scrapes_the_worker_metrics_port_and_grafana_loads_the_dashboard() -> None:
    port = SERVICES["worker"]["environment"]["COUNTERSIGN_METRICS_PORT"]
    mount = next(v for v in SERVICES["prometheus"]["volumes"] if v.startswith("./"))
    config = yaml.safe_load((PROJECT_ROOT / mount.split(":")[0]).read_text())
    (job,) = config["scrape_configs"]
    assert job["static_configs"][0]["targets"] == [f"worker:{port}"]
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

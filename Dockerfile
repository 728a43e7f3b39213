# The Countersign worker (and CLI) image. Production installs the base package only: no embedded
# PostgreSQL or Temporal binaries, those are real services in docker-compose.yml.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    COUNTERSIGN_LOG_FORMAT=json

WORKDIR /app
# The dependencies as requirements-image.lock pins them, hashes checked and nothing resolved: the
# base dependencies at the versions and hashes of requirements.lock, the environment the tests ran
# in (`make lock` writes both). Its own layer, built again only when the lock changes.
COPY requirements-image.lock ./
RUN pip install --no-cache-dir --require-hashes --no-deps -r requirements-image.lock
COPY pyproject.toml README.md ./
COPY countersign ./countersign
COPY workflows ./workflows
COPY activities ./activities
COPY tools ./tools
COPY worker.py starter.py ./
# The project itself, as the Makefile installs it: --no-deps, and setuptools from the lock (build
# isolation would fetch an unpinned one). `pip check` fails the build if the lock misses a package
# something installed needs.
# compileall: the workflow sandbox imports the workflow module afresh for every workflow run; with
# PYTHONDONTWRITEBYTECODE=1 and no bytecode it would compile it from source each time.
RUN pip install --no-cache-dir --no-deps --no-build-isolation . && pip check \
    && python -m compileall -q /app \
    && useradd --create-home --uid 10001 countersign
USER countersign

CMD ["python", "worker.py"]

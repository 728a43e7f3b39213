# The Countersign worker (and CLI) image. Production installs the base package only: no embedded
# PostgreSQL or Temporal binaries, those are real services in docker-compose.yml.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    COUNTERSIGN_LOG_FORMAT=json

WORKDIR /app
COPY pyproject.toml README.md ./
COPY countersign ./countersign
COPY workflows ./workflows
COPY activities ./activities
COPY tools ./tools
COPY worker.py starter.py ./
# compileall: the workflow sandbox imports the workflow module afresh for every workflow run; with
# PYTHONDONTWRITEBYTECODE=1 and no bytecode it would compile it from source each time.
RUN pip install --no-cache-dir . && python -m compileall -q /app \
    && useradd --create-home --uid 10001 countersign
USER countersign

CMD ["python", "worker.py"]

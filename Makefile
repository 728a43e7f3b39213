# Two commands on a fresh machine: `make demo` and `make test`. Both bootstrap .venv from PyPI, from
# requirements.lock: every package of the whole environment (dev, docs, the benchmark's peers, the
# lock's own tool) pinned with its hashes, installed as listed, then the project itself, with nothing
# resolved again.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test lint docs lock up down status bench clean bytecode

LOCK   := requirements.lock
IMAGE_LOCK := requirements-image.lock
PIP    := $(PY) -m pip install --disable-pip-version-check --progress-bar on

$(STAMP): pyproject.toml $(LOCK)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing Countersign and its dependencies into $(VENV) from $(LOCK) (a few minutes on a fresh machine)"
	@# uv first, as the lock pins it (with its hashes), then the whole lock through it: the same
	@# pins and hashes as pip would check, in seconds instead of about 45 (measured here); compiled to
	@# bytecode as pip does, since tests and CLI commands run with PYTHONDONTWRITEBYTECODE
	awk '/^uv==/{p=1} p{print} p && !/\\$$/{exit}' $(LOCK) > $(VENV)/uv-requirement.txt
	$(PIP) --require-hashes --no-deps -r $(VENV)/uv-requirement.txt
	$(VENV)/bin/uv pip install --python $(PY) --require-hashes --no-deps --compile-bytecode -r $(LOCK)
	$(PIP) --no-deps --no-build-isolation -e .
	@$(MAKE) --no-print-directory bytecode
	@touch $(STAMP)

# Bytecode for the workflow sandbox, which imports the workflow module afresh for every run (and
# compiles it from source each time when PYTHONDONTWRITEBYTECODE=1 and no .pyc exists), and for
# every CLI command. The README walk-through's borrowed virtualenv runs this too.
bytecode:
	$(PY) -m compileall -q countersign workflows activities tools worker.py starter.py

demo: $(STAMP)
	$(VENV)/bin/countersign demo

# TEST_WORKERS: pytest-xdist workers, one test file each at a time (0 runs in this process), the
# slowest files first (tests/conftest.py's SLOW_FILES). Three on two cores: many tests wait on servers,
# timers and subprocesses, so a third worker fills that time (clean clone, 1518 tests: 480 s in all); a fourth is
# no faster (607 s): the suite is CPU-bound then.
# --basetemp: pytest makes its default temp root (/tmp/pytest-of-USER) private again whenever a worker
# starts, which locks the embedded PostgreSQL's system user out of data directories under it.
TEST_WORKERS ?= 3
test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --basetemp=.pytest-tmp

# The lock, written again from pyproject.toml's dependencies (after changing them; then `make` again
# installs it). uv: it resolves for every platform at once (--universal) with hashes in seconds, and
# its pip-compatible output needs only pip to install; it is itself in the lock (the `lock` extra).
# setuptools is pyproject's build backend: locked too, so installing the project resolves nothing.
# The image's lock (Dockerfile) is the base dependencies alone, constrained to the whole lock: the
# same versions and hashes as the environment the tests ran in, without the dev and docs extras.
lock: $(STAMP)
	printf 'setuptools>=68\n' | $(VENV)/bin/uv pip compile pyproject.toml - --extra dev --extra docs \
		--extra lock --extra bench --universal --python-version 3.11 --generate-hashes --no-emit-package countersign \
		--quiet -o $(LOCK)
	printf 'setuptools>=68\n' | $(VENV)/bin/uv pip compile pyproject.toml - -c $(LOCK) \
		--universal --python-version 3.11 --generate-hashes --no-emit-package countersign \
		--quiet -o $(IMAGE_LOCK)

# The documentation site (docs/, mkdocs.yml) into site/: --strict fails on a broken link, a missing
# anchor or a page that is in no nav section.
# NO_MKDOCS_2_WARNING: Material's banner about MkDocs 2, printed on every build. Never --quiet: it
# drops the warnings before --strict counts them, and a broken link then passes.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The benchmark (a script, not a test; docs/benchmark.md): BENCH_ARGS=--quick for a short run.
bench: $(STAMP)
	$(PY) -m bench.run $(BENCH_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .

up: $(STAMP)
	$(VENV)/bin/countersign dev up

down: $(STAMP)
	$(VENV)/bin/countersign dev down

status: $(STAMP)
	$(VENV)/bin/countersign dev status

clean:
	-$(VENV)/bin/countersign dev down
	rm -rf .data site

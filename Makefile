# Two commands on a fresh machine: `make demo` and `make test`. Both bootstrap .venv from PyPI.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test lint up down status bench clean bytecode

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing Countersign and its dependencies into $(VENV) (a few minutes on a fresh machine)"
	$(PY) -m pip install --disable-pip-version-check --progress-bar on -e '.[dev]'
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
	rm -rf .data

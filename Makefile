# vkgate — the two set-up commands are `make run` and `make test`; both create .venv first.
# Every install comes from the hash-pinned locks in requirements/ (`make lock` refreshes them).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# What running needs (the embedded ledger of `vkgate up` included), and the development tools.
RUN_STAMP := $(VENV)/.run-stamp
DEV_STAMP := $(VENV)/.dev-stamp
# Test processes: each takes whole files (module fixtures are set up once); 1 runs in-process.
TEST_WORKERS ?= 2
# Installs only what a lock names, each file checked against its hash; the project itself
# builds with the lock's setuptools, not one fetched for the build.
LOCKED_INSTALL = $(BIN)/python -m pip install --quiet --require-hashes -r
PROJECT_INSTALL = $(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .

.PHONY: install install-run run demo test lint format lock lock-check clean

install: $(DEV_STAMP)

install-run: $(RUN_STAMP)

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "vkgate needs Python 3.11 or newer (set PYTHON=python3.11)")'
	$(PYTHON) -m venv $(VENV)

$(RUN_STAMP): requirements/run.txt pyproject.toml | $(BIN)/python
	$(LOCKED_INSTALL) requirements/run.txt
	$(PROJECT_INSTALL)
	$(BIN)/python -m pip check
	@touch $@

# The development lock holds the run lock's every pin (requirements/lock.py), so it is both.
$(DEV_STAMP): requirements/dev.txt pyproject.toml | $(BIN)/python
	$(LOCKED_INSTALL) requirements/dev.txt
	$(PROJECT_INSTALL)
	$(BIN)/python -m pip check
	@touch $@ $(RUN_STAMP)

run: install-run
	$(BIN)/vkgate up --demo

test: install
	$(BIN)/python -m pytest $(if $(filter 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# After changing a dependency in pyproject.toml: refresh the locks, then commit requirements/.
# UPGRADE=1 moves every pin to the newest release its range allows.
lock: install
	$(BIN)/python requirements/lock.py $(if $(UPGRADE),--upgrade,)

lock-check:
	$(PYTHON) requirements/lock.py --check

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

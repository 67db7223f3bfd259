# dlqconsole: `make run` starts the console with demo data, `make test` runs every check and test.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000

.PHONY: setup lock run test test-fast lint bench services clean

# Every package, transitive ones too, is pinned with its hashes in requirements-dev.txt (compiled by `make lock`),
# and pip refuses anything else. The venv's own pip is used as it comes: upgrading it would fetch an unpinned one.
$(VENV)/.installed: requirements.txt requirements-dev.txt scripts/python
	test -x $(PY) || "$$(scripts/python)" -m venv $(VENV)
	$(PY) -m pip install -q --require-hashes -r requirements-dev.txt
	touch $@

setup: $(VENV)/.installed

# Compiles requirements.in and requirements-dev.in into the lock files, for every Python the console supports (3.12
# and newer, on any platform). Versions already locked are kept where they still fit (`--upgrade-package NAME` on
# the command moves one).
LOCK := $(VENV)/bin/uv pip compile --universal --generate-hashes --python-version 3.12
lock: setup
	$(LOCK) requirements.in -o requirements.txt
	$(LOCK) requirements-dev.in -o requirements-dev.txt

services:
	scripts/services

run: setup services
	scripts/run

# lint-imports checks the layers of pyproject.toml's [tool.importlinter]; check-module-size, the 600-line limit.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .
	$(VENV)/bin/lint-imports --no-cache
	scripts/check-module-size
	$(VENV)/bin/djlint templates --lint

# The tests need PostgreSQL: scripts/services installs and starts it when TEST_DATABASE_URL names a local one.
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/dlqconsole

test: setup
	DATABASE_URL="$(TEST_DATABASE_URL)" scripts/services
	scripts/system-packages
	TEST_DATABASE_URL="$(TEST_DATABASE_URL)" scripts/test

# var/test as the var folder, as scripts/test has it: commands the tests run never read make run's settings.
test-fast: setup
	DATABASE_URL="$(TEST_DATABASE_URL)" scripts/services
	DATABASE_URL="$(TEST_DATABASE_URL)" DLQ_VAR_DIR="$(CURDIR)/var/test" $(VENV)/bin/pytest -x -q -m "not slow and not browser"

bench: setup services
	scripts/bench

clean:
	rm -rf $(VENV) var/*.sqlite3* var/static

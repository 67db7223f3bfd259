# dlqconsole: `make run` starts the console with demo data, `make test` runs every check and test.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000

.PHONY: setup run test test-fast lint bench services clean

$(VENV)/.installed: requirements.txt requirements-dev.txt scripts/python
	test -x $(PY) || "$$(scripts/python)" -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

setup: $(VENV)/.installed

services:
	scripts/services

run: setup services
	scripts/run

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .

test: setup services
	scripts/system-packages
	scripts/test

test-fast: setup services
	$(VENV)/bin/pytest -x -q -m "not slow and not browser"

bench: setup services
	scripts/bench

clean:
	rm -rf $(VENV) var/*.sqlite3* var/static

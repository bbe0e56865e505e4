# The two set-up commands of the README. Each installs what it needs into .venv first.
PYTHON ?= python3
VENV ?= .venv
STAMP := $(VENV)/.installed

.PHONY: demo check test bench

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test,spark]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/pystreams dev examples/wordcount.py

# Lint, format and types (configured in pyproject.toml); part of the tests.
check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: check
	$(VENV)/bin/python -m pytest -q

bench: $(STAMP)
	$(VENV)/bin/python benchmarks/assignors.py
	$(VENV)/bin/python benchmarks/coordinator.py
	$(VENV)/bin/python benchmarks/state.py

# The two set-up commands of the README. Each installs what it needs into .venv first.
PYTHON ?= python3
VENV ?= .venv
STAMP := $(VENV)/.installed

.PHONY: demo check test bench soak

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

# Two workers (CI has 2 cores): the process tests mostly wait on rebalances and sessions, so
# they overlap well with the CPU-bound ones; the Spark tests keep to one worker (conftest.py).
# The 15 slowest tests are listed, so that CI logs show what to trim before the suite nears 30 min.
test: check
	$(VENV)/bin/python -m pytest -q -n 2 --dist loadgroup --durations=15

bench: $(STAMP)
	$(VENV)/bin/python benchmarks/assignors.py
	$(VENV)/bin/python benchmarks/coordinator.py
	$(VENV)/bin/python benchmarks/state.py

# The long simulation run: SOAK_SEEDS fresh seeds of every profile on all cores, a summary per
# profile (exit status 1 on any violation). A CI range that passes is a sample, not a proof.
SOAK_SEEDS ?= 50000
SOAK_FIRST_SEED ?= 1000000
SOAK_PROFILES ?= steady churn chaos migration cluster
soak: $(STAMP)
	@status=0; for profile in $(SOAK_PROFILES); do \
		$(VENV)/bin/pystreams sim --profile $$profile --seeds $(SOAK_SEEDS) --first-seed $(SOAK_FIRST_SEED) --jobs $$(nproc) || status=1; \
	done; exit $$status

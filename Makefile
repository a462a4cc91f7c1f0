# gpuci developer entry points. Each target creates .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit chaos bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gpuci demo $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/python -m pytest -n 2 -m "not chaos" --cov --cov-branch --cov-report=term --cov-report=xml $(ARGS)

chaos: $(STAMP)
	$(BIN)/python -m pytest -m chaos $(ARGS)

test: lint typecheck unit

bench: $(STAMP)
	$(BIN)/python bench/junit_parse.py
	$(BIN)/python bench/run_env.py
	$(BIN)/python bench/fleet_plan.py
	$(BIN)/python bench/fleet_round.py
	$(BIN)/python bench/history.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .coverage .coverage.* coverage.xml htmlcov

# jobplane: `make demo` runs the whole lifecycle locally; `make test` runs every check CI runs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export PYTHONDONTWRITEBYTECODE :=

.PHONY: test lint typecheck pytest demo

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[aws,gcp,cdk,dev]'
	touch $@

test: lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest

demo: $(STAMP)
	$(BIN)/jobplane validate examples/*.yaml
	$(BIN)/python -m jobplane.local.demo

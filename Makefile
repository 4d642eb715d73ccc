# sotw: the front door. `make help` lists the targets.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help setup demo test lint typecheck unit bench report clean

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-10s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "sotw needs Python 3.11 or newer; found " + sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=25.1"
	$(BIN)/python -m pip install --quiet -e . --group dev
	$(BIN)/python -m sotw.pysparkpath
	@touch $(STAMP)

setup: $(STAMP) ## Create .venv, install sotw, check Java 17+ and Chromium (the browser test's)
	@sh scripts/check-java.sh
	@sh scripts/check-chromium.sh

demo: setup ## Run the demo on the embedded broker (set-up included)
	$(BIN)/sotw demo

lint: setup ## Ruff format check, ruff lint and mypy
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

unit: setup ## Only the test suite
	$(BIN)/pytest

test: lint unit ## Set-up, lint, type check and the full test suite

bench: setup ## Micro benchmarks and the end-to-end benchmark
	$(BIN)/pytest benchmarks --benchmark-only

clean: ## Remove the virtualenv and run outputs
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache

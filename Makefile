# sotw: the front door. `make help` lists the targets.
PYTHON ?= python3
NIGHTLY_ARGS ?=
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Bundles of Java libraries (jars/<bundle>/pom.xml), each copied by Maven into $(VENV)/jars/<bundle>/.
BUNDLES := kafka spark-kafka delta
JARS   := $(foreach b,$(BUNDLES),$(VENV)/jars/$(b)/manifest.json)
# Spark's Kafka connector and Delta's jars as spark.jars in PySpark's spark-defaults.conf (sotw/sparkjars.py).
SPARK_DEFAULTS := $(VENV)/jars/spark-defaults.installed
# examples/quixstreams_pipeline.py's own virtualenv: quixstreams 3.28 pins confluent-kafka below 2.13, sotw 2.16.
QUIX_VENV := build/quixstreams-venv

.DEFAULT_GOAL := help
.PHONY: help setup demo test test-fast test-slow lint typecheck unit bench nightly clean quixstreams-venv kafka-streams-job

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-10s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "sotw needs Python 3.11 or newer; found " + sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=25.1"
	$(BIN)/python -m pip install --quiet -e . --group dev
	$(BIN)/python -m sotw.pysparkpath
	@touch $(STAMP)

# A bundle is fetched again only when its pom.xml changes; Maven's ~/.m2 keeps what it downloaded.
$(VENV)/jars/%/manifest.json: jars/%/pom.xml | $(STAMP)
	@sh scripts/check-java.sh
	$(BIN)/python -m sotw.jars fetch $*

$(SPARK_DEFAULTS): $(VENV)/jars/spark-kafka/manifest.json $(VENV)/jars/delta/manifest.json $(STAMP)
	$(BIN)/python -m sotw.sparkjars
	@touch $@

setup: $(STAMP) $(JARS) $(SPARK_DEFAULTS) ## Create .venv, install sotw, fetch Apache Kafka, Spark's Kafka connector and Delta (Maven), check Java 17+, Chromium and nftables
	@sh scripts/check-java.sh
	@sh scripts/check-chromium.sh
	@sh scripts/check-nftables.sh

demo: setup ## Run the demo on a local Apache Kafka broker (set-up included)
	$(BIN)/sotw demo

lint: setup ## Ruff format check, ruff lint and mypy
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

typecheck: setup ## Only mypy (strict on the packages)
	$(BIN)/mypy

unit: setup ## Only the test suite (without the long tests marked slow)
	$(BIN)/pytest -m "not slow"

test-fast: setup ## The tests that need no broker, Spark or other process of the system: the inner loop (under a minute)
	$(BIN)/pytest -m "not slow and not system"

test-slow: setup ## Only the long end-to-end tests marked slow (the nightly job runs them)
	$(BIN)/pytest -m slow

test: lint unit ## Set-up, lint, type check and the test suite (the slow tests: make test-slow)

bench: setup ## Micro benchmarks and the end-to-end benchmark
	$(BIN)/pytest benchmarks --benchmark-only

nightly: setup ## The benchmark set, its history entry, the regression check and the trend page (runs/nightly)
	$(BIN)/sotw nightly $(NIGHTLY_ARGS)

$(QUIX_VENV)/.installed:
	$(PYTHON) -m venv $(QUIX_VENV)
	$(QUIX_VENV)/bin/python -m pip install --quiet 'quixstreams==3.28.*'
	@touch $@

quixstreams-venv: $(QUIX_VENV)/.installed ## A virtualenv of its own for the quixstreams example (build/quixstreams-venv)

STREAMS_JAR := examples/kafka-streams/target/sotw-streams-job.jar

$(STREAMS_JAR): examples/kafka-streams/pom.xml $(shell find examples/kafka-streams/src -type f)
	cd examples/kafka-streams && (mvn -o -q -B -Dstyle.color=never package || mvn -q -B -Dstyle.color=never package)

kafka-streams-job: $(STREAMS_JAR) ## The Kafka Streams example's jar, built by Maven (offline when ~/.m2 has all it needs)

clean: ## Remove the virtualenv and run outputs
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache

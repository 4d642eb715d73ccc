"""Shared fixtures: one real broker and one real SparkSession per test session.

The broker is a local Apache Kafka node. Set ``SOTW_TEST_BOOTSTRAP=HOST:PORT`` to run the suite against an
existing Kafka cluster instead.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# Importing Locust patches the whole process for gevent (threads, sockets), which the test process's Kafka
# clients and Spark must not be: tests import Locust's parts unpatched and run Locust itself in subprocesses
# (tests/loadtest/locust_process.py gives them the patch back).
os.environ.setdefault("LOCUST_SKIP_MONKEY_PATCH", "1")

from simulator import RunSummary, Simulator, SimulatorConfig  # noqa: E402
from sotw.broker import local_broker  # noqa: E402
from sotw.kafka import KafkaConfig  # noqa: E402


@pytest.fixture(scope="session")
def bootstrap() -> Iterator[str]:
    """The bootstrap address of the session's broker."""
    external = os.environ.get("SOTW_TEST_BOOTSTRAP")
    if external:
        yield external
        return
    with local_broker() as broker:
        yield broker.bootstrap


@pytest.fixture(scope="session")
def kafka(bootstrap: str) -> KafkaConfig:
    """A ``KafkaConfig`` for the session's broker."""
    return KafkaConfig(bootstrap)


_counter = itertools.count()


@pytest.fixture
def unique_prefix() -> Callable[[], str]:
    """A factory of topic prefixes no other test uses, so tests share one broker without seeing each other."""
    run = uuid.uuid4().hex[:6]

    def make() -> str:
        return f"t{run}{next(_counter)}-sensor-"

    return make


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The session's SparkSession (local[2], 2 shuffle partitions, UI off), Kafka source registered."""
    from pipeline.spark import SparkConfig, build_session

    session = build_session(SparkConfig(master="local[2]", shuffle_partitions=2), app_name="sotw-tests")
    yield session
    session.stop()


@pytest.fixture
def simulate(
    kafka: KafkaConfig, tmp_path: Path, unique_prefix
) -> Callable[..., tuple[RunSummary, SimulatorConfig]]:
    """Run a small simulation into a fresh run directory and topic prefix; returns (summary, config)."""
    counter = iter(range(1000))

    def run(name: str | None = None, clock: Callable[[], float] | None = None, **changes: Any):
        base = {
            "sensors": 4,
            "rows": 20,
            "partitions": 2,
            "rate": 3000.0,
            "duration_s": 1.0,
            "session_interval_s": 0.4,
            "topic_prefix": unique_prefix(),
            "seed": 7,
        }
        base.update(changes)
        config = SimulatorConfig(**base)
        run_dir = tmp_path / f"p{next(counter)}" / (name or "run")
        return Simulator(config, kafka, run_dir, clock=clock).run(), config

    return run


@pytest.fixture
def artifact_dir(request: pytest.FixtureRequest) -> Path:
    """``build/test-artifacts/<test name>/``: files a test keeps for people to look at (screenshots), kept after the run."""
    path = Path(__file__).resolve().parent.parent / "build" / "test-artifacts" / request.node.name
    path.mkdir(parents=True, exist_ok=True)
    return path

"""Shared fixtures: one real broker and one real SparkSession per test session.

The broker is a local Apache Kafka node. Set ``SOTW_TEST_BOOTSTRAP=HOST:PORT`` to run the suite against an
existing Kafka cluster instead. Tests of a secured cluster share one ``sasl_ssl`` node (``secured_kafka``),
started only if one of them runs.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# Importing Locust patches the whole process for gevent (threads, sockets), which the test process's Kafka
# clients and Spark must not be: tests import Locust's parts unpatched and run Locust itself in subprocesses
# (tests/loadtest/locust_process.py gives them the patch back).
os.environ.setdefault("LOCUST_SKIP_MONKEY_PATCH", "1")

from simulator import RunSummary, Simulator, SimulatorConfig  # noqa: E402
from sotw.broker import KafkaBroker, local_broker  # noqa: E402
from sotw.broker.users import RunUser  # noqa: E402
from sotw.kafka import KafkaConfig  # noqa: E402

#: Fixtures that start the session's real parts: a test that uses one (directly or through another) needs them.
SYSTEM_FIXTURES = frozenset({"bootstrap", "spark", "secured_kafka"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``system`` every test that needs a broker or Spark: ``make test-fast`` runs the others alone.

    A test that starts them on its own, not through the session's fixtures (a broker of its own, a ``sotw``
    subprocess, a browser), is marked in its module with ``pytestmark = pytest.mark.system``.
    """
    for item in items:
        if SYSTEM_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.system)


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


@dataclass(frozen=True)
class SecuredKafka:
    """The session's secured (``sasl_ssl``) one-node broker, as its tests see it.

    Attributes
    ----------
    broker
        The broker itself (for its log and secrets; tests must not stop or pause it: others share it).
    bootstrap
        ``HOST:PORT`` clients connect to.
    admin_config
        The admin's librdkafka settings file (mode 0600): a super user.
    data_dir
        The broker's data directory (``tls/ca.pem``, ``users/``, ``node-1/``).
    kafka
        A ``KafkaConfig`` with the admin's settings.
    """

    broker: KafkaBroker
    bootstrap: str
    admin_config: Path
    data_dir: Path
    kafka: KafkaConfig

    def user(self, topic_prefix: str, name: str | None = None) -> RunUser:
        """A new user holding only a run's ACLs on ``topic_prefix`` (its settings file: ``.settings_path``)."""
        return self.broker.add_user(name or f"u{uuid.uuid4().hex[:8]}", topic_prefix)


@pytest.fixture(scope="session")
def secured_kafka() -> Iterator[SecuredKafka]:
    """One one-node ``sasl_ssl`` broker for the session, started the first time a test asks for it."""
    # A secured start takes 12-40 s on the 2-core machine, depending on what else runs: room for a busy one.
    with KafkaBroker(security="sasl_ssl", start_timeout=120) as broker:
        assert broker.admin_config_path is not None and broker.data_dir is not None
        yield SecuredKafka(
            broker, broker.bootstrap, broker.admin_config_path, broker.data_dir, broker.kafka_config()
        )


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

"""The topics a run owns: their prefix, replication, listing and deletion, and ``sotw topics``.

Every run writes to topics under a prefix of its own (``run_prefix``: the profile's prefix and a random tag),
so runs sharing a cluster never read each other's topics and a run's topics can be listed and deleted by
prefix. A job that writes its table to a topic writes to ``output_topic(prefix)`` unless told another: beside the
run's topics rather than among them, so the run's pattern never feeds the job its own output. ``delete_topics``
deletes it with the run's, and the internal topics of the run's Kafka Streams application (``streams_apps``).
``TopicSettings`` carries the replication factor and ``min.insync.replicas`` a run creates its
topics with; ``check_replication`` refuses a factor the cluster's brokers cannot hold before anything starts.
"""

from __future__ import annotations

import argparse
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from sotw.errors import BrokerError
from sotw.kafka import KafkaConfig


def run_prefix(base: str) -> str:
    """A new run's topic prefix: ``base``, six random hex digits and ``-`` (``sotw-sensor-1a2b3c-``)."""
    return f"{base}{secrets.token_hex(3)}-"


def output_topic(prefix: str) -> str:
    """The topic a run's job writes its table to when not told another: ``sotw-sensor-1a2b3c.tables``.

    The prefix without its last separator: the run owns the name, but the run's pattern (``^prefix.*``),
    which the job subscribes to and the lag is read on, does not match it.

    Raises
    ------
    BrokerError
        For a prefix that does not end with ``-``, ``.`` or ``_``: every name derived from it would match it.
    """
    base = prefix.rstrip("-._")
    if not base or base == prefix:
        raise BrokerError(
            f"no output topic can be named after the prefix {prefix!r}, which does not end with '-', '.' or '_': "
            "name one with --output-topic"
        )
    return f"{base}.tables"


def _streams_internal(app: str) -> re.Pattern[str]:
    """The topics a stream-processing library makes for application ``app`` (the job's consumer group).

    Kafka Streams' ``<app>-<name>-changelog`` or ``-repartition``; quixstreams' ``changelog__<app>--<topic>--<store>``
    or ``repartition__<app>--...``.
    """
    name = re.escape(app)
    return re.compile(rf"{name}-.+-(changelog|repartition)|(changelog|repartition)__{name}--.+")


@dataclass(frozen=True)
class TopicSettings:
    """How a run creates its topics (None leaves a setting to the cluster's defaults).

    Parameters
    ----------
    replication_factor
        Replicas of each partition (``--replication-factor``).
    min_insync_replicas
        The topics' ``min.insync.replicas`` (``--min-insync-replicas``): at most the replication factor.
    """

    replication_factor: int | None = None
    min_insync_replicas: int | None = None

    def __post_init__(self) -> None:
        for name in ("replication_factor", "min_insync_replicas"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be 1 or more, got {value}")
        rf, isr = self.replication_factor, self.min_insync_replicas
        if rf is not None and isr is not None and isr > rf:
            raise ValueError(
                f"min_insync_replicas ({isr}) must not exceed replication_factor ({rf}): "
                "no write could ever be acknowledged"
            )

    @property
    def config(self) -> dict[str, str]:
        """The topic-level settings to create topics with."""
        isr = self.min_insync_replicas
        return {} if isr is None else {"min.insync.replicas": str(isr)}


def broker_count(kafka: KafkaConfig, timeout: float = 10.0) -> int:
    """How many brokers the cluster's metadata lists.

    Raises
    ------
    BrokerError
        If the cluster does not answer within ``timeout``.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        return len(AdminClient(kafka.client()).list_topics(timeout=timeout).brokers)
    except KafkaException as exc:
        raise BrokerError(f"could not list the brokers of {kafka.bootstrap}: {exc.args[0]}") from None


def check_replication(settings: TopicSettings, brokers: int, where: str) -> None:
    """Refuse a replication factor (or ``min.insync.replicas``) more than the cluster's ``brokers`` can hold.

    ``where`` names the cluster in the message (``the cluster at HOST:PORT``).

    Raises
    ------
    BrokerError
        Naming the flag, its value and the broker count.
    """
    for flag, value in (
        ("--replication-factor", settings.replication_factor),
        ("--min-insync-replicas", settings.min_insync_replicas),
    ):
        if value is not None and value > brokers:
            raise BrokerError(
                f"{flag} {value} needs {value} brokers, but {where} has {brokers}: give at most {brokers}"
            )


@dataclass(frozen=True)
class TopicInfo:
    """One topic as the cluster's metadata shows it: its name, partitions and replicas of its first partition."""

    name: str
    partitions: int
    replicas: int


def _check_prefix(prefix: str) -> None:
    if not prefix or prefix.startswith("_"):
        raise BrokerError(
            f"a topic prefix is needed, and not one of Kafka's internal topics ('_'...), got {prefix!r}"
        )


def list_topics(kafka: KafkaConfig, prefix: str, timeout: float = 10.0) -> list[TopicInfo]:
    """The topics whose names start with ``prefix``, sorted by name.

    Raises
    ------
    BrokerError
        For an empty or internal prefix, or a cluster that does not answer.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    _check_prefix(prefix)
    try:
        metadata = AdminClient(kafka.client()).list_topics(timeout=timeout)
    except KafkaException as exc:
        raise BrokerError(f"could not list the topics of {kafka.bootstrap}: {exc.args[0]}") from None
    found = []
    for name, topic in metadata.topics.items():
        if name.startswith(prefix) and topic.error is None:
            first = topic.partitions.get(0)
            found.append(TopicInfo(name, len(topic.partitions), len(first.replicas) if first else 0))
    return sorted(found, key=lambda t: t.name)


def delete_topics(
    kafka: KafkaConfig, prefix: str, timeout: float = 30.0, streams_apps: Sequence[str] = ()
) -> list[str]:
    """Delete a run's topics; return their names.

    They are every topic whose name starts with ``prefix``, the run's ``output_topic`` if there is one, and
    the internal topics of each stream-processing application in ``streams_apps`` (a Kafka Streams job's
    ``application.id`` or a quixstreams job's consumer group: its lag group): its state stores' changelogs,
    which a later run of the same application would restore.

    Raises
    ------
    BrokerError
        For an empty or internal prefix, or a topic the cluster refuses to delete (no DELETE ACL).
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    _check_prefix(prefix)
    internal = [_streams_internal(app) for app in streams_apps]
    try:
        extra = {output_topic(prefix)}
    except BrokerError:
        extra = set()
    try:
        metadata = AdminClient(kafka.client()).list_topics(timeout=timeout)
    except KafkaException as exc:
        raise BrokerError(f"could not list the topics of {kafka.bootstrap}: {exc.args[0]}") from None
    names = sorted(
        name
        for name in metadata.topics
        if name.startswith(prefix) or name in extra or any(p.fullmatch(name) for p in internal)
    )
    if not names:
        return []
    admin = AdminClient(kafka.client())
    for name, future in admin.delete_topics(names, operation_timeout=timeout).items():
        try:
            future.result(timeout)
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise BrokerError(f"could not delete topic {name}: {err.str()}") from None
    return names


def main(argv: Sequence[str]) -> int:
    """``sotw topics list --prefix P`` and ``sotw topics delete --prefix P``: a run's topics, by prefix."""
    from sotw.cliargs import add_kafka_args, add_logging_args, kafka_config, setup_logging

    parser = argparse.ArgumentParser(
        prog="sotw topics",
        description="List or delete the topics whose names start with a prefix (a run's topics: its "
        "report names its prefix).",
    )
    parser.add_argument("action", choices=("list", "delete"), help="list them, or delete them")
    parser.add_argument("--prefix", required=True, help="the topics' prefix, e.g. sotw-sensor-1a2b3c-")
    add_kafka_args(parser)
    add_logging_args(parser)
    args = parser.parse_args(list(argv))
    setup_logging(args)
    if not args.bootstrap:
        raise BrokerError(
            "sotw topics needs the cluster: pass --bootstrap HOST:PORT (and --kafka-config FILE)"
        )
    kafka = kafka_config(args)
    if args.action == "list":
        topics = list_topics(kafka, args.prefix)
        for t in topics:
            print(f"{t.name}\t{t.partitions} partitions\treplication {t.replicas}")
        print(f"{len(topics)} topics start with {args.prefix!r}")
        return 0
    deleted = delete_topics(kafka, args.prefix)
    for name in deleted:
        print(f"deleted {name}")
    print(f"{len(deleted)} topics deleted")
    return 0

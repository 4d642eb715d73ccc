"""Command-line options every sotw command shares: where Kafka is and how to talk to it.

This is the edge: it reads files named on the command line and turns them into a ``KafkaConfig``; nothing
further in reads flags, files or the environment.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from sotw.errors import SotwError
from sotw.kafka import KafkaConfig, parse_settings, read_settings, refuse_secrets


class KafkaArgsError(SotwError, ValueError):
    """A ``--kafka-config`` file or ``-X`` setting that cannot be taken: a ``SotwError`` (one line, exit 1)."""


def add_kafka_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--bootstrap``, ``--kafka-config FILE`` and ``-X key=value`` to ``parser``."""
    group = parser.add_argument_group("Kafka")
    group.add_argument(
        "--bootstrap",
        metavar="HOST:PORT",
        help="a running Kafka cluster (default: start a local Apache Kafka broker for this command)",
    )
    group.add_argument(
        "--kafka-config",
        metavar="FILE",
        type=Path,
        help="librdkafka settings file, one key=value per line (SASL, TLS, tuning); the only place for "
        "secrets (passwords, keys): keep it readable by you alone (chmod 600)",
    )
    group.add_argument(
        "-X",
        dest="kafka_settings",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="one librdkafka setting; repeatable and applied after --kafka-config; secrets are refused here "
        "(ps shows every command line): put them in --kafka-config",
    )


def kafka_settings(args: argparse.Namespace) -> dict[str, str]:
    """The librdkafka settings from ``--kafka-config`` then ``-X``.

    Raises
    ------
    ValueError
        If the file cannot be read or has a line that is not ``key=value``, or a ``-X`` gives a secret
        (``sotw.kafka.is_secret``): the message names the setting and ``--kafka-config FILE``.
    """
    settings: dict[str, str] = {}
    try:
        if args.kafka_config is not None:
            settings.update(read_settings(args.kafka_config))
        given = parse_settings(args.kafka_settings)
        refuse_secrets(given, "-X")
    except ValueError as exc:
        raise KafkaArgsError(str(exc)) from None
    settings.update(given)
    return settings


def kafka_config(args: argparse.Namespace, bootstrap: str | None = None) -> KafkaConfig:
    """Build the ``KafkaConfig`` for ``--bootstrap`` (or the given local broker's address)."""
    address = bootstrap or args.bootstrap
    if not address:
        raise ValueError("no Kafka cluster: pass --bootstrap HOST:PORT")
    return KafkaConfig(address, kafka_settings(args))


def cluster_config(args: argparse.Namespace) -> KafkaConfig | None:
    """``--bootstrap``'s ``KafkaConfig``, or None when the command starts a local broker.

    The settings are read and checked either way, so a secret given with ``-X`` is refused even when no
    ``--bootstrap`` would use it.
    """
    settings = kafka_settings(args)
    return KafkaConfig(args.bootstrap, settings) if args.bootstrap else None


def add_logging_args(parser: argparse.ArgumentParser) -> None:
    """Add ``-v/--verbose`` and ``-q/--quiet``."""
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")


def setup_logging(args: argparse.Namespace) -> None:
    """Configure the root logger from ``-v``/``-q``."""
    level = logging.WARNING if getattr(args, "quiet", False) else logging.INFO
    if getattr(args, "verbose", 0):
        level = logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s", force=True)
    # librdkafka and py4j are chatty at INFO.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # A failed foreachBatch call is logged by py4j with the whole JVM stack, then reported again by the
    # pipeline in one line (pipeline.query.explain_failure): keep the stack for -v.
    if not getattr(args, "verbose", 0):
        logging.getLogger("py4j.clientserver").setLevel(logging.CRITICAL)

"""Flags for the cluster a run uses and the topics it owns: ``--security``, ``--replication-factor``, ...

``sotw run``, ``bench`` and ``drill`` add them to their parsers, ``sotw locust`` adds ``--security``; they are turned
into a ``RunRequest``'s ``security``, ``topics`` and ``cleanup`` here, once.
"""

from __future__ import annotations

import argparse

from loadtest.errors import HarnessError
from sotw.broker import SECURITY_MODES
from sotw.topics import TopicSettings


def add_security_arg(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--security MODE``: the security of the local broker a command starts when not given ``--bootstrap``."""
    p.add_argument(
        "--security",
        choices=SECURITY_MODES,
        default=None,
        help="security of the local broker started when --bootstrap is not given (default plaintext); its "
        "admin's settings reach every client as if given with --kafka-config (docs/broker.md)",
    )


def add_netns_arg(p: argparse.ArgumentParser) -> None:
    """``--netns``: the local broker's nodes and the pipeline each in a network namespace (network incidents)."""
    p.add_argument(
        "--netns",
        action="store_true",
        help="put each node of the local broker and the pipeline in a network namespace of its own, for the "
        "network incidents (partition, flaky_link, link_cap); needs root and nftables (docs/gamedays.md)",
    )


def add_topic_args(p: argparse.ArgumentParser) -> None:
    """``--replication-factor``, ``--min-insync-replicas`` and ``--cleanup``: the topics a run owns."""
    g = p.add_argument_group("the run's topics (docs/own-cluster.md)")
    g.add_argument(
        "--replication-factor",
        type=int,
        default=None,
        metavar="N",
        help="replicas of each partition of the run's topics (default: the cluster's); at most its brokers",
    )
    g.add_argument(
        "--min-insync-replicas",
        type=int,
        default=None,
        metavar="N",
        help="the run's topics' min.insync.replicas (default: the cluster's)",
    )
    g.add_argument("--cleanup", action="store_true", help="delete the run's topics once it has been verified")


def security_from_args(args: argparse.Namespace, default: str = "plaintext") -> str:
    """The local broker's security mode; refused with ``--bootstrap``, whose cluster's security is its own.

    Raises
    ------
    HarnessError
        For ``--security`` together with ``--bootstrap``.
    """
    if args.security is not None and getattr(args, "bootstrap", None):
        raise HarnessError(
            "--security is for the local broker sotw starts; a cluster given with --bootstrap is reached "
            "with its own settings: --kafka-config FILE"
        )
    return str(args.security or default)


def topics_from_args(args: argparse.Namespace) -> TopicSettings:
    """The ``TopicSettings`` of ``--replication-factor`` and ``--min-insync-replicas``.

    Raises
    ------
    HarnessError
        For a value below 1, or ``min.insync.replicas`` above the replication factor.
    """
    try:
        return TopicSettings(args.replication_factor, args.min_insync_replicas)
    except ValueError as exc:
        raise HarnessError(f"--replication-factor/--min-insync-replicas: {exc}") from None

"""``sotw broker``: run Apache Kafka on this machine in the foreground and print its bootstrap address.

``sotw broker --security MODE`` secures it (TLS, SCRAM-SHA-512 logins, ACLs); ``sotw broker add-user`` adds a
user holding only a run's ACLs to such a broker while it runs.
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Sequence
from pathlib import Path

from sotw.broker import KafkaBroker
from sotw.broker.security import MODES, SECURITY_MODES, BrokerSecrets
from sotw.broker.storage import STATE
from sotw.broker.users import add_run_user
from sotw.cliargs import add_logging_args, setup_logging
from sotw.errors import BrokerError
from sotw.kafka import KafkaConfig, parse_settings, read_settings


def main(argv: Sequence[str]) -> int:
    """Start Apache Kafka on loopback, print ``--bootstrap HOST:PORT``, and stop cleanly on Ctrl-C or SIGTERM.

    Kafka keeps its data on disk, in a temporary directory removed when it stops unless ``--data-dir`` names
    one to keep: started again on it, the broker comes back with its topics, records and committed offsets.
    ``--nodes 3`` starts a three-node cluster (replication factor 3, ``min.insync.replicas=2``).
    ``--security sasl_ssl`` (or ``ssl``, ``sasl_plaintext``) secures it and prints the admin's settings file
    as ``--kafka-config FILE``; ``sotw broker add-user NAME --topic-prefix P ...`` adds a user for runs.
    ``--netns`` puts each node in a network namespace of its own (hosts n1, n2, ... on a bridge), reached
    from here on its own address; it needs root, iproute2 and nftables.
    """
    if list(argv[:1]) == ["add-user"]:
        return add_user_main(argv[1:])
    parser = argparse.ArgumentParser(prog="sotw broker", description=main.__doc__)
    parser.add_argument("--nodes", type=int, default=1, help="nodes, each broker and controller (default 1)")
    parser.add_argument(
        "--data-dir", type=Path, help="keep the data here, across restarts (default: a temporary directory)"
    )
    parser.add_argument("--port", type=int, default=0, help="client port of the first node (default: free)")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--netns",
        action="store_true",
        help="each node in a network namespace of its own, on its own address (for partitions between "
        "nodes); needs root and nftables; --host is then unused and --port (default 9092) is every node's",
    )
    parser.add_argument(
        "--security",
        choices=SECURITY_MODES,
        default="plaintext",
        help="plaintext (default), ssl (client certificates), sasl_plaintext or sasl_ssl (SCRAM-SHA-512 "
        "logins); secured modes turn ACLs on and write an admin settings file (docs/broker.md)",
    )
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds to wait for every node to answer (default 60)"
    )
    parser.add_argument(
        "--heap-mb", type=int, default=None, help="heap per node in MiB (default 512; 320 each for 3 nodes)"
    )
    parser.add_argument(
        "--override",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="a server.properties setting for every node (retention, ...); repeatable",
    )
    parser.add_argument(
        "--durable",
        action="store_true",
        help="accepted for old scripts: Kafka always keeps its data on disk, so restarts keep it",
    )
    add_logging_args(parser)
    args = parser.parse_args(argv)
    setup_logging(args)
    try:
        overrides = parse_settings(args.override)
    except ValueError as exc:
        raise BrokerError(f"--override: {exc}") from None
    broker = KafkaBroker(
        nodes=args.nodes,
        port=args.port,
        host=args.host,
        data_dir=args.data_dir,
        heap_mb=args.heap_mb,
        start_timeout=args.timeout,
        overrides=overrides,
        security=args.security,
        netns=args.netns,
    )
    stop = threading.Event()

    def on_sigterm(*_: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_sigterm)
    with broker:
        # A network's own SIGTERM handler (installed as it starts) would remove it under running nodes: the
        # broker stops them first, then removes the network, on leaving this block.
        signal.signal(signal.SIGTERM, on_sigterm)
        config = f" --kafka-config {broker.admin_config_path}" if broker.admin_config_path else ""
        print(f"broker ready: --bootstrap {broker.bootstrap}{config}", flush=True)
        if broker.secrets is not None:
            print(
                f"security: {args.security}, ACLs on; the admin's settings (a super user, mode 0600) are in "
                f"{broker.admin_config_path}; clients trust {broker.secrets.ca_path}",
                flush=True,
            )
            print(
                "a user for runs: sotw broker add-user NAME --topic-prefix PREFIX "
                f"--bootstrap {broker.bootstrap}{config}",
                flush=True,
            )
        if broker.network is not None:
            hosts = ", ".join(f"{broker.host_name(n)} {a}" for n, a in broker.addresses.items())
            print(
                f"network: {broker.network.tag} (hosts {hosts}; the gateway {broker.network.gateway})",
                flush=True,
            )
        kept = "temporary, removed when it stops" if args.data_dir is None else "kept"
        print(f"storage: {broker.data_dir} ({kept})", flush=True)
        print("Ctrl-C stops it.", flush=True)
        try:
            while not stop.wait(0.5):
                broker.check_alive()
        except KeyboardInterrupt:
            pass
    print("broker stopped", flush=True)
    return 0


def add_user_main(argv: Sequence[str]) -> int:
    """Add a user holding only a run's ACLs to a running secured ``sotw broker``; print its settings file.

    Give the ``--bootstrap`` and ``--kafka-config`` (the admin's) that ``sotw broker --security ...`` printed.
    The user's password (or, with ``ssl``, its certificate and key) goes only to its settings file, mode 0600,
    under the broker's data directory: pass that file as ``--kafka-config`` to a run.
    """
    parser = argparse.ArgumentParser(prog="sotw broker add-user", description=add_user_main.__doc__)
    parser.add_argument("name", help="the user name (letters, digits, '.', '_', '-')")
    parser.add_argument(
        "--topic-prefix", required=True, help="the user may use topics (and groups) starting with this"
    )
    parser.add_argument(
        "--group-prefix", help="consumer groups it may use start with this (default: the same)"
    )
    parser.add_argument("--bootstrap", required=True, help="HOST:PORT[,...] the broker printed")
    parser.add_argument(
        "--kafka-config", type=Path, required=True, help="the admin's settings file the broker printed"
    )
    parser.add_argument("--timeout", type=float, default=15.0, help="seconds for each step (default 15)")
    add_logging_args(parser)
    args = parser.parse_args(argv)
    setup_logging(args)
    try:
        settings = read_settings(args.kafka_config)
    except ValueError as exc:
        raise BrokerError(str(exc)) from None
    root = args.kafka_config.resolve().parent
    protocol = settings.get("security.protocol", "PLAINTEXT").upper()
    mode = next((m for m in MODES.values() if m.protocol == protocol), None)
    if mode is None or not mode.secured or not (root / STATE).exists():
        raise BrokerError(
            f"{args.kafka_config} is not the admin settings file of a secured `sotw broker` "
            "(admin.properties in its data directory)"
        )
    secrets = BrokerSecrets(mode, root, args.bootstrap.split(",")[0].rpartition(":")[0])
    secrets.load()
    user = add_run_user(
        KafkaConfig(args.bootstrap, settings),
        secrets,
        args.name,
        args.topic_prefix,
        args.group_prefix,
        args.timeout,
    )
    print(
        f"user {user.name} ({user.principal}) may use topics and groups starting with {user.topic_prefix!r}: "
        f"--bootstrap {args.bootstrap} --kafka-config {user.settings_path}",
        flush=True,
    )
    return 0

"""``sotw broker``: run a local broker in the foreground and print its bootstrap address."""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Sequence
from pathlib import Path

from sotw.broker import BROKERS, KafkaBroker, LocalBroker, TansuBroker
from sotw.cliargs import add_logging_args, setup_logging
from sotw.errors import BrokerError
from sotw.kafka import parse_settings


def main(argv: Sequence[str]) -> int:
    """Start Apache Kafka (or Tansu) on loopback, print ``HOST:PORT``, and stop cleanly on Ctrl-C or SIGTERM.

    Kafka keeps its data on disk, in a temporary directory removed when it stops unless ``--data-dir`` names one
    to keep: started again on it, the broker comes back with its topics, records and committed offsets.
    ``--nodes 3`` starts a three-node cluster (replication factor 3, ``min.insync.replicas=2``).
    """
    parser = argparse.ArgumentParser(prog="sotw broker", description=main.__doc__)
    parser.add_argument(
        "--broker",
        choices=BROKERS,
        default="kafka",
        help="Apache Kafka (default) or the embedded Tansu broker",
    )
    parser.add_argument(
        "--nodes", type=int, default=1, help="Kafka nodes, each broker and controller (default 1)"
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="keep Kafka's data here, across restarts (default: a temporary directory)",
    )
    parser.add_argument(
        "--port", type=int, default=0, help="client port (of the first node; default: a free one)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds to wait for the broker to answer (Kafka 60, Tansu 20)",
    )
    parser.add_argument(
        "--heap-mb", type=int, default=None, help="Kafka heap per node in MiB (default 512, 320 for 3)"
    )
    parser.add_argument(
        "--override",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="a Kafka server.properties setting for every node (retention, ...); repeatable",
    )
    parser.add_argument(
        "--durable",
        action="store_true",
        help="Tansu only: keep records in a local S3 server (Kafka always keeps them on disk)",
    )
    add_logging_args(parser)
    args = parser.parse_args(argv)
    setup_logging(args)
    broker: LocalBroker
    if args.broker == "kafka":
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
            overrides=overrides,
            **({"start_timeout": args.timeout} if args.timeout else {}),
        )
    else:
        if args.nodes != 1 or args.data_dir is not None or args.override:
            raise BrokerError(
                "--nodes, --data-dir and --override are Apache Kafka's: drop them or --broker tansu"
            )
        broker = TansuBroker(
            port=args.port,
            host=args.host,
            durable=args.durable or args.broker == "tansu-durable",
            **({"start_timeout": args.timeout} if args.timeout else {}),
        )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with broker:
        print(f"broker ready: --bootstrap {broker.bootstrap}", flush=True)
        print(f"storage: {storage_text(broker)}", flush=True)
        print("Ctrl-C stops it.", flush=True)
        try:
            while not stop.wait(0.5):
                broker.check_alive()
        except KeyboardInterrupt:
            pass
    print("broker stopped", flush=True)
    return 0


def storage_text(broker: LocalBroker) -> str:
    """Where the broker keeps its data, for the ``storage:`` line."""
    if isinstance(broker, KafkaBroker):
        kept = "temporary, removed when it stops" if broker.config.data_dir is None else "kept"
        return f"{broker.data_dir} ({kept})"
    assert isinstance(broker, TansuBroker)
    return broker.storage_url + (f" on {broker.s3_endpoint}" if broker.durable else "")

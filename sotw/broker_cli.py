"""``sotw broker``: run Apache Kafka on this machine in the foreground and print its bootstrap address."""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Sequence
from pathlib import Path

from sotw.broker import KafkaBroker
from sotw.cliargs import add_logging_args, setup_logging
from sotw.errors import BrokerError
from sotw.kafka import parse_settings


def main(argv: Sequence[str]) -> int:
    """Start Apache Kafka on loopback, print ``--bootstrap HOST:PORT``, and stop cleanly on Ctrl-C or SIGTERM.

    Kafka keeps its data on disk, in a temporary directory removed when it stops unless ``--data-dir`` names
    one to keep: started again on it, the broker comes back with its topics, records and committed offsets.
    ``--nodes 3`` starts a three-node cluster (replication factor 3, ``min.insync.replicas=2``).
    """
    parser = argparse.ArgumentParser(prog="sotw broker", description=main.__doc__)
    parser.add_argument("--nodes", type=int, default=1, help="nodes, each broker and controller (default 1)")
    parser.add_argument(
        "--data-dir", type=Path, help="keep the data here, across restarts (default: a temporary directory)"
    )
    parser.add_argument("--port", type=int, default=0, help="client port of the first node (default: free)")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to bind (default 127.0.0.1)")
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
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with broker:
        print(f"broker ready: --bootstrap {broker.bootstrap}", flush=True)
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

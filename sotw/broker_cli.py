"""``sotw broker``: run the embedded broker in the foreground and print its bootstrap address."""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Sequence

from sotw.broker import EmbeddedBroker
from sotw.cliargs import add_logging_args, setup_logging


def main(argv: Sequence[str]) -> int:
    """Start Tansu on loopback, print ``HOST:PORT``, and stop cleanly on Ctrl-C or SIGTERM.

    ``--durable`` puts its storage in a local S3 server, so the process can be restarted without losing data.
    """
    parser = argparse.ArgumentParser(prog="sotw broker", description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--timeout", type=float, default=20.0, help="seconds to wait for the broker to answer"
    )
    parser.add_argument(
        "--durable",
        action="store_true",
        help="keep records in a local S3 server (moto) so a restart of the broker process keeps them",
    )
    add_logging_args(parser)
    args = parser.parse_args(argv)
    setup_logging(args)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    broker = EmbeddedBroker(port=args.port, host=args.host, start_timeout=args.timeout, durable=args.durable)
    with broker:
        print(f"broker ready: --bootstrap {broker.bootstrap}", flush=True)
        print(
            f"storage: {broker.storage_url}" + (f" on {broker.s3_endpoint}" if args.durable else ""),
            flush=True,
        )
        print("Ctrl-C stops it.", flush=True)
        try:
            while not stop.wait(0.5):
                broker.check_alive()
        except KeyboardInterrupt:
            pass
    print("broker stopped", flush=True)
    return 0

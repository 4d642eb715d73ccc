"""The local Kafka broker, one node and three: start-up, memory, a bulk load written and read back, a crash.

Run with::

    .venv/bin/python benchmarks/broker_local.py --brokers kafka,kafka-3 --messages 200000 --repeats 2

For each repeat, and each broker in turn (``kafka``: one Apache Kafka node; ``kafka-3``: three), each started
afresh, it:

* times ``start()`` until every node answers, and reads the processes' resident memory then;
* produces ``--messages`` records of ``--value-bytes`` bytes round-robin over ``--partitions`` partitions of
  one topic with the simulator's producer settings (``DEFAULT_PRODUCER``: idempotent, acks=all, 1 MB batches),
  timed from the first ``produce`` to the end of ``flush``;
* reads them all back with one assign-only consumer from offset 0, timed to the last record, and reads the
  resident memory again;
* kills the broker (SIGKILL, every node) and starts it again on its data, timing how long until every node
  answers (``Outage.duration_s``) and until a new consumer gets the first record of the topic.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka import Producer, TopicPartition

from simulator.config import DEFAULT_PRODUCER
from sotw.broker import BROKERS, LocalBroker, local_broker
from sotw.kafka import EndOffsets, KafkaConfig, ensure_topics

TOPIC = "bench-broker"
KINDS = BROKERS


def produce(kafka: KafkaConfig, messages: int, partitions: int, value: bytes) -> float:
    failed: list[object] = []
    producer = Producer(kafka.client(**DEFAULT_PRODUCER))

    def done(err: object, _msg: object) -> None:
        if err is not None:
            failed.append(err)

    t0 = time.perf_counter()
    for i in range(messages):
        while True:
            try:
                producer.produce(TOPIC, value=value, partition=i % partitions, on_delivery=done)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    elapsed = time.perf_counter() - t0
    assert left == 0 and not failed, f"{left} unacknowledged, {len(failed)} failed: {failed[:3]}"
    return messages / elapsed


def read_back(kafka: KafkaConfig, messages: int, partitions: int) -> float:
    ends = EndOffsets(kafka)([(TOPIC, p) for p in range(partitions)])
    assert sum(end for _, end in ends.values()) == messages, ends
    consumer = kafka.consumer(**{"fetch.wait.max.ms": "100", "queued.min.messages": "200000"})
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(partitions)])
    n = 0
    t0 = time.perf_counter()
    try:
        while n < messages and time.perf_counter() - t0 < 300:
            n += sum(1 for m in consumer.consume(10_000, 0.5) if not m.error())
    finally:
        consumer.close()
    elapsed = time.perf_counter() - t0
    assert n == messages, f"read {n} of {messages}"
    return messages / elapsed


def first_record_s(kafka: KafkaConfig, since: float, timeout: float = 60.0) -> float:
    """Seconds from ``since`` (a ``perf_counter`` reading) until a new consumer gets a record of the topic."""
    consumer = kafka.consumer()
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    try:
        while time.perf_counter() - since < timeout:
            if any(not m.error() for m in consumer.consume(1, 0.05)):
                return time.perf_counter() - since
    finally:
        consumer.close()
    raise RuntimeError(f"no record within {timeout:g} s of the restart")


def rss_mb(broker: LocalBroker) -> dict[str, float]:
    return {name: psutil.Process(pid).memory_info().rss / 2**20 for name, pid in broker.pids.items()}


def one(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    value = b"x" * args.value_bytes
    broker = local_broker(kind)
    t0 = time.perf_counter()
    with broker:
        result: dict[str, Any] = {
            "broker": kind,
            "start_s": time.perf_counter() - t0,
            "rss_start_mb": rss_mb(broker),
        }
        kafka = KafkaConfig(broker.bootstrap)
        ensure_topics(kafka, {TOPIC: args.partitions})
        result["produce_msg_s"] = produce(kafka, args.messages, args.partitions, value)
        result["read_msg_s"] = read_back(kafka, args.messages, args.partitions)
        result["rss_mb"] = rss_mb(broker)
        t0 = time.perf_counter()
        outage = broker.restart(kill=True)
        result["restart_api_s"] = outage.duration_s
        result["restart_first_record_s"] = first_record_s(kafka, t0)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", default="kafka,kafka-3", help=f"comma-separated, of {', '.join(KINDS)}")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--value-bytes", type=int, default=200, help="bytes per record value (default 200)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.brokers.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        parser.error(f"unknown broker {unknown[0]!r} (choose from {', '.join(KINDS)})")
    runs: list[dict[str, Any]] = []
    for r in range(args.repeats):
        for kind in kinds:
            got = one(kind, args)
            runs.append(got)
            line = (
                f"run {r + 1} {kind:>13}: start {got['start_s']:.1f} s (RSS "
                + ", ".join(f"{k} {v:,.0f}" for k, v in got["rss_start_mb"].items())
                + f" MB); produce {got['produce_msg_s']:>9,.0f} msg/s, "
                + f"read {got['read_msg_s']:>9,.0f} msg/s, RSS "
                + ", ".join(f"{k} {v:,.0f}" for k, v in got["rss_mb"].items())
                + " MB"
            )
            line += (
                f"; kill -> API answers {got['restart_api_s']:.2f} s, "
                f"-> first record {got['restart_first_record_s']:.2f} s"
            )
            print(line, flush=True)
    best = {
        kind: {
            key: max(g[key] for g in runs if g["broker"] == kind) for key in ("produce_msg_s", "read_msg_s")
        }
        for kind in kinds
    }
    print(
        f"best of {args.repeats}: "
        + "; ".join(
            f"{k} produce {b['produce_msg_s']:,.0f} / read {b['read_msg_s']:,.0f} msg/s"
            for k, b in best.items()
        )
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        summary = {
            "messages": args.messages,
            "partitions": args.partitions,
            "value_bytes": args.value_bytes,
            "best": best,
            "runs": runs,
        }
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

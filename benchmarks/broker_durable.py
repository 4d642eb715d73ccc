"""The cost of a durable embedded broker: the same bulk load on ``memory://`` and on ``s3://`` (local moto).

Run with::

    .venv/bin/python benchmarks/broker_durable.py --messages 200000 --repeats 2

For each repeat, and each broker in turn (memory, then durable, each started afresh), it:

* produces ``--messages`` records of ``--value-bytes`` bytes round-robin over ``--partitions`` partitions
  of one topic with the simulator's producer settings (``DEFAULT_PRODUCER``: idempotent, acks=all,
  1 MB batches), timed from the first ``produce`` to the end of ``flush``;
* reads them all back with one assign-only consumer from offset 0, timed to the last record;
* on the durable broker only, kills the broker process (SIGKILL) and times how long until it answers the
  Kafka API again (``Outage.duration_s``) and until a new consumer gets the first record of the topic.

It prints msg/s for each, the durable/memory ratios, the restart times, and the processes' resident memory
after the load.
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
from sotw.broker import TansuBroker
from sotw.kafka import EndOffsets, KafkaConfig, ensure_topics

TOPIC = "bench-durable"


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


def rss_mb(broker: TansuBroker) -> dict[str, float]:
    return {name: psutil.Process(pid).memory_info().rss / 2**20 for name, pid in broker.pids.items()}


def one(durable: bool, args: argparse.Namespace) -> dict[str, Any]:
    value = b"x" * args.value_bytes
    with TansuBroker(durable=durable) as broker:
        kafka = KafkaConfig(broker.bootstrap)
        ensure_topics(kafka, {TOPIC: args.partitions})
        result: dict[str, Any] = {
            "broker": "durable" if durable else "memory",
            "produce_msg_s": produce(kafka, args.messages, args.partitions, value),
            "read_msg_s": read_back(kafka, args.messages, args.partitions),
            "rss_mb": rss_mb(broker),
        }
        if durable:
            t0 = time.perf_counter()
            outage = broker.restart(kill=True)
            result["restart_api_s"] = outage.duration_s
            result["restart_first_record_s"] = first_record_s(kafka, t0)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--value-bytes", type=int, default=200, help="bytes per record value (default 200)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    runs: list[dict[str, Any]] = []
    for r in range(args.repeats):
        for durable in (False, True):
            got = one(durable, args)
            runs.append(got)
            line = (
                f"run {r + 1} {got['broker']:>7}: produce {got['produce_msg_s']:>9,.0f} msg/s, "
                f"read {got['read_msg_s']:>9,.0f} msg/s, RSS "
                + ", ".join(f"{k} {v:,.0f} MB" for k, v in got["rss_mb"].items())
            )
            if durable:
                line += (
                    f"; kill -> API answers {got['restart_api_s']:.2f} s, "
                    f"-> first record {got['restart_first_record_s']:.2f} s"
                )
            print(line, flush=True)
    best = {
        kind: {
            key: max(g[key] for g in runs if g["broker"] == kind) for key in ("produce_msg_s", "read_msg_s")
        }
        for kind in ("memory", "durable")
    }
    summary = {
        "messages": args.messages,
        "partitions": args.partitions,
        "value_bytes": args.value_bytes,
        "best": best,
        "durable_over_memory": {
            key: best["durable"][key] / best["memory"][key] for key in ("produce_msg_s", "read_msg_s")
        },
        "restart_first_record_s": [g["restart_first_record_s"] for g in runs if g["broker"] == "durable"],
        "runs": runs,
    }
    ratio = summary["durable_over_memory"]
    print(
        f"best of {args.repeats}: produce memory {best['memory']['produce_msg_s']:,.0f} / durable "
        f"{best['durable']['produce_msg_s']:,.0f} msg/s (durable/memory {ratio['produce_msg_s']:.2f}); "
        f"read memory {best['memory']['read_msg_s']:,.0f} / durable {best['durable']['read_msg_s']:,.0f} "
        f"msg/s ({ratio['read_msg_s']:.2f})"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

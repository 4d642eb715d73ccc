"""Read throughput of the ``sotw-kafka`` source on a backlog, against a bare confluent-kafka consumer.

Run with::

    .venv/bin/python benchmarks/source_throughput.py --messages 300000 --topics 20

It starts a local Kafka broker (``--broker``; or takes ``--bootstrap``), fills ``--topics`` topics with small
JSON messages, then drains the whole backlog three ways and prints messages/s for each:

* ``bare``: one assign-only confluent-kafka consumer in this process touching key and value of each message
  (the ceiling for a Python consumer);
* ``reader``: the source's own ``read_ranges`` in this process, building Arrow batches (no Spark), one row
  per message and packed (``packRecords``), with CPU per message (``--reader-repeats`` runs of each);
* ``spark``: ``spark.readStream.format("sotw-kafka")`` with ``trigger(availableNow=True)`` into the ``noop``
  sink on local[2], timed from ``start()`` to termination (includes planning and task start-up), twice in
  one session: ``cold`` pays the JVM's and the Python workers' start-up, ``warm`` does not. The rate within
  the batch (Spark's ``addBatch`` time) is printed as well.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from confluent_kafka import Producer, TopicPartition

from pipeline.source import SourceOptions, read_ranges
from pipeline.source.offsets import OffsetRange
from sotw.broker import BROKERS, local_broker
from sotw.kafka import EndOffsets, KafkaConfig, ensure_topics


def fill(kafka: KafkaConfig, topics: list[str], messages: int) -> None:
    producer = Producer(
        kafka.client(**{"linger.ms": 20, "batch.size": 1_000_000, "queue.buffering.max.messages": 1_000_000})
    )
    for i in range(messages):
        value = json.dumps(
            {"sensor": f"{i % 97:04d}", "seq": i, "op": "upsert", "row": i % 200, "v": [i * 0.5]}
        )
        while True:
            try:
                producer.produce(topics[i % len(topics)], key=f"{i % 97:04d}".encode(), value=value.encode())
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush(120)


def bare(kafka: KafkaConfig, ends: dict[tuple[str, int], tuple[int, int]]) -> float:
    consumer = kafka.consumer(**{"fetch.wait.max.ms": "100", "queued.min.messages": "200000"})
    consumer.assign([TopicPartition(t, p, low) for (t, p), (low, _) in ends.items()])
    left = {tp: end for tp, (low, end) in ends.items() if end > low}
    n = 0
    t0 = time.perf_counter()
    while left:
        for msg in consumer.consume(10_000, timeout=0.5):
            if msg.error():
                continue
            msg.key()
            msg.value()
            n += 1
            tp = (msg.topic(), msg.partition())
            if msg.offset() + 1 >= left.get(tp, 1 << 62):
                del left[tp]
    elapsed = time.perf_counter() - t0
    consumer.close()
    return n / elapsed


def reader(
    kafka: KafkaConfig, pattern: str, ends: dict[tuple[str, int], tuple[int, int]], pack: bool = False
) -> dict[str, float]:
    """Drain with the source's ``read_ranges`` in this process; rate and CPU per message (``pack``: packed rows)."""
    import pyarrow.compute as pc

    opts = SourceOptions.from_options(
        {
            "kafka.bootstrap.servers": kafka.bootstrap,
            **{f"kafka.{key}": value for key, value in kafka.settings.items()},
            "subscribePattern": pattern,
            "packRecords": str(pack).lower(),
        }
    )
    ranges = [OffsetRange(t, p, low, end) for (t, p), (low, end) in ends.items()]
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    for batch in read_ranges(opts, ranges):
        n += pc.sum(pc.list_value_length(batch.column("offsets"))).as_py() if pack else batch.num_rows
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"msg_s": n / elapsed, "cpu_us_per_msg": cpu / n * 1e6}


def spark_rate(kafka: KafkaConfig, pattern: str, total: int, checkpoints: Path) -> list[dict[str, Any]]:
    """Drain the backlog twice in one session: the first run pays JVM and worker start-up, the second not."""
    from pipeline.spark import SparkConfig, build_session

    spark = build_session(SparkConfig(), app_name="source-bench")
    runs = []
    try:
        for run in ("cold", "warm"):
            df = (
                spark.readStream.format("sotw-kafka")
                .option("kafka.bootstrap.servers", kafka.bootstrap)
                .option("subscribePattern", pattern)
                .option("startingOffsets", "earliest")
                .load()
            )
            t0 = time.perf_counter()
            query = (
                df.writeStream.format("noop")
                .option("checkpointLocation", str(checkpoints / run))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            elapsed = time.perf_counter() - t0
            rows = sum(p["numInputRows"] for p in query.recentProgress)
            assert rows == total, f"spark read {rows} of {total}"
            add_batch_ms = sum(p["durationMs"].get("addBatch", 0) for p in query.recentProgress)
            runs.append(
                {
                    "run": run,
                    "msg_s": rows / elapsed,
                    "batches": len(query.recentProgress),
                    "add_batch_msg_s": rows / (add_batch_ms / 1000) if add_batch_ms else None,
                }
            )
    finally:
        spark.stop()
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--topics", type=int, default=20)
    parser.add_argument("--bootstrap", default=None)
    parser.add_argument("--broker", choices=BROKERS, default="kafka")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--reader-repeats", type=int, default=1, help="runs of each reader mode (default 1)")
    parser.add_argument("--no-spark", action="store_true", help="stop after the in-process readers")
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        bootstrap = args.bootstrap or stack.enter_context(local_broker(args.broker)).bootstrap
        kafka = KafkaConfig(bootstrap)
        prefix = f"bench{int(time.time())}-"
        topics = [f"{prefix}{i:02d}" for i in range(args.topics)]
        ensure_topics(kafka, dict.fromkeys(topics, 1))
        t0 = time.perf_counter()
        fill(kafka, topics, args.messages)
        print(
            f"produced {args.messages} messages to {args.topics} topics in {time.perf_counter() - t0:.1f} s"
        )
        ends = EndOffsets(kafka)([(t, 0) for t in topics])
        total = sum(end - low for low, end in ends.values())
        assert total == args.messages, (total, args.messages)
        pattern = f"{prefix}.*"
        results: dict[str, Any] = {"messages": total, "topics": args.topics}
        results["bare_msg_s"] = bare(kafka, ends)
        print(f"bare consumer: {results['bare_msg_s']:,.0f} msg/s")
        for r in range(max(1, args.reader_repeats)):
            for pack in (False, True):
                got = reader(kafka, pattern, ends, pack)
                results.setdefault("reader_packed" if pack else "reader", []).append(got)
                print(
                    f"source reader (Arrow, no Spark{', packed rows' if pack else ''}), run {r + 1}: "
                    f"{got['msg_s']:,.0f} msg/s, {got['cpu_us_per_msg']:.2f} CPU us/msg"
                )
        results["reader_msg_s"] = max(got["msg_s"] for got in results["reader"])
        ckpt = Path(stack.enter_context(__import__("tempfile").TemporaryDirectory()))
        results["spark"] = [] if args.no_spark else spark_rate(kafka, pattern, total, ckpt)
        for r in results["spark"]:
            print(
                f"spark availableNow -> noop, local[2], {r['run']}: {r['msg_s']:,.0f} msg/s start to end, "
                f"{r['add_batch_msg_s']:,.0f} msg/s within the batch ({r['batches']} batch(es))"
            )
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

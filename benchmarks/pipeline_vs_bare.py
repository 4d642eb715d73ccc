"""Pipeline drain rate versus a bare confluent-kafka consumer, on the same backlog on one broker in one run.

Usage::

    .venv/bin/python benchmarks/pipeline_vs_bare.py [--messages 600000] [--repeats 2] [--bootstrap HOST:PORT]
                                                   [--max-offsets N] [--floor] [--delta] [--spark-kafka]
                                                   [--json runs/bench-pipeline-vs-bare.json]

The backlog is written once by the real simulator (``rate=0``, faults off, 24 sensors x 200-row tables, three
partitions per topic by default, as a default simulator run writes them). Then, alternately (so a
neighbour's load hits both alike):

* **bare**: one assign-only confluent-kafka consumer over every topic that ``orjson``-decodes every value;
  the ceiling for a Python consumer. Timed from ``assign`` to the last message.
* **pipeline**: ``pipeline.query.run`` with ``trigger(availableNow=True)`` on a ``local[2]`` SparkSession from
  ``pipeline.spark.build_session`` (built once, before the first run, and not timed), with the stateful
  reconstruction and the exactly-once Parquet sink, into a fresh output directory. The rate is messages / wall
  time of ``run``; the rate without the first micro-batch (Spark's per-query start-up: planning, the Python
  workers' start, the first state store) comes from ``progress.jsonl`` and is printed beside it.

With ``--delta``, the pipeline also drains the backlog into the Delta output (``sotw pipeline --format delta``:
the same files, committed to the four tables' logs with the query's transaction id) in each round, right after
the Parquet output, so the two are measured on the same backlog under the same neighbours.

With ``--spark-kafka``, the pipeline also drains the backlog through Spark's own Kafka connector (``sotw pipeline
--source spark-kafka``: ``format("kafka")``, one row per message into the same stateful step and Parquet output) in
each round, right after sotw's source, so the two sources are measured on the same backlog under the same
neighbours.

With ``--floor``, another side runs in each round:

* **floor**: the same sotw-kafka source, the same grouping (session and placement slot) and the same
  ``applyInPandasWithState`` call, but a state function that only ``orjson``-decodes every value and keeps a
  count, into Spark's ``noop`` sink: what the architecture the issue prescribes (a Python data source, a
  Python stateful step, Arrow between them and the JVM) costs before any of the pipeline's own work
  (ordering, integrity rules, canonical rows, records, Parquet, the exactly-once commit).

Peak memory is the resident memory of the whole process tree (this driver process, the JVM and the Python
workers), sampled every 100 ms by a thread while each side runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import KafkaError, TopicPartition

from loadtest.correctness.delta import read_commits
from pipeline.config import PipelineConfig
from pipeline.placement import slot, state_partition
from pipeline.progress import input_messages
from pipeline.query import read_source, run
from pipeline.source.offsets import lag, offsets_from_json
from pipeline.spark import SparkConfig, build_session
from simulator import Simulator, SimulatorConfig
from sotw.broker import BROKERS, local_broker
from sotw.kafka import EndOffsets, KafkaConfig, read_settings
from sotw.procstats import cpu_by_kind, read_tree, rss_by_kind


class PeakRss:
    """Samples the resident memory of this process and all its descendants until stopped; keeps the peak."""

    def __init__(self, interval_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self.peak = 0
        self.peak_parts: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        parts = {"driver_python": 0, "jvm": 0, "python_workers": 0, "broker": 0}
        for kind, rss in rss_by_kind(read_tree(kinds=True)).items():
            parts["python_workers" if kind == "python_source_planner" else kind] += rss
        total = parts["driver_python"] + parts["jvm"] + parts["python_workers"]
        if total > self.peak:
            self.peak, self.peak_parts = total, parts

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def fill_backlog(kafka: KafkaConfig, prefix: str, args: argparse.Namespace) -> dict[tuple[str, int], int]:
    """Publish the backlog with the simulator, faults off; return the end offset of every partition."""
    run_dir = Path(tempfile.mkdtemp(prefix="sotw-bench-sim-"))
    cfg = SimulatorConfig(
        sensors=args.sensors,
        rows=args.rows,
        partitions=args.partitions,
        topic_prefix=prefix,
        rate=0,
        duration_s=None,
        max_messages=args.messages,
        session_interval_s=args.session_s,
        seed=1,
    )
    t0 = time.perf_counter()
    summary = Simulator(cfg, kafka, run_dir / "run").run()
    shutil.rmtree(run_dir, ignore_errors=True)
    topics = [f"{prefix}{k:04d}" for k in range(args.sensors)]
    tps = [(t, p) for t in topics for p in range(args.partitions)]
    ends = {tp: end for tp, (_, end) in EndOffsets(kafka)(tps).items()}
    print(
        f"backlog: {sum(ends.values()):,} messages ({summary.stats.sent:,} sent) in {len(tps)} partitions, "
        f"written in {time.perf_counter() - t0:.1f} s",
        flush=True,
    )
    return ends


def bare(kafka: KafkaConfig, ends: dict[tuple[str, int], int]) -> dict[str, Any]:
    """Read the whole backlog with one assign-only consumer, decoding every value; rate and CPU."""
    consumer = kafka.consumer(
        **{"fetch.wait.max.ms": "100", "queued.min.messages": "200000", "fetch.message.max.bytes": "4194304"}
    )
    total = sum(ends.values())
    loads = orjson.loads
    n = 0
    tree0 = read_tree(kinds=True)
    with PeakRss() as mem:
        t0 = time.perf_counter()
        c0 = time.process_time()
        consumer.assign([TopicPartition(t, p, 0) for (t, p) in ends])
        while n < total:
            for msg in consumer.consume(10_000, 1.0):
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise SystemExit(f"bare consumer: {msg.error()}")
                loads(msg.value())
                n += 1
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - c0
    broker = cpu_by_kind(tree0, read_tree(kinds=True)).get("broker", 0.0)
    consumer.close()
    return {
        "messages": n,
        "rate": n / elapsed,
        "elapsed_s": elapsed,
        "cpu_us_per_msg": cpu / n * 1e6,
        "broker_cpu_us_per_msg": broker / n * 1e6,
        "peak_rss_bytes": mem.peak,
    }


def state_partition_load(spark: Any, changes: Path, partitions: int) -> list[dict[str, int]]:
    """Sessions and changes per state partition, as Spark's shuffle placed them (not timed).

    The stateful stage lasts as long as its busiest task, so this shows how evenly the sessions fell. The
    partition is computed with the query's own placement (``pipeline.placement``): Spark's shuffle uses
    ``pmod(murmur3(key, slot), partitions)``, which is what SQL ``hash`` computes.
    """
    from pyspark.sql import functions as F

    key = F.col("session").cast("binary")
    rows = (
        spark.read.parquet(str(changes))
        .groupBy("session", "topic")
        .count()
        .select(
            state_partition(key, slot(F.col("topic"), key, partitions), partitions).alias("part"), "count"
        )
        .groupBy("part")
        .agg({"*": "count", "count": "sum"})
        .collect()
    )
    found = {r["part"]: {"sessions": r["count(1)"], "changes": r["sum(count)"]} for r in rows}
    return [{"partition": p, **found.get(p, {"sessions": 0, "changes": 0})} for p in range(partitions)]


def drain_config(
    kafka: KafkaConfig, prefix: str, work: Path, args: argparse.Namespace, source: str = "sotw-kafka"
) -> PipelineConfig:
    """The pipeline's config for one drain of the backlog (availableNow) into ``work`` from ``source``."""
    return PipelineConfig(
        source=source,
        kafka=kafka,
        output=work / "out",
        checkpoint=work / "checkpoint",
        pattern=f"{prefix}.*",
        trigger_ms=None,
        max_offsets_per_trigger=args.max_offsets,
        spark=SparkConfig(),
        batch_delay_s=args.batch_delay,
    )


def pipeline(
    spark: Any,
    kafka: KafkaConfig,
    prefix: str,
    total: int,
    args: argparse.Namespace,
    output_format: str = "parquet",
    source: str = "sotw-kafka",
) -> dict[str, Any]:
    """Drain the backlog with the pipeline (availableNow) into a fresh output; rates, batches and memory."""
    work = Path(tempfile.mkdtemp(prefix="sotw-bench-pipe-"))
    config = replace(drain_config(kafka, prefix, work, args, source), output_format=output_format)
    cpu0 = read_tree(kinds=True)
    with PeakRss() as mem:
        t0 = time.perf_counter()
        run(spark, config)
        elapsed = time.perf_counter() - t0
    by_kind = cpu_by_kind(cpu0, read_tree(kinds=True))
    broker = by_kind.pop("broker", 0.0)
    cpu = sum(by_kind.values())
    # Spark delivers progress events to the listener asynchronously: wait for the last batch's line.
    progress_file = config.output / "progress.jsonl"
    deadline = time.monotonic() + 30
    while True:
        lines = progress_file.read_text().splitlines() if progress_file.exists() else []
        progress = [json.loads(line) for line in lines]
        batches = [
            {
                "batch": p["batchId"],
                "rows": input_messages(p),
                "ms": p["durationMs"].get("triggerExecution", 0),
                "duration_ms": p["durationMs"],
            }
            for p in progress
            if input_messages(p)
        ]
        if sum(b["rows"] for b in batches) >= total or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    rows = sum(b["rows"] for b in batches)
    later = batches[1:]
    later_rate = sum(b["rows"] for b in later) / (sum(b["ms"] for b in later) / 1000) if later else None
    if output_format == "delta":
        changes = sum(c.rows for c in read_commits(config.output / "changes"))
    else:
        changes = sum(
            json.loads(p.read_text())["rows"]["changes"] for p in (config.output / "_commits").glob("*.json")
        )
    load = state_partition_load(spark, config.output / "changes", args.shuffle_partitions)
    shutil.rmtree(work, ignore_errors=True)
    if rows != total:
        raise SystemExit(f"pipeline read {rows} messages, the backlog has {total}")
    return {
        "messages": rows,
        "rate": rows / elapsed,
        "elapsed_s": elapsed,
        "batches": batches,
        "rate_after_first_batch": later_rate,
        "first_batch_ms": batches[0]["ms"] if batches else None,
        "changes_written": changes,
        "state_partitions": load,
        "peak_rss_bytes": mem.peak,
        "peak_rss_parts": mem.peak_parts,
        "cpu_s": cpu,
        "cpu_s_by_process": by_kind,
        "cpu_us_per_msg": cpu / rows * 1e6,
        "broker_cpu_us_per_msg": broker / rows * 1e6,
    }


class DecodeOnly:
    """The floor's state function: decode every value, count the messages in the state, emit the count."""

    def __call__(self, key: tuple[Any, ...], batches: Any, state: Any) -> Any:
        import pandas as pd

        loads = orjson.loads
        n = 0
        for pdf in batches:
            for values in pdf["values"]:
                for value in values:
                    loads(value)
                n += len(values)
        state.update(((state.get[0] if state.exists else 0) + n,))
        state.setTimeoutDuration(3_600_000)  # as the pipeline does for an open session
        yield pd.DataFrame({"messages": [n]})


def batch_messages(progress: dict[str, Any]) -> int:
    """Kafka offsets one trigger read, from its source progress (the backlog's partitions start at 0)."""
    source = progress["sources"][0]
    # PySpark hands each offset over as JSON text ("null" before the first batch).
    start, end = (
        offsets_from_json(json.loads(raw) if isinstance(raw, str) else raw)
        for raw in (source.get("startOffset"), source.get("endOffset"))
    )
    read = lag(start, end)  # the offsets from the batch's start to its end
    return read.offsetsBehindLatest if read else 0


def floor(
    spark: Any, kafka: KafkaConfig, prefix: str, total: int, args: argparse.Namespace
) -> dict[str, Any]:
    """Drain the backlog through the prescribed architecture with a decode-only state function (``--floor``).

    Everything up to the state function is the pipeline's own (``pipeline.reconstruct.group_sessions``): the
    packed rows, the columns handed over, the grouping by session and placement slot, the processing-time
    timeout configuration. Timed like ``pipeline``: from building the query to its end.
    """
    from pyspark.sql.streaming.state import GroupStateTimeout

    from pipeline.placement import placement_partitions
    from pipeline.reconstruct import NO_DATA_BATCHES, group_sessions

    work = Path(tempfile.mkdtemp(prefix="sotw-bench-floor-"))
    config = drain_config(kafka, prefix, work, args)
    cpu0 = read_tree(kinds=True)
    with PeakRss() as mem:
        t0 = time.perf_counter()
        grouped = group_sessions(read_source(spark, config), placement_partitions(spark, config.checkpoint))
        counts = grouped.applyInPandasWithState(
            DecodeOnly(),
            outputStructType="`messages` bigint",
            stateStructType="`n` bigint",
            outputMode="append",
            timeoutConf=GroupStateTimeout.ProcessingTimeTimeout,
        )
        spark.conf.set(NO_DATA_BATCHES, "false")
        query = (
            counts.writeStream.format("noop")
            .option("checkpointLocation", str(config.checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        elapsed = time.perf_counter() - t0
    by_kind = cpu_by_kind(cpu0, read_tree(kinds=True))
    broker = by_kind.pop("broker", 0.0)
    batches = [(batch_messages(p), p["durationMs"].get("triggerExecution", 0)) for p in query.recentProgress]
    batches = [b for b in batches if b[0]]
    shutil.rmtree(work, ignore_errors=True)
    rows = sum(n for n, _ in batches)
    if rows != total:
        raise SystemExit(f"floor read {rows} messages, the backlog has {total}")
    later = batches[1:]
    cpu = sum(by_kind.values())
    return {
        "messages": rows,
        "rate": rows / elapsed,
        "elapsed_s": elapsed,
        "rate_after_first_batch": sum(n for n, _ in later) / (sum(ms for _, ms in later) / 1000)
        if later
        else None,
        "peak_rss_bytes": mem.peak,
        "cpu_s_by_process": by_kind,
        "cpu_us_per_msg": cpu / rows * 1e6,
        "broker_cpu_us_per_msg": broker / rows * 1e6,
    }


def rate_rows(runs: list[dict[str, Any]], wall: str, after: str) -> list[float]:
    """Print a side's best and median rate, wall and after the first batch; return its wall rates."""
    rates = [p["rate"] for p in runs]
    print(f"{wall:34}{max(rates):14,.0f}{statistics.median(rates):14,.0f}")
    afters = [p["rate_after_first_batch"] for p in runs if p["rate_after_first_batch"]]
    if afters:
        print(f"{after:34}{max(afters):14,.0f}{statistics.median(afters):14,.0f}")
    return rates


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap", help="use this Kafka cluster instead of starting a local broker")
    parser.add_argument(
        "--kafka-config", type=Path, default=None, help="librdkafka settings file for --bootstrap (SASL, TLS)"
    )
    parser.add_argument("--broker", choices=BROKERS, default="kafka", help="the local broker (default kafka)")
    parser.add_argument("--messages", type=int, default=600_000, help="backlog size (default 600000)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each side (default 2)")
    parser.add_argument("--sensors", type=int, default=24)
    parser.add_argument(
        "--partitions",
        type=int,
        default=SimulatorConfig().partitions,
        help="partitions per topic (default: the simulator's, 3)",
    )
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--session-s", type=float, default=3600.0, help="simulator session length")
    parser.add_argument("--max-offsets", type=int, default=None, help="maxOffsetsPerTrigger (default none)")
    parser.add_argument(
        "--shuffle-partitions", type=int, default=SparkConfig().shuffle_partitions, help="state partitions"
    )
    parser.add_argument(
        "--floor", action="store_true", help="also run the decode-only floor of the architecture each round"
    )
    parser.add_argument(
        "--delta", action="store_true", help="also drain into the Delta output (--format delta) each round"
    )
    parser.add_argument(
        "--spark-kafka",
        action="store_true",
        help="also drain through Spark's own Kafka connector (--source spark-kafka) each round",
    )
    parser.add_argument("--event-log", type=Path, help="write Spark's event log here (stage and task times)")
    parser.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="another Spark setting (repeatable)"
    )
    parser.add_argument("--json", type=Path, default=Path("runs/bench-pipeline-vs-bare.json"))
    # The nightly benchmark's self-test: a pipeline slowed by a fixed wait per micro-batch must be flagged.
    parser.add_argument("--batch-delay", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    def go(kafka: KafkaConfig) -> dict[str, Any]:
        prefix = f"bench{uuid.uuid4().hex[:6]}-sensor-"
        ends = fill_backlog(kafka, prefix, args)
        total = sum(ends.values())
        t0 = time.perf_counter()
        extra = dict(kv.split("=", 1) for kv in args.conf)
        if args.event_log:
            args.event_log.mkdir(parents=True, exist_ok=True)
            extra |= {
                "spark.eventLog.enabled": "true",
                "spark.eventLog.compress": "false",
                "spark.eventLog.dir": args.event_log.resolve().as_uri(),
            }
        spark = build_session(SparkConfig(shuffle_partitions=args.shuffle_partitions, extra=extra))
        print(f"SparkSession started in {time.perf_counter() - t0:.1f} s (not timed)", flush=True)
        results: dict[str, Any] = {
            "bare": [],
            "pipeline": [],
            "delta": [],
            "spark-kafka": [],
            "floor": [],
            "messages": total,
        }
        for r in range(args.repeats):
            b = bare(kafka, ends)
            results["bare"].append(b)
            print(
                f"  run {r + 1}: bare     {b['rate']:10,.0f} msg/s  {b['cpu_us_per_msg']:5.2f} CPU us/msg (broker {b['broker_cpu_us_per_msg']:.1f})  "
                f"peak {b['peak_rss_bytes'] / 2**20:,.0f} MiB",
                flush=True,
            )
            if args.floor:
                f = floor(spark, kafka, prefix, total, args)
                results["floor"].append(f)
                print(
                    f"  run {r + 1}: floor    {f['rate']:10,.0f} msg/s  "
                    f"({f['rate_after_first_batch'] or 0:,.0f} msg/s after the first batch)  "
                    f"{f['cpu_us_per_msg']:5.1f} CPU us/msg ("
                    + ", ".join(
                        f"{k} {v / f['messages'] * 1e6:.0f}" for k, v in f["cpu_s_by_process"].items()
                    )
                    + f"; broker {f['broker_cpu_us_per_msg']:.1f})",
                    flush=True,
                )
            sides = [("pipeline", "parquet", "sotw-kafka")]
            sides += [("delta", "delta", "sotw-kafka")] if args.delta else []
            sides += [("spark-kafka", "parquet", "spark-kafka")] if args.spark_kafka else []
            for side, output_format, source in sides:
                p = pipeline(spark, kafka, prefix, total, args, output_format, source)
                results[side].append(p)
                after = p["rate_after_first_batch"]
                per_kind = ", ".join(
                    f"{k} {v / p['messages'] * 1e6:.0f}" for k, v in p["cpu_s_by_process"].items()
                )
                print(
                    f"  run {r + 1}: {side:11} {p['rate']:10,.0f} msg/s  ({len(p['batches'])} batches, "
                    f"{after or 0:,.0f} msg/s after the first batch of {p['first_batch_ms']} ms)  "
                    f"{p['cpu_us_per_msg']:5.1f} CPU us/msg ({per_kind}; broker {p['broker_cpu_us_per_msg']:.1f})  "
                    f"peak {p['peak_rss_bytes'] / 2**20:,.0f} MiB",
                    flush=True,
                )
        spark.stop()
        return results

    load_before = os.getloadavg()
    if args.bootstrap:
        broker_note = args.bootstrap
        settings = read_settings(args.kafka_config) if args.kafka_config else {}
        results = go(KafkaConfig(args.bootstrap, settings))
    else:
        with local_broker(args.broker) as broker:
            broker_note = f"local {args.broker} at {broker.bootstrap}"
            results = go(KafkaConfig(broker.bootstrap))
    load = os.getloadavg()

    best_bare = max(b["rate"] for b in results["bare"])
    best_pipe = max(p["rate"] for p in results["pipeline"])
    afters = [p["rate_after_first_batch"] for p in results["pipeline"] if p["rate_after_first_batch"]]
    best_after = max(afters) if afters else None
    peak = max(p["peak_rss_bytes"] for p in results["pipeline"])
    ratio = best_pipe / best_bare
    print()
    print(f"{'':34}{'best msg/s':>14}{'median msg/s':>14}")
    print(f"{'bare consumer + orjson decode':34}{best_bare:14,.0f}"
          f"{statistics.median(b['rate'] for b in results['bare']):14,.0f}")  # fmt: skip
    print(f"{'pipeline (wall time of run)':34}{best_pipe:14,.0f}"
          f"{statistics.median(p['rate'] for p in results['pipeline']):14,.0f}")  # fmt: skip
    if best_after:
        print(f"{'pipeline after the first batch':34}{best_after:14,.0f}{statistics.median(afters):14,.0f}")
    if results["delta"]:
        deltas = rate_rows(results["delta"], "pipeline, Delta output (wall)", "Delta after the first batch")
        print(f"{'ratio Delta / Parquet output':34}{max(deltas) / best_pipe:14.2f}")
    if results["spark-kafka"]:
        theirs = rate_rows(
            results["spark-kafka"], "spark-kafka source (wall)", "spark-kafka after the first batch"
        )
        cpu = {
            side: statistics.median(p["cpu_us_per_msg"] for p in results[side])
            for side in ("bare", "pipeline", "spark-kafka")
        }
        print(f"{'ratio spark-kafka / sotw-kafka':34}{max(theirs) / best_pipe:14.2f}")
        print(
            f"{'CPU us/msg, median':34}bare {cpu['bare']:.2f}, sotw-kafka {cpu['pipeline']:.1f}, "
            f"spark-kafka {cpu['spark-kafka']:.1f}"
        )
    if results["floor"]:
        floors = [f["rate"] for f in results["floor"]]
        print(f"{'floor (decode-only state, wall)':34}{max(floors):14,.0f}{statistics.median(floors):14,.0f}")
        f_after = [f["rate_after_first_batch"] for f in results["floor"] if f["rate_after_first_batch"]]
        if f_after:
            print(
                f"{'floor after the first batch':34}{max(f_after):14,.0f}{statistics.median(f_after):14,.0f}"
            )
        print(f"{'ratio floor / bare':34}{max(floors) / best_bare:14.2f}")
    print(f"{'ratio pipeline / bare':34}{ratio:14.2f}")
    spread = results["pipeline"][-1]["state_partitions"]
    busiest = max(part["changes"] for part in spread) / max(1, sum(part["changes"] for part in spread))
    print(
        "state partitions (sessions / changes): "
        + ", ".join(f"{part['sessions']} / {part['changes']:,}" for part in spread)
        + f"; the busiest holds {busiest:.0%} of the changes (even: {1 / len(spread):.0%})"
    )
    print(f"{'peak RSS of the process tree':34}{peak / 2**20:11,.0f} MiB (driver + JVM + Python workers)")
    print(
        f"{results['messages']:,} messages, {args.sensors} topics x {args.partitions} partitions, "
        f"broker: {broker_note}, load average {load_before[0]:.1f} before, {load[0]:.1f} after"
    )
    doc = {
        **results,
        "sensors": args.sensors,
        "partitions": args.partitions,
        "rows": args.rows,
        "broker": broker_note,
        "best_bare": best_bare,
        "best_pipeline": best_pipe,
        "best_pipeline_after_first_batch": best_after,
        "best_delta": max((p["rate"] for p in results["delta"]), default=None),
        "best_spark_kafka": max((p["rate"] for p in results["spark-kafka"]), default=None),
        "ratio": ratio,
        "floor_ratio": max(f["rate"] for f in results["floor"]) / best_bare if results["floor"] else None,
        "peak_rss_bytes": peak,
        "targets": {"pipeline_msgs_per_s": 80_000, "ratio": 0.5},
        "loadavg_before": load_before,
        "loadavg_after": load,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``sotw pipeline``: run the streaming job; ``sotw pipeline inspect OUTPUT`` summarizes what it wrote."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.config import FORMATS, SOURCES, PipelineConfig, parse_trigger
from pipeline.errors import IntegrityStopped
from pipeline.policies import POLICIES, PolicyConfig
from pipeline.spark import SparkConfig
from sotw.cliargs import add_kafka_args, add_logging_args, kafka_config, setup_logging

EXIT_INTEGRITY = 3


def build_parser() -> argparse.ArgumentParser:
    """The ``sotw pipeline`` argument parser."""
    p = argparse.ArgumentParser(
        prog="sotw pipeline",
        description="Rebuild every capture session's table from the sensor topics, enforce an integrity "
        "policy and write Parquet or Delta exactly once. `sotw pipeline inspect OUTPUT` summarizes an output; "
        "`sotw pipeline rollback OUTPUT --to-batch N` takes one back to an earlier batch; `sotw pipeline "
        "compact OUTPUT` compacts a Delta output's small files and applies its retention.",
    )
    add_kafka_args(p)
    p.add_argument("--pattern", default="sotw-sensor-.*", help="topic regex to subscribe to (sotw-sensor-.*)")
    p.add_argument(
        "--starting-offsets", default="earliest", help="earliest, latest or Spark's JSON form (earliest)"
    )
    p.add_argument("--policy", choices=POLICIES, default="ordered", help="integrity policy (ordered)")
    p.add_argument(
        "--trigger", default="2s", help="micro-batch interval (2s, 500ms, 15min, 1h) or availableNow (2s)"
    )
    p.add_argument("--session-timeout", default="1h", help="close sessions quiet for this long (1h)")
    p.add_argument("--window-messages", type=int, default=None, help="window policy: lateness in messages")
    p.add_argument("--window-ms", type=int, default=None, help="window policy: lateness in ms of event time")
    p.add_argument("--output", type=Path, default=Path("runs/pipeline/output"), help="output root")
    p.add_argument(
        "--format",
        dest="output_format",
        choices=FORMATS,
        default="parquet",
        help="parquet (with _commits markers) or delta (Delta tables, exactly once by transaction id) (parquet)",
    )
    p.add_argument("--checkpoint", type=Path, default=None, help="checkpoint (OUTPUT/../checkpoint)")
    p.add_argument("--max-offsets-per-trigger", type=int, default=None, help="records per batch, at most")
    p.add_argument(
        "--fail-on-data-loss",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="stop if offsets still needed are gone (default: on)",
    )
    p.add_argument("--discovery-interval", default="5s", help="how often new topics are looked for (5s)")
    p.add_argument(
        "--storage-retry",
        default="10min",
        help="how long the checkpoint or output may refuse writes before the pipeline stops; it restarts "
        "the query from its checkpoint once they are writable (10min)",
    )
    p.add_argument("--source", choices=SOURCES, default="sotw-kafka", help="Kafka reader (sotw-kafka)")
    spark = SparkConfig()
    p.add_argument("--master", default=spark.master, help="Spark master (%(default)s)")
    p.add_argument("--driver-memory", default=spark.driver_memory, help="Spark driver memory (%(default)s)")
    p.add_argument(
        "--shuffle-partitions",
        type=int,
        default=None,
        help=f"state partitions, fixed by the first start of a checkpoint (default {spark.shuffle_partitions}; "
        "a restart with another count is refused)",
    )
    p.add_argument("--spark-ui", action="store_true", help="start the Spark web UI")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting")
    p.add_argument("--progress", type=Path, default=None, help="progress log (OUTPUT/progress.jsonl)")
    p.add_argument("--drop-batch", type=int, action="append", default=[], help=argparse.SUPPRESS)
    p.add_argument("--batch-delay", type=float, default=0.0, help=argparse.SUPPRESS)
    add_logging_args(p)
    return p


def config_from_args(args: argparse.Namespace) -> PipelineConfig:
    """Turn parsed flags into a ``PipelineConfig`` (the only place flags become configuration)."""
    timeout_ms = parse_trigger(args.session_timeout)
    discovery_ms = parse_trigger(args.discovery_interval)
    storage_ms = parse_trigger(args.storage_retry)
    if timeout_ms is None or discovery_ms is None or storage_ms is None:
        raise ValueError(
            "--session-timeout, --discovery-interval and --storage-retry need a duration such as 30s"
        )
    extra: dict[str, str] = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--conf {item!r} is not KEY=VALUE")
        extra[key] = value
    policy_args: dict[str, Any] = {"policy": args.policy, "session_timeout_ms": timeout_ms}
    if args.window_messages is not None:
        policy_args["window_messages"] = args.window_messages
    if args.window_ms is not None:
        policy_args["window_ms"] = args.window_ms
    return PipelineConfig(
        kafka=kafka_config(args),
        output=args.output,
        checkpoint=args.checkpoint or args.output.parent / "checkpoint",
        pattern=args.pattern,
        starting_offsets=args.starting_offsets,
        policy=PolicyConfig(**policy_args),
        trigger_ms=parse_trigger(args.trigger),
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        fail_on_data_loss=args.fail_on_data_loss,
        discovery_interval_ms=discovery_ms,
        source=args.source,
        spark=SparkConfig(
            master=args.master,
            driver_memory=args.driver_memory,
            shuffle_partitions=args.shuffle_partitions or SparkConfig.shuffle_partitions,
            ui=args.spark_ui,
            extra=extra,
        ),
        progress_path=args.progress,
        drop_batches=frozenset(args.drop_batch),
        batch_delay_s=args.batch_delay,
        state_partitions=args.shuffle_partitions,
        storage_retry_s=storage_ms / 1000,
        output_format=args.output_format,
    )


def status_line(summary: dict[str, Any]) -> None:
    """Print one concise line per trigger."""
    print(
        f"batch {summary['batch']:>5}  in {summary['input_rows']:>9,} rows  "
        f"{summary['processed_rate']:>10,.0f} rows/s  lag {summary['lag']:>9,}  "
        f"sessions {summary['state_rows']:>6,}  {summary['duration_ms'] / 1000:>6.2f} s",
        file=sys.stderr,
        flush=True,
    )


def inspect_main(argv: Sequence[str]) -> int:
    """``sotw pipeline inspect OUTPUT``."""
    from pipeline.inspect import render, summarize_output

    p = argparse.ArgumentParser(prog="sotw pipeline inspect", description="Summarize a pipeline output root.")
    p.add_argument("output", type=Path)
    args = p.parse_args(argv)
    if not args.output.is_dir():
        print(f"sotw pipeline inspect: {args.output} is not a directory", file=sys.stderr)
        return 2
    print(render(summarize_output(args.output), args.output))
    return 0


def rollback_main(argv: Sequence[str]) -> int:
    """``sotw pipeline rollback OUTPUT --to-batch N``."""
    from pipeline.errors import PipelineError
    from pipeline.recovery import rollback

    p = argparse.ArgumentParser(
        prog="sotw pipeline rollback",
        description="Take an output back to an earlier batch (the pipeline must be stopped): every later "
        "batch's files and commit marker are removed, so a restored checkpoint writes them again.",
    )
    p.add_argument("output", type=Path)
    p.add_argument("--to-batch", type=int, required=True, help="the last batch to keep (-1: none)")
    p.add_argument(
        "--checkpoint", type=Path, default=None, help="the query's checkpoint (OUTPUT/../checkpoint)"
    )
    args = p.parse_args(argv)
    try:
        result = rollback(args.output, args.checkpoint or args.output.parent / "checkpoint", args.to_batch)
    except PipelineError as exc:
        print(f"sotw pipeline rollback: error: {exc}", file=sys.stderr)
        return 2
    removed = ", ".join(map(str, result.batches)) or "none"
    print(f"rolled back to batch {args.to_batch}: removed batches {removed} ({result.files} files)")
    return 0


def compact_main(argv: Sequence[str]) -> int:
    """``sotw pipeline compact OUTPUT``."""
    from pipeline.delta import compact
    from pipeline.errors import PipelineError

    p = argparse.ArgumentParser(
        prog="sotw pipeline compact",
        description="Compact the small files of a Delta output (one per session and batch) into larger ones, "
        "delete files unreferenced for longer than the retention and trim the log. Safe while the pipeline "
        "runs; schedule it (cron, Airflow) rather than doing it by hand.",
    )
    p.add_argument("output", type=Path, help="a Delta output root (its datasets) or one Delta table")
    p.add_argument(
        "--retention",
        default="168h",
        help="keep unreferenced files this long, for readers of older versions (168h: a week)",
    )
    p.add_argument("--no-vacuum", action="store_true", help="compact only; delete nothing")
    args = p.parse_args(argv)
    try:
        retention_ms = parse_trigger(args.retention)
        if retention_ms is None:
            raise ValueError(args.retention)
        results = compact(args.output, retention_hours=retention_ms // 3_600_000, vacuum=not args.no_vacuum)
    except ValueError:
        print(
            f"sotw pipeline compact: --retention must be a duration such as 168h, got {args.retention!r}",
            file=sys.stderr,
        )
        return 2
    except PipelineError as exc:
        print(f"sotw pipeline compact: error: {exc}", file=sys.stderr)
        return 2
    for r in results:
        print(
            f"{r.table}: {r.files_removed} files compacted into {r.files_added}; {r.vacuumed} old files deleted"
        )
    return 0


def main(argv: Sequence[str]) -> int:
    """Run the pipeline until Ctrl-C/SIGTERM (or until drained with ``--trigger availableNow``)."""
    argv = list(argv)
    if argv and argv[0] == "inspect":
        return inspect_main(argv[1:])
    if argv and argv[0] == "rollback":
        return rollback_main(argv[1:])
    if argv and argv[0] == "compact":
        return compact_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    from pipeline import query
    from pipeline.spark import build_session
    from sotw.broker import wait_for_kafka

    # Fail in seconds with a clear message rather than after Spark start-up with a source time-out.
    wait_for_kafka(config.kafka.bootstrap, timeout=15.0, settings=dict(config.kafka.settings))

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(
        f"sotw pipeline: {config.kafka.bootstrap} /{config.pattern}/ policy={config.policy.policy} "
        f"-> {config.output}",
        file=sys.stderr,
        flush=True,
    )
    spark = build_session(config.spark, app_name="sotw-pipeline")
    try:
        result = query.run(spark, config, stop, on_progress=None if args.quiet else status_line)
    except IntegrityStopped as exc:
        print(f"sotw pipeline: integrity violation, stopped: {exc}", file=sys.stderr)
        return EXIT_INTEGRITY
    finally:
        spark.stop()
    print(
        f"sotw pipeline: stopped ({result.stopped_by}); last batch {result.last_batch}; "
        f"`sotw pipeline inspect {config.output}` summarizes it",
        file=sys.stderr,
    )
    return 0

"""Measuring what a capacity plan needs: one SparkSession drains a backlog with two batch sizes (``python -m loadtest.planning.plan drain_once``, a process of its own), and the batches' times per message and per batch are fitted."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from loadtest.errors import HarnessError
from loadtest.planning.costs import LARGE_BATCH, SMALL_BATCH, BatchCost, Measurements, fit
from loadtest.run.profile import Profile
from sotw.kafka import topic_pattern


def drain_once(argv: Sequence[str]) -> int:
    """``python -m loadtest.planning.plan drain_once ...``: drain a backlog with two batch sizes in one SparkSession."""
    from pipeline import query
    from pipeline.config import PipelineConfig
    from pipeline.policies import PolicyConfig
    from pipeline.spark import SparkConfig, build_session
    from sotw.kafka import KafkaConfig, read_settings

    p = argparse.ArgumentParser(prog="loadtest.planning.plan drain_once")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--kafka-config", type=Path, default=None)
    p.add_argument("--pattern", action="append", required=True)
    p.add_argument("--master", required=True)
    p.add_argument("--conf", action="append", default=[])
    p.add_argument("--max-offsets", type=int, action="append", required=True)
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--policy", default="ordered")
    p.add_argument("--session-timeout-ms", type=int, default=3_600_000)
    args = p.parse_args(argv)
    kafka = KafkaConfig(args.bootstrap, read_settings(args.kafka_config) if args.kafka_config else {})
    extra = dict(kv.split("=", 1) for kv in args.conf)
    policy = PolicyConfig(policy=args.policy, session_timeout_ms=args.session_timeout_ms)
    spark = build_session(SparkConfig(master=args.master, extra=extra), app_name="sotw-plan")
    drains: list[dict[str, Any]] = []
    try:
        # A first drain warms the JVM (its code compiled, Python workers started); it is not measured, so the
        # sizes measured after it are not told apart by how warm the JVM was.
        order = [(args.pattern[0], max(args.max_offsets), True)]
        order += [
            (pattern, max_offsets, False) for pattern in args.pattern for max_offsets in args.max_offsets
        ]
        for pattern, max_offsets, warm_up in order:
            where = args.work / f"{len(drains)}{'-warm-up' if warm_up else ''}"
            # Each drain's own output name: the query is named after it, and its progress is told apart by it.
            config = PipelineConfig(
                kafka=kafka,
                output=where / f"output-{len(drains)}",
                checkpoint=where / "checkpoint",
                pattern=pattern,
                trigger_ms=None,
                max_offsets_per_trigger=max_offsets,
                discovery_interval_ms=0,
                policy=policy,
            )
            query.run(spark, config)
            progress = config.output / "progress.jsonl"
            lines = progress.read_text().splitlines() if progress.is_file() else []
            records = [json.loads(x) for x in lines if x]
            if not warm_up:
                drains.append({"pattern": pattern, "max_offsets": max_offsets, "progress": records})
    finally:
        spark.stop()
    args.out.write_text(json.dumps(drains))
    return 0


def batch_points(progress: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """Each batch of a drain as (messages, seconds), from its progress log."""
    from pipeline.progress import input_messages

    points = [
        (float(input_messages(r)), float((r.get("durationMs") or {}).get("triggerExecution", 0)) / 1000.0)
        for r in progress
    ]
    return [p for p in points[1:] if p[0] > 0]  # the first batch also starts the query


def measure(
    root: Path,
    messages: int,
    profile: Profile,
    base_env: dict[str, str],
    say: Any = print,
    security: str = "plaintext",
) -> Measurements:
    """Take every measurement the plan needs (minutes of CPU: a quiet machine gives steadier figures).

    The backlog is ``profile``'s fleet (sensors, rows, partitions, sessions, faults) written as fast as the
    broker takes it, and the pipeline drains it with the profile's policy: the same messages and work as a run
    of that profile. ``security`` is the broker's (``sotw broker --security``): TLS and SASL cost the broker
    CPU per message, and the plan's broker count follows from that cost. The broker is always one started
    here: its CPU is read from its processes, which a remote cluster does not show.
    """
    from loadtest.regressions.nightly import machine
    from loadtest.run.cluster import ClusterConfig, StandaloneCluster
    from pipeline.progress import input_messages
    from simulator import Simulator
    from sotw.broker import KafkaBroker

    root.mkdir(parents=True, exist_ok=True)
    with KafkaBroker(log_path=root / "broker.log", security=security) as broker:
        kafka = broker.kafka_config()

        def broker_cpu() -> float:
            total = 0.0
            for pid in broker.pids.values():
                times = psutil.Process(pid).cpu_times()
                total += times.user + times.system
            return total

        fleet_config = profile.simulator
        sensors, rows = fleet_config.sensors, fleet_config.rows

        def fill(prefix: str, n: int, **changes: Any) -> float:
            cpu0 = broker_cpu()
            config = fleet_config.replace(
                topic_prefix=prefix, rate=0, duration_s=None, max_messages=n, load_factor=1.0, **changes
            )
            Simulator(config, kafka, Path(tempfile.mkdtemp(prefix="sotw-plan-sim-", dir=root))).run()
            return (broker_cpu() - cpu0) / n * 1e6

        say(
            f"plan: writing a backlog of {messages:,} messages (profile {profile.name}: {sensors} sensors x {rows} rows)"
        )
        produce_us = fill("plan-fleet-", messages)
        fill("plan-single-", messages // 2, sensors=1, partitions=1)
        fleet, single = topic_pattern("plan-fleet-"), topic_pattern("plan-single-")
        costs: list[BatchCost] = []
        consumed_cpu, consumed = 0.0, 0
        partition_rate = math.nan
        state_bytes = math.nan

        def drain(setup: str, master: str, cores: int, conf: list[str], with_single: bool) -> None:
            nonlocal consumed_cpu, consumed, partition_rate, state_bytes
            say(f"plan: draining on {setup} ({master})")
            out = root / f"{setup}.json"
            argv = [sys.executable, "-m", "loadtest.planning.plan", "drain_once", "--bootstrap", kafka.bootstrap,
                    "--pattern", fleet, "--master", master, "--work", str(root / setup), "--out", str(out),
                    "--max-offsets", str(SMALL_BATCH), "--max-offsets", str(LARGE_BATCH),
                    "--policy", profile.pipeline.policy, "--session-timeout-ms",
                    str(profile.pipeline.session_timeout_ms)]  # fmt: skip
            argv += [a for kv in conf for a in ("--conf", kv)]
            if broker.admin_config_path is not None:  # a file of mode 0600: no secret on a command line
                argv += ["--kafka-config", str(broker.admin_config_path)]
            if with_single:
                argv += ["--pattern", single]
            cpu0 = broker_cpu()
            with (root / f"{setup}.log").open("ab") as log_file:
                done = subprocess.run(
                    argv, stdout=log_file, stderr=subprocess.STDOUT, check=False, env=base_env
                )
            if done.returncode != 0:
                raise HarnessError(
                    f"the drain on {setup} failed (exit {done.returncode}); see {root / setup}.log"
                )
            drains = json.loads(out.read_text())
            fleet_drains = [d for d in drains if d["pattern"] == fleet]
            points = [p for d in fleet_drains for p in batch_points(d["progress"])]
            f, f_se, c, c_se = fit(points)
            costs.append(BatchCost(setup, master, cores, f, f_se, c, c_se, [list(p) for p in points]))
            consumed_cpu += broker_cpu() - cpu0
            consumed += sum(input_messages(r) for d in drains for r in d["progress"])
            single_points = [p for d in drains if d["pattern"] == single for p in batch_points(d["progress"])]
            if single_points:
                try:
                    _, _, c1, c1_se = fit(single_points)
                    # A cost per message within two standard errors of zero says nothing of the rate.
                    partition_rate = 1.0 / c1 if c1 > 2 * c1_se else math.nan
                    if math.isnan(partition_rate):
                        say("plan: one partition's cost per message is lost in the noise; no rate for it")
                except HarnessError as exc:
                    say(f"plan: no rate for one partition: {exc}")
            for d in drains:
                if d["pattern"] == fleet and d["max_offsets"] == LARGE_BATCH and d["progress"]:
                    ops = (d["progress"][-1].get("stateOperators") or [{}])[0]
                    if ops.get("numRowsTotal"):
                        state_bytes = float(ops.get("memoryUsedBytes", 0)) / float(ops["numRowsTotal"])

        drain("local-1", "local[1]", 1, [], False)
        drain("local-2", "local[2]", 2, [], True)
        cluster_config = ClusterConfig(
            python=sys.executable, base_env=base_env, workers=1, cores=2, memory="2g"
        )
        with StandaloneCluster(cluster_config, root / "cluster") as cluster:
            for cores in (1, 2):
                drain(f"standalone-{cores}", cluster.master_url, cores, [f"spark.cores.max={cores}"], False)
    return Measurements(
        taken_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        machine=machine()
        | {"loadavg_end": round(os.getloadavg()[0], 2), "python": platform.python_version()},
        command=f"sotw plan measure --messages {messages} --profile {profile.name}"
        + (f" --security {security}" if security != "plaintext" else ""),
        backlog={
            "messages": float(messages),
            "sensors": float(sensors),
            "rows": float(rows),
            "partitions": float(fleet_config.partitions),
            "session_interval_s": float(fleet_config.session_interval_s),
        },
        costs=costs,
        partition_rate=partition_rate,
        broker_produce_us=produce_us,
        broker_consume_us=consumed_cpu / max(1, consumed) * 1e6,
        state_bytes_per_session=state_bytes,
    )

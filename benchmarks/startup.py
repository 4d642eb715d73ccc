"""Start-up time of ``sotw pipeline`` on each Kafka source: from the command to its first committed batch.

Usage::

    .venv/bin/python benchmarks/startup.py [--repeats 3] [--bootstrap HOST:PORT] [--json runs/bench-startup.json]

A small backlog (4 sensors, about 2,000 messages) is written once by the simulator. Then, alternately (so a
neighbour's load hits both alike), ``sotw pipeline --trigger availableNow`` runs as its own process on each
source (``sotw-kafka``, ``spark-kafka``) into a fresh output and checkpoint, as the harness starts it. Timed:

* **first batch**: from starting the process to the first batch's commit marker (``_commits/0.json``): the
  interpreter, the JVM and SparkSession, the query's start (for sotw-kafka its Python source runner and
  planner; for spark-kafka the connector's admin client) and the first micro-batch;
* **exit**: to the process's exit, the backlog drained and Spark stopped.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from pipeline.config import SOURCES
from simulator import Simulator, SimulatorConfig
from sotw.broker import local_broker
from sotw.kafka import KafkaConfig, topic_pattern


def start_once(kafka: KafkaConfig, prefix: str, source: str) -> dict[str, float]:
    """One ``sotw pipeline`` process over the backlog; seconds to its first commit marker and to its exit."""
    work = Path(tempfile.mkdtemp(prefix="sotw-bench-startup-"))
    marker = work / "out" / "_commits" / "0.json"
    argv = [
        sys.executable, "-m", "sotw", "pipeline", "--bootstrap", kafka.bootstrap,
        "--pattern", topic_pattern(prefix), "--source", source, "--trigger", "availableNow",
        "--output", str(work / "out"), "--checkpoint", str(work / "checkpoint"), "-q",
    ]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first = None
    while proc.poll() is None:
        if first is None and marker.exists():
            first = time.perf_counter() - t0
        time.sleep(0.02)
    done = time.perf_counter() - t0
    err = proc.stderr.read().decode() if proc.stderr else ""
    shutil.rmtree(work, ignore_errors=True)
    if proc.returncode != 0:
        raise SystemExit(f"sotw pipeline --source {source} failed ({proc.returncode}): {err[-2000:]}")
    return {"first_batch_s": first if first is not None else done, "exit_s": done}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap", help="use this Kafka cluster instead of starting a local broker")
    parser.add_argument("--repeats", type=int, default=3, help="starts of each source (default 3)")
    parser.add_argument("--json", type=Path, default=Path("runs/bench-startup.json"))
    args = parser.parse_args(argv)

    def go(kafka: KafkaConfig) -> dict[str, Any]:
        prefix = f"start{uuid.uuid4().hex[:6]}-sensor-"
        work = Path(tempfile.mkdtemp(prefix="sotw-bench-startup-sim-"))
        config = SimulatorConfig(sensors=4, rows=50, topic_prefix=prefix, rate=0, max_messages=2000, seed=1)
        Simulator(config, kafka, work / "run").run()
        shutil.rmtree(work, ignore_errors=True)
        found: dict[str, Any] = {source: [] for source in SOURCES}
        for r in range(args.repeats):
            for source in SOURCES:
                once = start_once(kafka, prefix, source)
                found[source].append(once)
                print(
                    f"  run {r + 1}: {source:11} first batch {once['first_batch_s']:5.1f} s, exit {once['exit_s']:5.1f} s",
                    flush=True,
                )
        return found

    if args.bootstrap:
        results = go(KafkaConfig(args.bootstrap))
    else:
        with local_broker("kafka") as broker:
            results = go(KafkaConfig(broker.bootstrap))
    print(f"\n{'median of ' + str(args.repeats):20}{'first batch s':>15}{'exit s':>10}")
    summary = {}
    for source, runs in results.items():
        first = statistics.median(r["first_batch_s"] for r in runs)
        done = statistics.median(r["exit_s"] for r in runs)
        summary[source] = {"first_batch_s": first, "exit_s": done}
        print(f"{source:20}{first:15.1f}{done:10.1f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"runs": results, "median": summary}, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

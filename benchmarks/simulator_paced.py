"""What the simulator costs while it paces a rate, against a bare paced producer loop, on one broker in one run.

Usage::

    .venv/bin/python benchmarks/simulator_paced.py [--rates 2000,20000] [--seconds 20] [--repeats 1]
                                                  [--bootstrap HOST:PORT] [--json runs/bench-paced.json]

The simulator runs the ``baseline`` load-test profile's fleet (24 sensors x 200 rows, 1 partition, skew 0.5,
30 s sessions, a trickle of every fault) at each rate for ``--seconds`` of schedule. For each run it prints
the CPU the simulator's process used (every thread: the loop, librdkafka's, the ledger's writer) as a share
of one core and per message, over the schedule (from its first message until ``run`` returned: the flush
and the last ledger chunk included, the set-up before the schedule not), and the schedule lateness
(``sent_ts - intended_ts`` from the ledger, on-schedule messages only) at p50, p99 and max.

Beside it, unless ``--no-bare``, a bare paced loop: confluent-kafka's ``Producer`` with the simulator's
settings, a delivery callback keeping each offset, one ready-made value of a real update's size, waking
every millisecond to produce what is due and poll. It is the floor of pacing a rate with this client in
Python: no planning, no encoding, no ledger. Each side writes to topics of its own, deleted after it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from confluent_kafka import Producer

from simulator import DEFAULT_PRODUCER, FaultConfig, Simulator, SimulatorConfig
from sotw.broker import BROKERS, local_broker
from sotw.kafka import KafkaConfig, ensure_topics

sys.path.insert(0, str(Path(__file__).resolve().parent))
from simulator_vs_bare import drop_topics, sample_payloads, write_results  # noqa: E402

#: The ``baseline`` profile's fleet and faults (loadtest/scenarios.toml).
SENSORS = 24
BASELINE = {
    "sensors": SENSORS,
    "rows": 200,
    "partitions": 1,
    "skew": 0.5,
    "session_interval_s": 30.0,
    "seed": 7,
    "faults": FaultConfig(
        gap=0.0005,
        duplicate=0.0005,
        delayed=0.0005,
        malformed=0.0005,
        abandon=0.02,
        delay_ms=100,
        delay_max_ms=500,
    ),
}


def percentiles(lateness_ms: np.ndarray) -> dict[str, float]:
    """p50, p99 and max of lateness values, ms."""
    if not lateness_ms.size:
        return {
            "lateness_p50_ms": float("nan"),
            "lateness_p99_ms": float("nan"),
            "lateness_max_ms": float("nan"),
        }
    return {
        "lateness_p50_ms": float(np.percentile(lateness_ms, 50)),
        "lateness_p99_ms": float(np.percentile(lateness_ms, 99)),
        "lateness_max_ms": float(lateness_ms.max()),
    }


def thread_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds of each thread of this process, by native id, with its name (Linux; empty elsewhere).

    librdkafka names its threads (``rdk:broker1``...); Python's threads are named from ``threading``.
    """
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[int, tuple[str, float]] = {}
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return out
    tick = os.sysconf("SC_CLK_TCK")
    for task in tasks:
        try:
            stat = Path(f"/proc/self/task/{task}/stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        tid = int(task)
        name = names.get(tid, comm)
        out[tid] = (
            "librdkafka" if comm.startswith("rdk:") else name,
            (int(fields[11]) + int(fields[12])) / tick,
        )
    return out


def by_name(first: dict[int, tuple[str, float]], last: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds between two ``thread_cpu`` samples, summed by thread name."""
    out: dict[str, float] = {}
    for tid, (name, cpu) in last.items():
        out[name] = out.get(name, 0.0) + cpu - first.get(tid, (name, 0.0))[1]
    return out


def simulator(kafka: KafkaConfig, prefix: str, rate: float, seconds: float, extra: dict[str, Any]) -> dict:
    """The simulator pacing ``rate`` for ``seconds`` of schedule: CPU over the schedule and lateness."""
    run_dir = Path(tempfile.mkdtemp(prefix="sotw-paced-")) / f"run-{uuid.uuid4().hex[:8]}"
    cfg = SimulatorConfig(topic_prefix=prefix, rate=rate, duration_s=seconds, **{**BASELINE, **extra})
    sim = Simulator(cfg, kafka, run_dir)
    mark: dict[str, float] = {}
    threads: list[dict[int, tuple[str, float]]] = []
    done = threading.Event()

    def watch() -> None:
        # The schedule starts after the set-up (broker check, tables, topics, compiled kernels): take the
        # CPU clock as the first message is planned.
        while not done.wait(0.02):
            if sim.stats().planned:
                mark["cpu"], mark["wall"] = time.process_time(), time.perf_counter()
                threads.append(thread_cpu())
                break
        # Each thread's CPU until the schedule's end (librdkafka's threads end with the run).
        while not done.wait(0.25) and time.perf_counter() - mark["wall"] < seconds:
            mark["threads_wall"] = time.perf_counter()
            threads[1:] = [thread_cpu()]

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    summary = sim.run()
    cpu_end, wall_end = time.process_time(), time.perf_counter()
    done.set()
    watcher.join()
    ledger = pq.read_table(run_dir / "ledger", columns=["fault", "intended_ts", "sent_ts"]).to_pandas()
    shutil.rmtree(run_dir.parent, ignore_errors=True)
    on_schedule = ledger[ledger["fault"].isin(["none", "malformed"]) & ledger["sent_ts"].notna()]
    lateness = (on_schedule["sent_ts"] - on_schedule["intended_ts"]).to_numpy(dtype=float)
    cpu, wall = cpu_end - mark["cpu"], wall_end - mark["wall"]
    span = mark.get("threads_wall", mark["wall"]) - mark["wall"]
    shares = {k: v / span for k, v in by_name(threads[0], threads[-1]).items()} if span > 0 else {}
    return {
        "thread_share_of_core": shares,
        "rate": rate,
        "sent": summary.stats.sent,
        "wall_s": wall,
        "cpu_s": cpu,
        "cpu_share_of_core": cpu / wall,
        "cpu_us_per_msg": cpu / summary.stats.sent * 1e6,
        "unacknowledged": summary.unacknowledged,
        **percentiles(lateness),
    }


def bare_paced(
    kafka: KafkaConfig, topics: list[str], payload: bytes, rate: float, seconds: float, tick_s: float = 0.001
) -> dict:
    """A bare loop pacing ``rate``: wakes every ``tick_s``, produces what is due, polls; CPU and lateness."""
    producer = Producer(
        kafka.client(**{k: v for k, v in DEFAULT_PRODUCER.items() if k not in kafka.settings})
    )
    offsets: list[int] = []
    keep = offsets.append

    def on_delivery(err: Any, msg: Any) -> None:
        keep(msg.offset())

    keys = [t.encode() for t in topics]
    n = int(rate * seconds)
    late = np.empty(n)
    cpu0, start = time.process_time(), time.perf_counter()
    wall0 = start
    i = 0
    while i < n:
        now = time.perf_counter()
        due = min(n, int((now - start) * rate) + 1)
        while i < due:
            k = i % len(topics)
            producer.produce(topics[k], payload, keys[k], 0, on_delivery)
            late[i] = (now - start - i / rate) * 1000.0
            i += 1
        producer.poll(0)
        # Sleep until the next message is due, but at least a tick: each wake then sends all that is due.
        time.sleep(max(tick_s - (time.perf_counter() - now), start + i / rate - time.perf_counter(), 0.0))
    left = producer.flush(60)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    if left or len(offsets) != n:
        raise SystemExit(f"bare paced loop: {left} messages not acknowledged")
    return {
        "rate": rate,
        "sent": n,
        "wall_s": wall,
        "cpu_s": cpu,
        "cpu_share_of_core": cpu / wall,
        "cpu_us_per_msg": cpu / n * 1e6,
        **percentiles(late),
    }


def line(label: str, r: dict) -> str:
    """One result as a printed line (and the simulator's threads' shares under it)."""
    text = (
        f"  {label:<22} {r['rate']:>8,.0f} msg/s  CPU {100 * r['cpu_share_of_core']:5.1f} % of a core  "
        f"{r['cpu_us_per_msg']:6.1f} us/msg  lateness p50 {r['lateness_p50_ms']:5.1f}  "
        f"p99 {r['lateness_p99_ms']:6.1f}  max {r['lateness_max_ms']:6.1f} ms"
    )
    shares = {k: v for k, v in r.get("thread_share_of_core", {}).items() if v >= 0.001}
    if shares:
        text += "\n" + " " * 26 + "by thread: " + ", ".join(f"{k} {100 * v:.1f} %" for k, v in shares.items())
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap", help="use this Kafka cluster instead of starting a local broker")
    parser.add_argument("--broker", choices=BROKERS, default="kafka", help="the local broker (default kafka)")
    parser.add_argument(
        "--rates", default="2000,20000", help="comma-separated rates, msg/s (default 2000,20000)"
    )
    parser.add_argument(
        "--seconds", type=float, default=20.0, help="seconds of schedule per run (default 20)"
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs of each side at each rate (default 1)")
    parser.add_argument("--no-bare", action="store_true", help="skip the bare paced loop")
    parser.add_argument(
        "--producer-path",
        choices=("auto", "direct", "client"),
        default=None,
        help="the simulator's producer path (default: the simulator's own default)",
    )
    parser.add_argument("--json", type=Path, default=Path("runs/bench-simulator-paced.json"))
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    extra = {} if args.producer_path is None else {"producer_path": args.producer_path}
    payloads = sample_payloads(24, 200)
    payload = sorted(payloads, key=len)[len(payloads) // 2]
    results: dict[str, list[dict]] = {"simulator": [], "bare_paced": []}

    def go(kafka: KafkaConfig) -> None:
        for rate in rates:
            for r in range(args.repeats):
                prefix = f"paced{uuid.uuid4().hex[:6]}-"
                topics = [f"{prefix}{k:04d}" for k in range(SENSORS)]
                sim = simulator(kafka, prefix, rate, args.seconds, extra)
                drop_topics(kafka, topics)
                results["simulator"].append(sim)
                print(line(f"run {r + 1}: simulator", sim), flush=True)
                if args.no_bare:
                    continue
                prefix = f"paced{uuid.uuid4().hex[:6]}-"
                topics = [f"{prefix}{k:04d}" for k in range(SENSORS)]
                ensure_topics(kafka, dict.fromkeys(topics, 1))
                bare = bare_paced(kafka, topics, payload, rate, args.seconds)
                drop_topics(kafka, topics)
                results["bare_paced"].append(bare)
                print(line(f"run {r + 1}: bare paced", bare), flush=True)

    if args.bootstrap:
        broker_note = args.bootstrap
        go(KafkaConfig(args.bootstrap))
    else:
        with local_broker(args.broker) as broker:
            broker_note = f"local {args.broker} at {broker.bootstrap}"
            go(KafkaConfig(broker.bootstrap))
    load = os.getloadavg()
    print(
        f"payload {len(payload)} bytes, {args.seconds:g} s per run, broker: {broker_note}, load average {load[0]:.1f}"
    )
    doc = {
        **results,
        "seconds": args.seconds,
        "fleet": {k: v for k, v in BASELINE.items() if k != "faults"},
        "broker": broker_note,
    }
    write_results(args.json, doc, load)
    return 0


if __name__ == "__main__":
    sys.exit(main())

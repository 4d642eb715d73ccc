"""Simulator maximum publish rate versus a bare confluent-kafka producer loop, on one broker in one run.

Usage::

    .venv/bin/python benchmarks/simulator_vs_bare.py [--messages 600000] [--repeats 2] [--bootstrap HOST:PORT]
                                                    [--sides bare,simulator] [--json runs/bench-simulator.json]

Five sides run in every round (``--sides`` picks some: the nightly gate runs ``bare,simulator``): the bare loop (no encoding, no ledger, no delivery callback), the bare loop
with a delivery callback that keeps each offset, the same plus the SHA-256 of every value (the per-message
work the ledger's ``offset`` and ``value_sha256`` columns demand of any producer, and nothing else), a bare
loop through the simulator's own producer (``simulator.rdkafka.DirectProducer``: librdkafka called from
compiled code, delivery reports taken as arrays, no encoding, no ledger), and the simulator. The first three
use confluent-kafka's ``Producer``. All use the simulator's producer settings (idempotent, acks=all, same
batching), the same topics' shape (sensors x partitions) and payloads of the same size (the bare loops send
a real update value of the median size, over and over; they test for the hash with one branch per message). The simulator runs
unthrottled (rate 0) with faults off and sessions long enough that almost every message is an update. All
rates are measured the same way: from the first message to the last acknowledgement (a bare loop: until
``flush`` returns; the simulator: until the latest ``acked_ts`` in its ledger), not the set-up before the
first message. The simulator's rate including the writing of its ledger and truth after the last
acknowledgement is reported beside it. Rounds repeat (bare, bare+dr, bare+dr+sha, bare direct, simulator, bare, ...) so
a neighbour's load hits every side alike; the best of each is compared, and the medians are printed beside.
Every side writes to topics of its own, deleted after it, so each starts on a broker holding no records.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from simulator import DEFAULT_PRODUCER, Simulator, SimulatorConfig, native
from simulator.model import SensorTable
from simulator.rdkafka import QUEUE_FULL, DirectProducer
from sotw import wire
from sotw.broker import BROKERS, local_broker
from sotw.kafka import KafkaConfig, ensure_topics, read_settings

#: Each side's name in ``--sides`` and its label in the summary, in the order a round runs them.
LABELS = {
    "bare": "bare producer loop",
    "bare_reports": "bare + delivery reports",
    "bare_ledger": "  + SHA-256 per value",
    "bare_direct": "bare direct (sim client)",
    "simulator": "simulator (updates)",
}
#: Each side's key in the JSON.
KEYS = {
    "bare": "bare",
    "bare_reports": "bare_with_delivery_reports",
    "bare_ledger": "bare_with_delivery_reports_and_sha256",
    "bare_direct": "bare_direct",
    "simulator": "simulator",
}


def broker_cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) the broker process has used so far; 0 when it is not ours to see."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drop_topics(kafka: KafkaConfig, topics: list[str]) -> None:
    """Delete a side's topics, so that every side writes to a broker holding the same data (none).

    A broker's work per message can grow with what it holds (more segments, more index to search), and the
    side that ran last in a round would pay most.
    """
    admin = AdminClient(kafka.client())
    for future in admin.delete_topics(topics, operation_timeout=30).values():
        future.result()


def write_results(path: Path, doc: dict, load: tuple[float, float, float]) -> None:
    """Write a benchmark's results as JSON, with the machine and the moment they were measured on."""
    doc = {
        **doc,
        "loadavg": load,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {path}")


def started() -> tuple[float, float, float]:
    """Wall clock, process CPU and this thread's CPU, now: ``costs`` takes it."""
    return time.perf_counter(), time.process_time(), time.thread_time()


def costs(n: int, since: tuple[float, float, float]) -> dict:
    """Rate and CPU per message of a loop that sent ``n`` messages since ``since`` (from ``started``)."""
    elapsed = time.perf_counter() - since[0]
    return {
        "rate": n / elapsed,
        "cpu_us_per_msg": (time.process_time() - since[1]) / n * 1e6,
        "main_thread_us_per_msg": (time.thread_time() - since[2]) / n * 1e6,
        "elapsed_s": elapsed,
    }


def sample_payloads(sensors: int, rows: int) -> list[bytes]:
    """Real update values, as the simulator would encode them, to size the bare loop's payload."""
    rng = np.random.default_rng(0)
    table = SensorTable(rows, 4, rng, 0.05, 0.05)
    u = rng.random((2, 5000)).tolist()
    z = rng.standard_normal(5000).tolist()
    sid = "0007"
    session = f"{sid}-{uuid.uuid4().hex[:12]}-00001"
    out = []
    for j in range(5000):
        op, row = table.update(u[0][j], u[1][j], z[j])
        out.append(wire.encode_update(sid, session, 10_000 + j, 1_795_000_000_000 + j, op, row))
    return out


def bare(
    kafka: KafkaConfig,
    topics: list[str],
    partitions: int,
    payload: bytes,
    n: int,
    reports: bool = False,
    digests: bool = False,
) -> dict:
    """A plain produce loop: no encoding, no ledger. Returns rate and CPU cost.

    With ``reports`` every message carries a minimal delivery callback that keeps the offset, the least a
    producer that records offsets must pay; without it no callback runs at all. ``digests`` also keeps the
    SHA-256 of every value sent: with both, the loop does the per-message work the ledger's ``offset`` and
    ``value_sha256`` columns demand of any producer (issue 3, section 6), and nothing else -- the floor of
    the simulator's cost, short of generating and encoding its messages.
    """
    conf = kafka.client(**{k: v for k, v in DEFAULT_PRODUCER.items() if k not in kafka.settings})
    producer = Producer(conf)
    produce, poll = producer.produce, producer.poll
    offsets: list[int] = []
    keep = offsets.append

    def on_delivery(err, msg):
        keep(msg.offset())

    cb = on_delivery if reports else None
    kept: list[bytes] = []
    keep_digest, sha256 = kept.append, hashlib.sha256
    keys = [f"{t}-key".encode() for t in topics]
    slots = [(topics[i % len(topics)], keys[i % len(topics)], i % partitions) for i in range(4096)]
    since = started()
    for i in range(n):
        topic, key, part = slots[i & 4095]
        if digests:
            keep_digest(sha256(payload).digest())
        try:
            produce(topic, payload, key, part, cb)
        except BufferError:
            while True:
                poll(0.01)
                try:
                    produce(topic, payload, key, part, cb)
                    break
                except BufferError:
                    continue
        if not i & 1023:
            poll(0)
    left = producer.flush(60)
    out = costs(n, since)
    if left:
        raise SystemExit(f"bare loop: {left} messages not acknowledged")
    return out


def bare_direct(kafka: KafkaConfig, topics: list[str], partitions: int, payload: bytes, n: int) -> dict:
    """A plain produce loop through the simulator's producer: slices of 256 from one buffer, reports taken.

    The same client path as the simulator's loop (``DirectProducer.produce_run``, a ``poll`` and a ``take``
    per slice) with nothing else: no planning, no encoding, no ledger. The offsets are kept, as ``bare`` with
    ``reports`` keeps them.
    """
    producer = DirectProducer(
        kafka.client(**{k: v for k, v in DEFAULT_PRODUCER.items() if k not in kafka.settings})
    )
    block = 4096
    handles = np.array([producer.topic(t) for t in topics], dtype=np.int64)
    keys_list = [f"{t}-key".encode() for t in topics]
    keys = np.frombuffer(b"".join(keys_list), dtype=np.uint8).copy()
    key_at = np.zeros(len(topics) + 1, dtype=np.int64)
    key_at[1:] = np.cumsum([len(k) for k in keys_list])
    kidx = np.arange(block, dtype=np.int64) % len(topics)
    text = np.frombuffer((payload + b"\n") * block, dtype=np.uint8).copy()
    bounds = np.arange(0, len(text) + 1, len(payload) + 1, dtype=np.int64)
    arrays = [
        handles[kidx],
        (np.arange(block) % partitions).astype(np.int32),
        text,
        bounds,
        keys,
        key_at,
        kidx,
    ]
    stamps = np.zeros(block)  # when each message was queued: the simulator's sent_ts; unused here
    reports: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # rows, offsets, error codes
    keep = reports.append
    since = started()
    sent = 0
    while sent < n:
        m = min(block, n - sent)
        rows = np.arange(sent, sent + block, dtype=np.int64)
        i = 0
        while i < m:
            j = min(m, i + 256)
            while i < j:
                i, err = producer.produce_run([*arrays, rows, stamps], i, j)
                if err and err != QUEUE_FULL:
                    raise SystemExit(f"bare direct loop: error {err}")
                if err:
                    producer.poll(0.01)
                    keep(producer.take())
            producer.poll(0)
            keep(producer.take())
        sent += m
    while producer.flush(1.0):
        keep(producer.take())
    keep(producer.take())
    out = costs(n, since)
    producer.close()
    acknowledged = sum(int(np.count_nonzero(codes == 0)) for _, _, codes in reports)
    if acknowledged != n:
        raise SystemExit(f"bare direct loop: {n - acknowledged} messages not acknowledged")
    return out


def simulator(kafka: KafkaConfig, prefix: str, sensors: int, partitions: int, rows: int, n: int) -> dict:
    """The simulator at full speed, faults off. Returns rates and lateness."""
    run_dir = Path(tempfile.mkdtemp(prefix="sotw-bench-")) / f"run-{uuid.uuid4().hex[:8]}"
    cfg = SimulatorConfig(
        sensors=sensors,
        rows=rows,
        partitions=partitions,
        topic_prefix=prefix,
        rate=0,
        duration_s=None,
        max_messages=n,
        session_interval_s=3600,
        seed=1,
    )
    sim = Simulator(cfg, kafka, run_dir)
    c0 = time.process_time()
    m0 = time.thread_time()
    summary = sim.run()
    cpu = time.process_time() - c0
    main = time.thread_time() - m0
    # From the schedule's start (setting up -- broker check, Faker, tables, topics -- is not publishing) to
    # the last acknowledgement, as the bare loop is timed; and to the end of the run (ledger and truth written).
    last_ack = pc.max(pq.read_table(run_dir / "ledger", columns=["acked_ts"])["acked_ts"]).as_py()
    elapsed = (last_ack - summary.started_ms) / 1000.0
    whole = (summary.ended_ms - summary.started_ms) / 1000.0
    shutil.rmtree(run_dir.parent, ignore_errors=True)
    if summary.unacknowledged or summary.stats.failed:
        raise SystemExit(f"simulator: {summary.unacknowledged} unacknowledged, {summary.stats.failed} failed")
    updates = summary.stats.sent - sensors * 2  # snapshots and closing ends are not updates
    return {
        "sent": summary.stats.sent,
        "rate": summary.stats.sent / elapsed,
        "updates_per_s": updates / elapsed,
        "elapsed_s": elapsed,
        "updates_per_s_with_records": updates / whole,
        "elapsed_with_records_s": whole,
        "cpu_us_per_msg": cpu / summary.stats.sent * 1e6,
        "main_thread_us_per_msg": main / summary.stats.sent * 1e6,
        "lateness_p99_ms": summary.stats.lateness_p99_ms,
    }


#: The planted slowdown's helper: for each pause it is sent, it waits until the simulator's process has
#: stopped itself, lets that pause pass, and wakes it (a process cannot wake itself from SIGSTOP). However it
#: ends (a Ctrl-C to the process group, a SIGTERM, an error), it wakes the simulator first: left stopped, the
#: benchmark would hang until killed.
WAKER = """
import os, signal, sys, time
pid = int(sys.argv[1])
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
try:
    for line in sys.stdin:
        while open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "T":
            time.sleep(0.0005)
        time.sleep(float(line))
        os.kill(pid, signal.SIGCONT)
finally:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass
"""


def plant_slowdown(fraction: float) -> None:
    """Make the simulator ``fraction`` slower (a planted regression): its whole process stops, now and then, for
    ``fraction`` of the time since its first stretch of updates, as a host or runtime that stalls it would.

    After each stretch it sends, once the stop owed passes 20 ms, the process stops itself (SIGSTOP) and a
    helper process wakes it when that time is over; the time it was actually stopped is what counts. Every
    thread stops, librdkafka's and the ledger's too, so nothing catches up meanwhile. A sleep of the loop
    thread alone would not do: while it sleeps, the producer's queue drains and the other threads and the
    broker take its core, and a sleep planted as 25 % measures about 12 % slower with 2,000,000 messages.
    """
    import signal
    import subprocess

    from simulator.sender import Sender

    waker = subprocess.Popen(
        [sys.executable, "-c", WAKER, str(os.getpid())], stdin=subprocess.PIPE, text=True
    )
    send = Sender.send_stretch
    clocks: weakref.WeakKeyDictionary[Sender, list[float]] = weakref.WeakKeyDictionary()

    def slower(self: Sender, *args: Any, **kwargs: Any) -> None:
        clock = clocks.setdefault(self, [time.perf_counter(), 0.0])  # one run's first stretch, time stopped
        send(self, *args, **kwargs)
        owed = (time.perf_counter() - clock[0]) * fraction - clock[1]
        if owed > 0.02:
            if waker.poll() is not None or waker.stdin is None:
                raise SystemExit(f"the planted slowdown's helper exited ({waker.returncode}): not stopping")
            waker.stdin.write(f"{owed}\n")
            waker.stdin.flush()
            stopped = time.perf_counter()
            os.kill(os.getpid(), signal.SIGSTOP)
            clock[1] += time.perf_counter() - stopped

    Sender.send_stretch = slower  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap", help="use this Kafka cluster instead of starting a local broker")
    parser.add_argument(
        "--kafka-config", type=Path, default=None, help="librdkafka settings file for --bootstrap (SASL, TLS)"
    )
    parser.add_argument("--broker", choices=BROKERS, default="kafka", help="the local broker (default kafka)")
    parser.add_argument("--messages", type=int, default=600_000, help="messages per run (default 600000)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each side (default 2)")
    parser.add_argument("--sensors", type=int, default=24)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--json", type=Path, default=Path("runs/bench-simulator-vs-bare.json"))
    parser.add_argument(
        "--sides",
        default=",".join(LABELS),
        help=f"the sides to run, comma-separated, in their order (default all: {','.join(LABELS)})",
    )
    # The nightly gate's self-test: the simulator's sending made this fraction slower (0.25: 25 % slower).
    parser.add_argument("--plant-slowdown", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sides = [side.strip() for side in args.sides.split(",") if side.strip()]
    unknown = sorted(set(sides) - set(LABELS))
    if unknown or not sides:
        parser.error(
            f"--sides: no side {unknown[0] if unknown else '(none given)'!r}: choose from {', '.join(LABELS)}"
        )
    sides = [side for side in LABELS if side in sides]
    if args.plant_slowdown > 0:
        plant_slowdown(args.plant_slowdown)
    # Import what the simulator's set-up imports lazily (Arrow compute pulls in pandas: ~1 s of CPU), so the
    # CPU-per-message figures measure publishing, not the first run's imports.
    import pyarrow.compute as pc
    from faker import Faker

    pc.if_else(pc.equal(1, 1), 1, 2)
    Faker()
    # ... and the compiled kernels, which a fresh checkout (a nightly's baseline) compiles on first use.
    warm = SensorTable(args.rows, 4, np.random.default_rng(0), 0.05, 0.05).store
    warm.warm_up()
    warm.encoder().warm_up()
    native.search_right(np.zeros(1), np.zeros(0))

    payloads = sample_payloads(args.sensors, args.rows)
    sizes = sorted(len(p) for p in payloads)
    payload = payloads[[len(p) for p in payloads].index(sizes[len(sizes) // 2])]

    def go(kafka: KafkaConfig, broker_pid: int | None = None) -> dict:
        results: dict[str, list] = {side: [] for side in LABELS}

        def timed(side: str, fn: Any, *fargs: Any, **kw: Any) -> dict:
            """Run one side and add the broker's CPU per message during it (local broker only)."""
            b0 = broker_cpu_s(broker_pid)
            out: dict = fn(*fargs, **kw)
            sent = out.get("sent", args.messages)
            out["broker_cpu_us_per_msg"] = (
                (broker_cpu_s(broker_pid) - b0) / sent * 1e6 if broker_pid else None
            )
            results[side].append(out)
            return out

        def fresh_topics() -> tuple[str, list[str]]:
            prefix = f"bench{uuid.uuid4().hex[:6]}-sensor-"
            return prefix, [f"{prefix}{k:04d}" for k in range(args.sensors)]

        bares: list[tuple[str, str, Any, dict]] = [
            ("bare", "bare     ", bare, {}),
            ("bare_reports", "bare+dr  ", bare, {"reports": True}),
            ("bare_ledger", "bare+dr+sha", bare, {"reports": True, "digests": True}),
            ("bare_direct", "bare direct", bare_direct, {}),
        ]
        for r in range(args.repeats):
            for side, label, loop, options in bares:
                if side not in sides:
                    continue
                _, topics = fresh_topics()
                ensure_topics(kafka, dict.fromkeys(topics, args.partitions))
                b = timed(side, loop, kafka, topics, args.partitions, payload, args.messages, **options)
                drop_topics(kafka, topics)
                print(
                    f"  run {r + 1}: {label} {b['rate']:12,.0f} msg/s  {b['cpu_us_per_msg']:6.2f} CPU us/msg "
                    f"({b['main_thread_us_per_msg']:.2f} in the loop's thread; "
                    f"broker {b['broker_cpu_us_per_msg'] or 0:.2f})",
                    flush=True,
                )
            if "simulator" not in sides:
                continue
            prefix, topics = fresh_topics()
            sim = timed(
                "simulator", simulator, kafka, prefix, args.sensors, args.partitions, args.rows, args.messages
            )
            drop_topics(kafka, topics)
            print(
                f"  run {r + 1}: simulator {sim['rate']:12,.0f} msg/s  {sim['cpu_us_per_msg']:6.2f} CPU us/msg "
                f"({sim['main_thread_us_per_msg']:.2f} in the loop's thread; "
                f"broker {sim['broker_cpu_us_per_msg'] or 0:.2f}) "
                f"({sim['updates_per_s']:,.0f} updates/s; {sim['updates_per_s_with_records']:,.0f} with the "
                "ledger written)",
                flush=True,
            )
        return results

    if args.bootstrap:
        broker_note = args.bootstrap
        settings = read_settings(args.kafka_config) if args.kafka_config else {}
        results = go(KafkaConfig(args.bootstrap, settings))
    else:
        with local_broker(args.broker) as broker:
            broker_note = f"local {args.broker} at {broker.bootstrap}"
            results = go(KafkaConfig(broker.bootstrap), next(iter(broker.pids.values()), None))

    load = os.getloadavg()
    rate = {"simulator": "updates_per_s"}  # the simulator's snapshots and closing ends are not updates
    best = {k: max(r[rate.get(k, "rate")] for r in v) for k, v in results.items() if v}
    med = {k: statistics.median(r[rate.get(k, "rate")] for r in v) for k, v in results.items() if v}
    print()
    print(f"{'':24}{'best msg/s':>14}{'median msg/s':>14}")
    for side, label in LABELS.items():
        if side in best:
            print(f"{label:24}{best[side]:14,.0f}{med[side]:14,.0f}")
    doc: dict[str, Any] = {
        "messages": args.messages,
        "payload_bytes": len(payload),
        "sensors": args.sensors,
        "partitions": args.partitions,
        "broker": broker_note,
        "sides": list(sides),
        **{KEYS[side]: results[side] for side in sides},
        **{f"best_{KEYS[side]}": best[side] for side in sides if side != "simulator"},
        "targets": {"updates_per_s": 100_000, "ratio": 0.6},
    }
    if "simulator" in best:
        whole = [s["updates_per_s_with_records"] for s in results["simulator"]]
        print(f"{'  incl. ledger written':24}{max(whole):14,.0f}{statistics.median(whole):14,.0f}")
        doc["best_simulator_updates_per_s"] = best["simulator"]
        doc["best_simulator_updates_per_s_with_records"] = max(whole)
        for side, key, label in [
            ("bare", "ratio", "ratio simulator / bare"),
            ("bare_reports", "ratio_to_bare_with_delivery_reports", "ratio sim / bare+dr"),
            ("bare_direct", "ratio_to_bare_direct", "ratio sim / bare direct"),
        ]:
            if side in best:
                doc[key] = best["simulator"] / best[side]
                print(f"{label:24}{doc[key]:14.2f}")
        if "bare" in best:
            doc["ratio_of_medians"] = med["simulator"] / med["bare"]
            print(f"{'ratio of medians':24}{doc['ratio_of_medians']:14.2f}")
    if "bare_ledger" in best and "bare" in best:
        doc["ratio_bare_with_delivery_reports_and_sha256"] = best["bare_ledger"] / best["bare"]
        print(f"{'ratio bare+dr+sha / bare':24}{doc['ratio_bare_with_delivery_reports_and_sha256']:14.2f}")
    if "simulator" in best and "bare" in best:
        # What the loop's own thread costs per message: the rate each side could reach with a core to itself
        # (an upper bound; the broker and librdkafka's threads need the other core).
        sim_thread = min(s["main_thread_us_per_msg"] for s in results["simulator"])
        bare_thread = min(b["main_thread_us_per_msg"] for b in results["bare"])
        doc["best_main_thread_us_per_msg"] = {"bare": bare_thread, "simulator": sim_thread}
        print(
            f"loop thread CPU per message (best): bare {bare_thread:.2f} us, simulator {sim_thread:.2f} us "
            f"-> simulator ceiling with a core of its own {1e6 / sim_thread:,.0f} msg/s"
        )
    print(
        f"payload {len(payload)} bytes, {args.messages:,} messages per run, {args.sensors} topics x "
        f"{args.partitions} partitions, broker: {broker_note}, load average {load[0]:.1f}"
    )
    write_results(args.json, doc, load)
    return 0


if __name__ == "__main__":
    sys.exit(main())

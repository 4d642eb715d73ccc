"""The cost of SASL and TLS: publishing and reading rates on a plaintext and a SASL_SSL broker, in one run.

Usage::

    .venv/bin/python benchmarks/tls_cost.py [--messages 300000] [--repeats 2] [--json runs/bench-tls-cost.json]

Two local brokers run side by side, one node each, alike but for security: ``plaintext`` and ``sasl_ssl``
(SCRAM-SHA-512 over TLS, as ``sotw broker --security sasl_ssl`` makes it). A team asks what securing its cluster
costs the load sotw can put on it and the rate its pipeline can read at; the answer is a ratio measured here,
not a figure from elsewhere. Each round runs, on each broker in turn (so a neighbour's load hits both alike):

* ``bare producer``: a confluent-kafka produce loop with the simulator's producer settings (the client ceiling,
  ``simulator_vs_bare.bare``);
* ``simulator``: the simulator unthrottled, faults off (``simulator_vs_bare.simulator``);
* ``bare consumer``: one assign-only consumer draining a backlog (``source_throughput.bare``);
* ``source reader``: the ``sotw-kafka`` source's own reader draining the same backlog into Arrow batches, no
  Spark (``source_throughput.reader``): what the pipeline's executors do per message.

The best of each side's rounds is compared (``sasl_ssl / plaintext``); the broker's CPU per message is printed
beside each producing side, since TLS costs the broker too. Every side uses topics of its own, deleted after it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import source_throughput  # noqa: E402
from simulator_vs_bare import (  # noqa: E402
    bare,
    broker_cpu_s,
    drop_topics,
    sample_payloads,
    simulator,
    write_results,
)

from sotw.broker import local_broker  # noqa: E402
from sotw.kafka import EndOffsets, KafkaConfig, ensure_topics  # noqa: E402

SECURITIES = ("plaintext", "sasl_ssl")
SIDES = ("bare_producer", "simulator", "bare_consumer", "source_reader")


def one_round(
    kafka: KafkaConfig, pid: int | None, args: argparse.Namespace, payload: bytes
) -> dict[str, float]:
    """Each side once on one broker: its rate (msg/s; the simulator's counts every message it sent)."""
    out: dict[str, float] = {}
    prefix = f"tls{uuid.uuid4().hex[:6]}-"
    topics = [f"{prefix}{k:04d}" for k in range(args.sensors)]
    ensure_topics(kafka, dict.fromkeys(topics, args.partitions))
    b0 = broker_cpu_s(pid)
    got = bare(kafka, topics, args.partitions, payload, args.messages)
    out["bare_producer"] = got["rate"]
    out["bare_producer_broker_us"] = (broker_cpu_s(pid) - b0) / args.messages * 1e6
    drop_topics(kafka, topics)

    sim_prefix = f"tls{uuid.uuid4().hex[:6]}-sensor-"
    b0 = broker_cpu_s(pid)
    sim = simulator(kafka, sim_prefix, args.sensors, args.partitions, args.rows, args.messages)
    out["simulator"] = sim["rate"]
    out["simulator_broker_us"] = (broker_cpu_s(pid) - b0) / sim["sent"] * 1e6
    drop_topics(kafka, [f"{sim_prefix}{k:04d}" for k in range(args.sensors)])

    backlog = [f"{prefix}read-{k:02d}" for k in range(args.topics)]
    ensure_topics(kafka, dict.fromkeys(backlog, 1))
    source_throughput.fill(kafka, backlog, args.messages)
    ends = EndOffsets(kafka)([(t, 0) for t in backlog])
    out["bare_consumer"] = source_throughput.bare(kafka, ends)
    out["source_reader"] = source_throughput.reader(kafka, f"{prefix}read-.*", ends)["msg_s"]
    drop_topics(kafka, backlog)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=300_000, help="messages per side and round (300000)")
    parser.add_argument("--repeats", type=int, default=2, help="rounds on each broker (2)")
    parser.add_argument("--sensors", type=int, default=24, help="the producers' topics (24)")
    parser.add_argument("--partitions", type=int, default=3, help="partitions of each producer topic (3)")
    parser.add_argument("--rows", type=int, default=200, help="rows of a sensor's table (200)")
    parser.add_argument("--topics", type=int, default=20, help="topics of the backlog the readers drain (20)")
    parser.add_argument("--json", type=Path, default=Path("runs/bench-tls-cost.json"))
    args = parser.parse_args(argv)
    payloads = sample_payloads(args.sensors, args.rows)
    payload = sorted(payloads, key=len)[len(payloads) // 2]
    rounds: dict[str, list[dict[str, float]]] = {s: [] for s in SECURITIES}
    with ExitStack() as stack:
        brokers = {s: stack.enter_context(local_broker(security=s)) for s in SECURITIES}
        for r in range(args.repeats):
            for security, broker in brokers.items():
                pid = next(iter(broker.pids.values()), None)
                got = one_round(broker.kafka_config(), pid, args, payload)
                rounds[security].append(got)
                print(
                    f"round {r + 1} {security:>9}: "
                    + ", ".join(f"{side} {got[side]:,.0f} msg/s" for side in SIDES)
                    + f" (broker CPU us/msg: bare {got['bare_producer_broker_us']:.2f}, "
                    f"simulator {got['simulator_broker_us']:.2f})",
                    flush=True,
                )
    best = {s: {side: max(r[side] for r in rounds[s]) for side in SIDES} for s in SECURITIES}
    broker_us = {
        s: {k: min(r[k] for r in rounds[s]) for k in ("bare_producer_broker_us", "simulator_broker_us")}
        for s in SECURITIES
    }
    print(f"\n{'best msg/s':18}{'plaintext':>14}{'sasl_ssl':>14}{'ratio':>8}")
    ratios: dict[str, float] = {}
    for side in SIDES:
        ratios[side] = best["sasl_ssl"][side] / best["plaintext"][side]
        print(f"{side:18}{best['plaintext'][side]:14,.0f}{best['sasl_ssl'][side]:14,.0f}{ratios[side]:8.2f}")
    for key in ("bare_producer_broker_us", "simulator_broker_us"):
        print(
            f"{key:28}{broker_us['plaintext'][key]:8.2f}{broker_us['sasl_ssl'][key]:14.2f} (least, CPU us/msg)"
        )
    doc: dict[str, Any] = {
        "command": "benchmarks/tls_cost.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "messages": args.messages,
        "rounds": rounds,
        "best": best,
        "ratio_sasl_ssl_to_plaintext": ratios,
        "broker_cpu_us_per_msg": broker_us,
    }
    write_results(args.json, doc, os.getloadavg())
    return 0


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"took {time.monotonic() - started:.0f} s")
    sys.exit(code)

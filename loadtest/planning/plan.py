"""``sotw plan``: how many executor cores, Kafka partitions and brokers a fleet needs, from measurements.

``sotw plan measure`` measures, on this machine and on a real standalone cluster started here:

* **cost per micro-batch** at 1 and 2 executor cores (``local[1]``, ``local[2]``, and the standalone cluster with
  ``spark.cores.max`` 1 and 2): the same backlog drained twice, with small and with large batches; a straight
  line through every batch's (messages, seconds) gives a fixed cost per batch ``F`` and a cost per message ``c``,
  each with its standard error;
* **one partition**: a backlog in a single Kafka partition drained alone, the rate one partition carries;
* **broker cost per message**: a local Kafka broker's CPU while the backlog is written and while it is read;
* **memory per active session**: the state store's memory over its sessions at the end of the large-batch drain.

``sotw plan --sensors N --rate R --p99 X`` then answers with a model of a continuously triggered query: at rate
``R`` a batch interval ``B`` carries ``R B`` messages and takes ``p = F + c R B``, so ``B = max(trigger, F / (1 -
c R))`` and a message waits at most ``B`` to be read and ``p`` to be written: end-to-end p99 ~ ``B + p``. More
cores divide ``c`` by ``1 + (k - 1) e``, with the parallel efficiency ``e`` (the speed-up from 1 to 2 cores,
less one) measured between 1 and 2 cores; ``F``
does not shrink. The answer states every measurement and assumption behind it, and a range from the pessimistic
and optimistic ends of the measurements (two standard errors each way). ``--check`` compares the model with a
rate ``sotw capacity`` measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.errors import HarnessError
from loadtest.planning.costs import Measurements
from loadtest.planning.measure import drain_once, measure
from loadtest.run.profile import load_profile
from sotw.broker.security import SECURITY_MODES

#: Where ``sotw plan measure`` writes its measurements and ``sotw plan`` reads them unless told otherwise.
MEASUREMENTS = Path("runs/plan/measurements.json")

# ------------------------------------------------------------------------------------------------ the model


@dataclass(frozen=True)
class Steady:
    """A continuously triggered query at one rate: batch interval, batch time, end-to-end p99 (seconds)."""

    interval_s: float
    batch_s: float
    p99_s: float

    @property
    def sustainable(self) -> bool:
        """Whether it keeps up at all."""
        return math.isfinite(self.p99_s)


def steady(fixed_s: float, per_message_s: float, rate: float, trigger_s: float) -> Steady:
    """The steady state of a query costing ``fixed_s + per_message_s x n`` per batch at ``rate`` msg/s."""
    load = per_message_s * rate
    if load >= 1.0:
        return Steady(math.inf, math.inf, math.inf)
    interval = max(trigger_s, fixed_s / (1.0 - load))
    batch = fixed_s + load * interval
    return Steady(interval, batch, interval + batch)


def per_message(meas: Measurements, cores: int, kind: str, bound: float = 0.0) -> tuple[float, float]:
    """(cost per message on ``cores`` cores, the fixed cost) at ``bound`` standard errors (+ pessimistic)."""
    one, two = meas.cost(kind, 1), meas.cost(kind, 2)
    if one is None or two is None:
        raise HarnessError(f"the measurements have no {kind} runs at 1 and 2 cores: measure again")
    # A cost per message lost in the noise is taken as one standard error: never free, never negative.
    c1 = max(one.per_message_s, one.per_message_se) + bound * one.per_message_se
    c2 = max(two.per_message_s, two.per_message_se) + bound * two.per_message_se
    c1, c2 = max(c1, 1e-9), max(c2, 1e-9)
    # The second core's share of a whole core: the speed-up from 1 to 2 cores, less one.
    efficiency = min(1.0, max(0.05, c1 / c2 - 1.0 if c2 > 0 else 1.0))
    fixed = max(one.fixed_s + bound * one.fixed_se, two.fixed_s + bound * two.fixed_se, 0.0)
    return c1 / (1 + (cores - 1) * efficiency), fixed


def cores_for(
    meas: Measurements, rate: float, p99_s: float, trigger_s: float, kind: str, bound: float
) -> int | None:
    """The fewest executor cores that keep end-to-end p99 within ``p99_s`` at ``rate``; None past 4,096."""
    cores = 1
    while cores <= 4096:
        c, fixed = per_message(meas, cores, kind, bound)
        if steady(fixed, c, rate, trigger_s).p99_s <= p99_s:
            return cores
        cores = cores + 1 if cores < 16 else int(cores * 1.25)
    return None


def max_rate(
    meas: Measurements, cores: int, p99_s: float, trigger_s: float, kind: str, bound: float
) -> float:
    """The highest rate ``cores`` cores sustain within ``p99_s`` (bisection on the model)."""
    c, fixed = per_message(meas, cores, kind, bound)
    low, high = 0.0, 1.0 / c
    for _ in range(60):
        mid = (low + high) / 2
        if steady(fixed, c, mid, trigger_s).p99_s <= p99_s:
            low = mid
        else:
            high = mid
    return low


@dataclass(frozen=True)
class Fleet:
    """What the plan is asked about."""

    sensors: int
    rate: float
    p99_s: float
    trigger_s: float = 1.0
    rows: int = 200
    replication: int = 3
    broker_cores: int = 4
    broker_utilisation: float = 0.5
    kind: str = "standalone"

    def __post_init__(self) -> None:
        if self.sensors < 1 or self.rate <= 0 or self.p99_s <= 0:
            raise HarnessError("plan needs --sensors >= 1, --rate > 0 and --p99 > 0")
        if self.p99_s <= self.trigger_s:
            raise HarnessError(
                f"an end-to-end p99 of {self.p99_s:g} s cannot be met with a {self.trigger_s:g} s trigger: a message "
                "waits up to one trigger before it is read; lower --trigger or raise --p99"
            )


def plan(meas: Measurements, fleet: Fleet) -> dict[str, Any]:
    """The plan: cores (with its range), partitions, brokers, memory, and what they rest on."""
    central = cores_for(meas, fleet.rate, fleet.p99_s, fleet.trigger_s, fleet.kind, 0.0)
    optimistic = cores_for(meas, fleet.rate, fleet.p99_s, fleet.trigger_s, fleet.kind, -2.0)
    pessimistic = cores_for(meas, fleet.rate, fleet.p99_s, fleet.trigger_s, fleet.kind, 2.0)
    cores = central or 0
    per_partition = meas.partition_rate
    partitions = max(cores, math.ceil(2 * fleet.rate / per_partition)) if per_partition > 0 else cores
    broker_us = meas.broker_produce_us * fleet.replication + meas.broker_consume_us
    broker_cpu = fleet.rate * broker_us / 1e6
    brokers = max(fleet.replication, math.ceil(broker_cpu / (fleet.broker_cores * fleet.broker_utilisation)))
    rows_scale = fleet.rows / meas.backlog.get("rows", fleet.rows)
    state_mb = fleet.sensors * meas.state_bytes_per_session * rows_scale / 2**20
    c, fixed = per_message(meas, max(cores, 1), fleet.kind)
    at = steady(fixed, c, fleet.rate, fleet.trigger_s)
    return {
        "fleet": dataclasses.asdict(fleet),
        "executor_cores": central,
        "executor_cores_range": [optimistic, pessimistic],
        "kafka_partitions": partitions,
        "state_partitions": max(cores, 2),
        "brokers": brokers,
        "broker_cpu_cores": broker_cpu,
        "state_memory_mb": state_mb,
        "predicted": dataclasses.asdict(at),
        "per_message_s": c,
        "fixed_s": fixed,
    }


def _seconds(text: str) -> float:
    from pipeline.config import parse_trigger

    ms = parse_trigger(text)
    if not ms:
        raise HarnessError(f"--trigger must be a duration such as 1s or 500ms, got {text!r}")
    return ms / 1000.0


def plan_text(meas: Measurements, fleet: Fleet, answer: dict[str, Any], source: Path) -> str:
    """The plan as a report: the answer, then the measurements and assumptions it rests on."""
    low, high = answer["executor_cores_range"]
    cores = answer["executor_cores"]
    pred = answer["predicted"]

    def n(v: int | None) -> str:
        return "more than 4,096" if v is None else f"{v:,}"

    lines = [
        f"# Capacity plan: {fleet.sensors:,} sensors, {fleet.rate:,.0f} msg/s, end-to-end p99 <= {fleet.p99_s:g} s",
        "",
        f"- executor cores: **{n(cores)}** (range {n(low)} to {n(high)} over the measurements' uncertainty, two "
        "standard errors each way)",
        f"- Kafka partitions: **{answer['kafka_partitions']:,}** (at least one per core, and each partition at most "
        + (
            f"half the {meas.partition_rate:,.0f} msg/s one partition carried"
            if meas.partition_rate > 0
            else "half of one partition's rate, which the measurements did not resolve: measure again"
        )
        + "); state partitions "
        f"(--shuffle-partitions): {answer['state_partitions']:,}",
        f"- brokers: **{answer['brokers']:,}** ({answer['broker_cpu_cores']:.2f} cores of broker CPU at "
        f"{meas.broker_produce_us:.1f} us/msg written x replication {fleet.replication} + "
        f"{meas.broker_consume_us:.1f} us/msg read; {fleet.broker_cores} cores per broker at most "
        f"{fleet.broker_utilisation:.0%} busy; never fewer than the replication factor)",
        f"- state memory: about {answer['state_memory_mb']:,.1f} MB in all ({meas.state_bytes_per_session:,.0f} bytes "
        f"per active session measured at {meas.backlog.get('rows', 0):g} rows, scaled to {fleet.rows} rows)",
        f"- predicted with {n(cores)} cores: batch every {pred['interval_s']:.2f} s taking {pred['batch_s']:.2f} s, "
        f"end-to-end p99 about {pred['p99_s']:.2f} s",
        "",
        f"## Measurements ({source}, {meas.taken_utc}{', PROVISIONAL: measured on a shared machine' if meas.provisional else ''})",
        "",
        f"Machine: {', '.join(f'{k} {v}' for k, v in meas.machine.items())}. Backlog: "
        f"{', '.join(f'{k} {v:g}' for k, v in meas.backlog.items())}. Command: `{meas.command}`.",
        "",
        "| set-up | master | cores | fixed cost per batch | cost per message | rate without the fixed cost | batches |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for c in meas.costs:
        lines.append(
            f"| {c.setup} | {c.master} | {c.cores} | {c.fixed_s:.3f} +/- {c.fixed_se:.3f} s | "
            f"{c.per_message_s * 1e6:.1f} +/- {c.per_message_se * 1e6:.1f} us | {c.rate:,.0f} msg/s | {len(c.points)} |"
        )
    vague = [c.setup for c in meas.costs if c.per_message_s < 2 * c.per_message_se]
    if vague:
        lines += [
            "",
            f"**Unresolved:** on {', '.join(vague)} the cost per message is within two standard errors of zero (the "
            "batch times' noise hides it); the plan takes it as one standard error. Measure again on a quieter "
            "machine, or with more messages (`sotw plan measure --messages 240000`).",
        ]
    lines += [
        "",
        "## Assumptions",
        "",
        f"- The {fleet.kind} set-up's cost per message divides by 1 + (cores - 1) x e, with e the speed-up "
        "from 1 to 2 cores less one (measured); the fixed cost per batch (planning, the checkpoint, task "
        "start-up) does not shrink with cores. Beyond the 2 cores measured this is an extrapolation.",
        "- End-to-end p99 ~ one batch interval (waiting to be read) + one batch time; the trigger is "
        f"{fleet.trigger_s:g} s.",
        "- One active session per sensor at a time; state memory is linear in the rows of a session's table.",
        "- The broker's cost was measured on one local Kafka node; with replication, writing a message costs "
        "each replica about the same again.",
        "- The messages are the simulator's: the same size and mix of snapshots and updates as the backlog.",
    ]
    return "\n".join(lines) + "\n"


def check_text(meas: Measurements, capacity_results: Path, kind: str) -> tuple[str, bool]:
    """The model's maximum rate against one ``sotw capacity`` measured, and whether it lies in the range."""
    from loadtest.reports.results import Results

    result = Results.from_json(capacity_results)
    cap = result.capacity
    if cap is None or not math.isfinite(cap.max_sustained_rate):
        raise HarnessError(f"{capacity_results} holds no sustained capacity: run `sotw capacity` first")
    p99 = cap.targets.get("max_end_to_end_p99_s", math.nan)
    trigger = _seconds(str(result.run.profile.get("pipeline", {}).get("trigger", "1s")))
    cores = int(result.run.host.get("cpus", 2))
    rates = [max_rate(meas, cores, p99, trigger, kind, b) for b in (0.0, 2.0, -2.0)]
    upper = cap.max_sustained_rate * (cap.lowest_broken_factor / cap.max_sustained_factor)
    measured = (cap.max_sustained_rate, upper if math.isfinite(upper) else cap.max_sustained_rate)
    inside = rates[1] <= measured[1] and measured[0] <= rates[2]
    text = (
        f"check against {capacity_results}: sotw capacity sustained {measured[0]:,.0f} msg/s (and broke at "
        f"{measured[1]:,.0f}) within p99 {p99:g} s on {cores} cores; the model predicts {rates[0]:,.0f} msg/s "
        f"(range {rates[1]:,.0f}-{rates[2]:,.0f}) for {kind} with {cores} cores: "
        + ("WITHIN the stated uncertainty" if inside else "OUTSIDE the stated uncertainty")
    )
    return text, inside


# ------------------------------------------------------------------------------------------- measuring


# ------------------------------------------------------------------------------------------------- the CLI


def build_parser() -> argparse.ArgumentParser:
    """The ``sotw plan`` argument parser."""
    p = argparse.ArgumentParser(
        prog="sotw plan",
        description="How many executor cores, Kafka partitions and brokers a fleet needs, from `sotw plan measure`'s "
        "measurements, with the assumptions and the uncertainty behind it (docs/capacity.md).",
    )
    p.add_argument("--sensors", type=int, required=True, help="sensors in the fleet")
    p.add_argument("--rate", type=float, required=True, help="messages per second of the whole fleet")
    p.add_argument("--p99", type=float, required=True, help="end-to-end p99 target, seconds")
    p.add_argument("--trigger", default="1s", help="the pipeline's trigger (1s)")
    p.add_argument("--rows", type=int, default=200, help="rows of a session's table (200)")
    p.add_argument("--replication", type=int, default=3, help="the topics' replication factor (3)")
    p.add_argument("--broker-cores", type=int, default=4, help="cores of one broker (4)")
    p.add_argument(
        "--on", choices=("standalone", "local"), default="standalone", help="which measurements scale"
    )
    p.add_argument(
        "--measurements",
        type=Path,
        default=MEASUREMENTS,
        help=f"sotw plan measure's output (default {MEASUREMENTS}, where it writes by default)",
    )
    p.add_argument(
        "--check", type=Path, default=None, help="a `sotw capacity` results.json to check the model against"
    )
    p.add_argument("--out", type=Path, default=None, help="also write the plan (Markdown) here")
    return p


def measure_main(argv: Sequence[str]) -> int:
    """``sotw plan measure``."""
    p = argparse.ArgumentParser(
        prog="sotw plan measure",
        description="Measure what `sotw plan` needs: batch costs at 1 and 2 cores on local and on a standalone "
        "cluster started here, one partition's rate, the broker's CPU per message, state memory per session.",
    )
    p.add_argument("--messages", type=int, default=60_000, help="backlog size (60000)")
    p.add_argument("--profile", default="baseline", help="the fleet and policy measured (baseline)")
    p.add_argument("--scenario", type=Path, default=None, help="scenario TOML (default: the shipped one)")
    p.add_argument(
        "--out",
        type=Path,
        default=MEASUREMENTS,
        help=f"where to write (default {MEASUREMENTS}, where sotw plan reads it)",
    )
    p.add_argument(
        "--security",
        choices=SECURITY_MODES,
        default="plaintext",
        help="the local broker's security, as `sotw broker --security` (plaintext): what TLS and SASL cost it",
    )
    args = p.parse_args(list(argv))
    work = args.out.parent / f"measure-{time.strftime('%Y%m%d-%H%M%S')}"
    profile = load_profile(args.profile, args.scenario)
    meas = measure(
        work,
        args.messages,
        profile,
        dict(os.environ),
        say=lambda m: print(m, flush=True),
        security=args.security,
    )
    meas.to_json(args.out)
    print(f"measurements: {args.out} (work directory {work})")
    return 0


def main(argv: Sequence[str]) -> int:
    """``sotw plan ...``, ``sotw plan measure ...``."""
    argv = list(argv)
    if argv and argv[0] == "measure":
        return measure_main(argv[1:])
    if argv and argv[0] == "drain_once":
        return drain_once(argv[1:])
    args = build_parser().parse_args(argv)
    meas = Measurements.from_json(args.measurements)
    fleet = Fleet(
        args.sensors, args.rate, args.p99, _seconds(args.trigger), args.rows, args.replication, args.broker_cores,
        kind=args.on,
    )  # fmt: skip
    answer = plan(meas, fleet)
    text = plan_text(meas, fleet, answer, args.measurements)
    ok = True
    if args.check is not None:
        line, ok = check_text(meas, args.check, "local")
        text += f"\n## Check against a measured point\n\n{line}\n"
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

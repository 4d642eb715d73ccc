"""The load-test harness's own CPU at 1x and 10x, against its targets.

Usage::

    nice -n 10 .venv/bin/python benchmarks/harness_overhead.py [--warmup 10] [--steady 30] [--loads 1 10]
                                                               [--json runs/bench-harness-overhead.json]

Runs the harness as ``sotw run`` does (``loadtest.run.runner.execute`` on the ``baseline`` profile: the local
Kafka broker, the pipeline as its own process, the simulator and the samplers in this process) with short phases,
once per load factor, and prints ``results.json``'s ``harness_overhead``: the CPU of the harness process over
the steady phase in % of one core, split into the simulator (its thread, its ledger writer and its producer's
librdkafka threads), the sampler (its thread and its probes' Kafka clients, and each probe's own Python time)
and the rest (the main loop), and the verifier's CPU seconds after the load.

Targets: simulator + harness at most 5 % of one core at 1x (2,000 msg/s) and 20 % at 10x (20,000 msg/s), with
the simulator's schedule lateness p99 no worse than before.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtest.run.profile import load_profile
from loadtest.run.runner import RunRequest, execute

TARGETS = {1.0: 5.0, 10.0: 20.0}  # % of one core for simulator + harness, by load factor


def measure(factor: float, warmup_s: float, steady_s: float) -> dict[str, Any]:
    """One run at ``factor``; its harness overhead, rate and schedule lateness."""
    profile = load_profile("baseline")
    profile = dataclasses.replace(
        profile, run=dataclasses.replace(profile.run, warmup_s=warmup_s, steady_s=steady_s)
    )
    run_dir = Path(tempfile.mkdtemp(prefix="sotw-bench-harness-")) / f"{factor:g}x"
    result = execute(RunRequest(profile, factor, run_dir))
    lateness = next((lat for lat in result.latency if lat.name == "schedule_lateness"), None)
    return {
        "load_factor": factor,
        "target_rate": result.figure("target_rate"),
        "produced_rate": result.figure("produced_rate"),
        "verdict": result.verdict.verdict,
        "schedule_lateness_p99_ms": lateness.p99 if lateness else None,
        "overhead": result.harness_overhead,
        "run_dir": str(run_dir),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--warmup", type=float, default=10.0, help="warm-up seconds (10)")
    parser.add_argument("--steady", type=float, default=30.0, help="steady-phase seconds (30)")
    parser.add_argument("--loads", type=float, nargs="+", default=[1.0, 10.0], help="load factors (1 10)")
    parser.add_argument("--json", type=Path, default=Path("runs/bench-harness-overhead.json"))
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    runs = [measure(factor, args.warmup, args.steady) for factor in args.loads]
    load_after = os.getloadavg()
    print()
    print(
        f"{'load':>5}{'msg/s':>9}{'simulator':>11}{'sampler':>9}{'other':>7}{'harness':>9}"
        f"{'sim+harness':>13}{'target':>8}{'lateness p99':>14}{'verifier':>10}"
    )
    for run in runs:
        o = run["overhead"]
        sim, harness = (
            o.get("simulator_cpu_percent", float("nan")),
            o.get("harness_cpu_percent", float("nan")),
        )
        target = TARGETS.get(run["load_factor"])
        lateness = run["schedule_lateness_p99_ms"]
        print(
            f"{run['load_factor']:>4g}x{run['produced_rate']:>9,.0f}{sim:>10.1f}%"
            f"{o.get('sampler_cpu_percent', float('nan')):>8.1f}%{o.get('other_cpu_percent', float('nan')):>6.1f}%"
            f"{harness:>8.1f}%{sim + harness:>12.1f}%{(f'{target:g}%' if target else '-'):>8}"
            f"{(f'{lateness:,.1f} ms' if lateness is not None else '-'):>14}{o.get('verifier_cpu_s', 0):>9.1f}s"
        )
        probes = ", ".join(
            f"{k.removeprefix('probe_').removesuffix('_cpu_percent')} {v:.2f}%"
            for k, v in o.items()
            if k.startswith("probe_")
        )
        print(f"      sampler thread by probe: {probes}")
    print(f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after; {os.cpu_count()} cores")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "runs": runs,
                "targets_percent_of_a_core": {f"{k:g}x": v for k, v in TARGETS.items()},
                "loadavg_before": load_before,
                "loadavg_after": load_after,
                "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What Locust itself costs while it drives the fleet, beside what the simulator it drives costs.

Usage::

    .venv/bin/python benchmarks/locust_overhead.py [--load 10] [--seconds 30] [--warm 10] [--profile baseline]
                                                  [--json runs/bench-locust.json]

Runs ``locust -f loadtest/locust/locustfile.py --headless --no-pipeline`` with the profile's fleet at ``--load``
(``--users-per-x`` users make 1x, so 10x is 100 users) on the local Kafka broker, without the pipeline: the
figure is Locust's share, not the machine's. After ``--warm`` seconds it measures, over ``--seconds``, the CPU
of three processes as a share of one core:

- **locust**: the Locust process alone (its users, its stats loop, the request events that stand for the
  publish acknowledgements, the UI's routes; the helper processes are not counted in it);
- **simulator**: the feeder process running ``simulator.producer.Simulator`` (every thread: the loop,
  librdkafka's, the ledger's writer, and the feeder's once-a-second ack report);
- **harness**: ``loadtest.locust.live`` (sampler; no pipeline, so no verifier passes).

It prints the three, Locust's share of the simulator's, and the messages Locust counted per second over the
window (from its request statistics, which count every acknowledged message). The issue's target: at 10x
(20,000 msg/s on ``baseline``) Locust stays a small share of the simulator.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
LOCUSTFILE = ROOT / "loadtest" / "locust" / "locustfile.py"


def child(proc: psutil.Process, module: str, timeout: float) -> psutil.Process:
    """The descendant of ``proc`` running ``python -m module`` (waits up to ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in proc.children(recursive=True):
            try:
                if module in p.cmdline():
                    return p
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.2)
    raise SystemExit(f"no {module} process appeared within {timeout:g} s")


def cpu(proc: psutil.Process) -> float:
    """CPU seconds of ``proc`` itself (user + system), not of its children."""
    t = proc.cpu_times()
    return float(t.user + t.system)


def acked(stats_csv: Path) -> int:
    """Messages Locust counted so far (its ``--csv`` stats file, the Aggregated row)."""
    if not stats_csv.is_file():
        return 0
    with stats_csv.open() as f:
        for row in csv.DictReader(f):
            if row["Name"] == "Aggregated":
                return int(row["Request Count"])
    return 0


def measure(load: float, seconds: float, warm: float, profile: str) -> dict[str, Any]:
    """One run: CPU shares of Locust, the simulator and the harness over the window, and the ack rate."""
    work = Path(tempfile.mkdtemp(prefix="sotw-bench-locust-"))
    users = round(load * 10)
    command = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "--no-pipeline",
        f"--sotw-profile={profile}",
        f"-u={users}",
        f"-r={users}",
        f"--run-time={int(warm + seconds + 10)}s",
        f"--run-dir={work / 'session'}",
        f"--csv={work / 'out'}",
        "--csv-full-history",
        "--only-summary",
    ]
    env = {k: v for k, v in os.environ.items() if k != "LOCUST_SKIP_MONKEY_PATCH"}
    with (work / "locust.log").open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)  # noqa: S603
    try:
        locust = psutil.Process(proc.pid)
        feeder = child(locust, "loadtest.locust.feeder", 180)
        live = child(locust, "loadtest.locust.live", 10)
        time.sleep(warm)
        parts = {"locust": locust, "simulator": feeder, "harness": live}
        before = {name: cpu(p) for name, p in parts.items()}
        acked0, t0 = acked(work / "out_stats.csv"), time.monotonic()
        time.sleep(seconds)
        after = {name: cpu(p) for name, p in parts.items()}
        acked1, t1 = acked(work / "out_stats.csv"), time.monotonic()
    finally:
        proc.wait(timeout=300)
    wall = t1 - t0
    share = {name: (after[name] - before[name]) / wall for name in parts}
    return {
        "load": load,
        "profile": profile,
        "users": users,
        "seconds": round(wall, 1),
        "cpu_share": {k: round(v, 3) for k, v in share.items()},
        "locust_over_simulator": round(share["locust"] / share["simulator"], 3)
        if share["simulator"]
        else None,
        # Locust writes its CSV every few seconds: the rate is over the writes inside the window.
        "acked_per_s": round((acked1 - acked0) / wall, 1),
        "work_dir": str(work),
    }


def main() -> int:
    """Run and print the figures (and write them as JSON with ``--json``)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--load", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warm", type=float, default=10.0)
    parser.add_argument("--profile", default="baseline")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    result = measure(args.load, args.seconds, args.warm, args.profile)
    share = result["cpu_share"]
    print(
        f"{args.profile} at {args.load:g}x ({result['users']} users), {result['seconds']} s measured: "
        f"locust {share['locust']:.1%} of a core, simulator {share['simulator']:.1%}, "
        f"harness {share['harness']:.1%}; locust / simulator = {result['locust_over_simulator']}; "
        f"{result['acked_per_s']:,.0f} acknowledged msg/s counted by Locust"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

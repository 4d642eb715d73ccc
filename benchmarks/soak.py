"""A long run at a steady load: do trigger time, broker memory and lag stay flat?

Runs the harness (the baseline profile at ``--load``, default 10x) with a steady phase of ``--minutes`` and then
cuts the steady phase into windows: per window the median trigger time and its ``latestOffset`` step (from the
pipeline's progress log), the broker's resident memory and CPU, the pipeline's memory, and the lag. A flat run
has the last window within ``--tolerance`` of the first (after the first window, which still settles).

    .venv/bin/python benchmarks/soak.py --minutes 30 --load 10x
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import pandas as pd

from loadtest.run.profile import load_profile, parse_load
from loadtest.run.runner import RunRequest, execute


def windows(run_dir: Path, steady: tuple[int, int], window_s: float) -> list[dict[str, float]]:
    """Per window of the steady phase: trigger and latestOffset medians, broker memory and CPU, lag."""
    samples = pd.read_json(run_dir / "samples.jsonl", lines=True)
    progress = []
    for line in (run_dir / "pipeline" / "output" / "progress.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("timestamp") and rec.get("numInputRows"):
            ts = pd.Timestamp(rec["timestamp"]).value // 1_000_000
            progress.append(
                (ts, rec["durationMs"].get("triggerExecution", 0), rec["durationMs"].get("latestOffset", 0))
            )
    out = []
    start, end = steady
    step = int(window_s * 1000)
    for lo in range(start, end - step + 1, step):
        hi = lo + step
        batch = [p for p in progress if lo <= p[0] < hi]
        rows = samples[(samples["ts"] * 1000 >= lo) & (samples["ts"] * 1000 < hi)]
        out.append(
            {
                "minute": round((lo - start) / 60000, 1),
                "batches": len(batch),
                "trigger_ms_median": statistics.median(p[1] for p in batch) if batch else float("nan"),
                "latest_offset_ms_median": statistics.median(p[2] for p in batch) if batch else float("nan"),
                "broker_rss_mb": float(rows["rss_mb_broker"].median())
                if "rss_mb_broker" in rows
                else float("nan"),
                "broker_cpu_percent": float(rows["cpu_broker"].median())
                if "cpu_broker" in rows
                else float("nan"),
                "pipeline_rss_mb": float(rows["rss_mb_pipeline"].median())
                if "rss_mb_pipeline" in rows
                else float("nan"),
                "lag_age_p95_s": float(rows["lag_age_s"].quantile(0.95))
                if "lag_age_s" in rows
                else float("nan"),
            }
        )
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=30.0, help="length of the steady phase (30)")
    p.add_argument("--load", default="10x", help="load factor of the baseline profile (10x)")
    p.add_argument("--window", type=float, default=300.0, help="seconds per window (300)")
    p.add_argument(
        "--tolerance", type=float, default=0.25, help="last window within this of the second (0.25)"
    )
    p.add_argument("--run-dir", type=Path, default=None)
    args = p.parse_args()
    profile = load_profile("baseline")
    run = dataclasses.replace(profile.run, steady_s=args.minutes * 60, max_lag_s=600, drain_max_s=600)
    profile = dataclasses.replace(profile, run=run)
    run_dir = args.run_dir or Path("runs") / f"soak-{time.strftime('%Y%m%d-%H%M%S')}"
    results = execute(
        RunRequest(profile, parse_load(args.load), run_dir, command=" ".join(sys.argv)),
        progress=lambda m: print(f"[{time.strftime('%H:%M:%S')}] {m}", file=sys.stderr, flush=True),
    )
    steady = next(ph for ph in results.phases if ph.name == "steady")
    table = windows(run_dir, (steady.start_ms, steady.end_ms), args.window)
    keys = list(table[0]) if table else []
    print(" ".join(f"{k:>24}" for k in keys))
    for row in table:
        print(" ".join(f"{row[k]:>24.1f}" if isinstance(row[k], float) else f"{row[k]:>24}" for k in keys))
    if len(table) >= 3:
        second, last = table[1], table[-1]
        for key in ("trigger_ms_median", "latest_offset_ms_median", "broker_rss_mb", "lag_age_p95_s"):
            growth = last[key] / second[key] - 1 if second[key] else float("nan")
            verdict = "flat" if abs(growth) <= args.tolerance else "GROWS"
            print(f"{key}: {second[key]:.1f} -> {last[key]:.1f} ({growth:+.0%}) {verdict}")
    (run_dir / "soak.json").write_text(
        json.dumps({"windows": table, "verdict": results.verdict.verdict}, indent=1)
    )
    print(f"run {run_dir}: {results.verdict.verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

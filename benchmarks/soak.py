"""A long run at a steady load: do trigger time, broker memory, pipeline memory and lag stay flat?

Runs the harness (the baseline profile at ``--load``, default 10x) on a local Apache Kafka node with a steady
phase of ``--minutes``, then compares the last third of the steady phase with its second sixth to its half
(for 30 minutes: minutes 20-30 against minutes 5-15, the first minutes still settling): the median trigger time
(from the pipeline's progress log), the broker's and the pipeline's resident memory, and the lag age's p95.
Each is flat when the late figure is within ``--tolerance`` (10 %) of the early one. Beside it, every 30 s, the
broker's disk use and how many of the run's partitions retention has trimmed (their oldest segment no longer
starts at offset 0): retention must delete while the pipeline keeps up, with no data-loss stop.

Writes ``soak.json`` (windows, spans, verdicts) and ``soak.png`` (each figure over time) into the run directory.

    .venv/bin/python benchmarks/soak.py --minutes 30 --load 10x
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import psutil
from matplotlib.figure import Figure

from loadtest.correctness.verify import verify_run
from loadtest.reports.pages import png_bytes
from loadtest.run.profile import Profile, load_profile, parse_load
from loadtest.run.runner import RunRequest, execute

#: The figures judged flat, with the column each is read from and how a span is summarised.
JUDGED = {
    "trigger_ms": "median trigger time, ms",
    "broker_rss_mb": "broker RSS, MB",
    "pipeline_rss_mb": "pipeline RSS, MB",
    "lag_age_p95_s": "lag age p95, s",
}


def _progress(run_dir: Path) -> pd.DataFrame:
    """One row per micro-batch that read rows: its wall-clock time (ms) and its trigger time."""
    rows = []
    for line in (run_dir / "pipeline" / "output" / "progress.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("timestamp") and rec.get("numInputRows"):
            ts = pd.Timestamp(rec["timestamp"]).value // 1_000_000
            rows.append((ts, rec["durationMs"].get("triggerExecution", 0)))
    return pd.DataFrame(rows, columns=["ts_ms", "trigger_ms"])


def span_figures(
    samples: pd.DataFrame, progress: pd.DataFrame, lo_ms: float, hi_ms: float
) -> dict[str, float]:
    """The judged figures over wall-clock milliseconds ``[lo_ms, hi_ms)``."""
    batch = progress[(progress["ts_ms"] >= lo_ms) & (progress["ts_ms"] < hi_ms)]
    rows = samples[(samples["ts"] * 1000 >= lo_ms) & (samples["ts"] * 1000 < hi_ms)]

    def median(col: str) -> float:
        return float(rows[col].median()) if col in rows and len(rows) else float("nan")

    return {
        "batches": float(len(batch)),
        "trigger_ms": float(batch["trigger_ms"].median()) if len(batch) else float("nan"),
        "broker_rss_mb": median("rss_mb_broker"),
        "pipeline_rss_mb": median("rss_mb_pipeline"),
        "lag_age_p95_s": float(rows["lag_age_s"].quantile(0.95))
        if "lag_age_s" in rows and len(rows)
        else float("nan"),
    }


def _kafka_log_dirs() -> list[Path]:
    """The ``log.dirs`` of the Apache Kafka nodes this process started (the harness's local broker)."""
    dirs = []
    for child in psutil.Process().children(recursive=True):
        try:
            cmdline = child.cmdline()
        except psutil.Error:
            continue
        if "kafka.Kafka" in cmdline:
            for line in Path(cmdline[-1]).read_text().splitlines():
                if line.startswith("log.dirs="):
                    dirs += [Path(d) for d in line.split("=", 1)[1].split(",")]
    return dirs


def _partitions(log_dir: Path) -> Iterator[tuple[str, list[int]]]:
    """Each of the run's partition directories with its segments' base offsets (internal topics left out)."""
    for part in log_dir.iterdir():
        if part.is_dir() and not part.name.startswith("__") and "-" in part.name:
            bases = sorted(int(f.stem) for f in part.glob("*.log") if f.stem.isdigit())
            if bases:
                yield part.name, bases


def sample_retention(out: Path, stop: threading.Event, every_s: float = 30.0) -> None:
    """Every ``every_s``: the broker's disk use and how many partitions retention has trimmed, to ``out``."""
    with out.open("a") as f:
        while not stop.wait(every_s):
            disk = 0
            parts = trimmed = segments = 0
            try:
                for log_dir in _kafka_log_dirs():
                    # Blocks allocated, not file sizes: Kafka's index files are sparse, 10 MiB each.
                    disk += sum(p.stat().st_blocks * 512 for p in log_dir.rglob("*") if p.is_file())
                    for _, bases in _partitions(log_dir):
                        parts += 1
                        segments += len(bases)
                        trimmed += bases[0] > 0
            except OSError:  # a segment deleted while it was being listed: the next sample counts it
                continue
            row = {"ts": time.time(), "disk_mb": round(disk / 2**20, 1), "partitions": parts}
            row |= {"trimmed": trimmed, "segments": segments}
            f.write(json.dumps(row) + "\n")
            f.flush()


def windows(
    samples: pd.DataFrame, progress: pd.DataFrame, start_ms: int, end_ms: int, step_s: float
) -> Iterator[dict[str, float]]:
    step = int(step_s * 1000)
    for lo in range(start_ms, end_ms - step + 1, step):
        yield {"minute": round((lo - start_ms) / 60000, 1)} | span_figures(samples, progress, lo, lo + step)


def chart(samples: pd.DataFrame, progress: pd.DataFrame, retention: pd.DataFrame, start_ms: int) -> Figure:
    """Each figure over the steady phase's minutes, one panel each."""
    fig = Figure(figsize=(10, 11))
    panels = fig.subplots(5, 1, sharex=True)
    minutes = (samples["ts"] * 1000 - start_ms) / 60000
    series = [
        (
            "trigger time, ms (per micro-batch)",
            (progress["ts_ms"] - start_ms) / 60000,
            progress["trigger_ms"],
        ),
        ("lag age, s", minutes, samples.get("lag_age_s")),
        ("broker RSS, MB", minutes, samples.get("rss_mb_broker")),
        ("pipeline RSS, MB", minutes, samples.get("rss_mb_pipeline")),
    ]
    if len(retention):
        series.append(("broker disk, MB", (retention["ts"] * 1000 - start_ms) / 60000, retention["disk_mb"]))
    for ax, (title, x, y) in zip(panels, series, strict=False):
        if y is not None:
            ax.plot(x, y, lw=0.8)
        ax.set_title(title, fontsize=9, loc="left")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    panels[-1].set_xlabel("minute of the steady phase")
    return fig


def analyse(run_dir: Path, start: int, end: int, tolerance: float, window_s: float, verdict: str) -> int:
    """Print and write the windows, the early and late spans' figures, the verdicts and the chart."""
    retention_path = run_dir / "retention.jsonl"
    has_retention = retention_path.exists() and retention_path.stat().st_size
    retention = pd.read_json(retention_path, lines=True) if has_retention else pd.DataFrame()
    samples = pd.read_json(run_dir / "samples.jsonl", lines=True)
    progress = _progress(run_dir)

    table = list(windows(samples, progress, start, end, window_s))
    keys = list(table[0]) if table else []
    print(" ".join(f"{k:>16}" for k in keys))
    for row in table:
        print(" ".join(f"{row[k]:>16.1f}" for k in keys))

    minute = 60000
    length = (end - start) / minute
    early_span = (length / 6, length / 2)
    late_span = (length * 2 / 3, length)
    early = span_figures(samples, progress, start + early_span[0] * minute, start + early_span[1] * minute)
    late = span_figures(samples, progress, start + late_span[0] * minute, start + late_span[1] * minute)
    verdicts = {}
    print(
        f"minutes {late_span[0]:.0f}-{late_span[1]:.0f} against minutes {early_span[0]:.0f}-{early_span[1]:.0f}:"
    )
    for key, name in JUDGED.items():
        growth = late[key] / early[key] - 1 if early[key] else float("nan")
        verdicts[key] = "flat" if abs(growth) <= tolerance else "GROWS" if growth > 0 else "FALLS"
        print(f"  {name}: {early[key]:.1f} -> {late[key]:.1f} ({growth:+.0%}) {verdicts[key]}")
    if len(retention):
        last = retention.iloc[-1]
        print(
            f"retention: {int(last['trimmed'])} of {int(last['partitions'])} partitions trimmed, "
            f"disk {retention['disk_mb'].max():.0f} MB at most, {last['disk_mb']:.0f} MB at the end"
        )
    (run_dir / "soak.png").write_bytes(png_bytes(chart(samples, progress, retention, start)))
    (run_dir / "soak.json").write_text(
        json.dumps(
            {
                "windows": table,
                "early": early,
                "late": late,
                "verdicts": verdicts,
                "retention": retention.to_dict("records") if len(retention) else [],
                "verdict": verdict,
            },
            indent=1,
        )
    )
    print(f"run {run_dir}: {verdict}; chart {run_dir / 'soak.png'}")
    return 0 if verdict == "PASS" and set(verdicts.values()) == {"flat"} else 1


def steady_of_samples(run_dir: Path) -> tuple[int, int]:
    """The steady phase's wall-clock bounds (ms) from the samples, for a run that wrote no results."""
    samples = pd.read_json(run_dir / "samples.jsonl", lines=True)
    steady = samples[samples["phase"] == "steady"]["ts"] * 1000
    if steady.empty:
        raise SystemExit(f"{run_dir / 'samples.jsonl'} has no sample of the steady phase")
    return int(steady.min()), int(steady.max()) + 1000  # the last sample opens the last second


def verdict_of(run_dir: Path, profile: Profile) -> str:
    """The run's verdict from its results, or, for a run that wrote none, from verifying it again now.

    The verification goes a shard of sensors at a time on a long run (``loadtest.correctness.shards``),
    without Kafka: triage then names layers from the ledger alone.
    """
    results = run_dir / "results.json"
    if results.exists():
        return str(json.loads(results.read_text())["verdict"]["verdict"])

    def say(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    say("no results.json: verifying the output against the ledger")
    policy = profile.pipeline.verifier_policy(timeouts_expire=True)
    found = verify_run(run_dir, run_dir / "pipeline" / "output", policy, pipeline_stopped=False, progress=say)
    print(
        f"verified: {found.rows_written:,} of {found.rows_expected:,} change rows written, {found.rows_lost:,} lost, "
        f"{found.rows_repeated:,} repeated, {found.rows_wrong:,} wrong; discrepancies {found.discrepancy_counts or 'none'}"
    )
    return "PASS" if found.passed else "FAIL"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=30.0, help="length of the steady phase (30)")
    p.add_argument("--load", default="10x", help="load factor of the baseline profile (10x)")
    p.add_argument("--window", type=float, default=300.0, help="seconds per window of the table (300)")
    p.add_argument(
        "--tolerance", type=float, default=0.10, help="the late span within this of the early one (0.10)"
    )
    p.add_argument("--run-dir", type=Path, default=None)
    p.add_argument(
        "--analyse",
        type=Path,
        metavar="RUN_DIR",
        default=None,
        help="analyse a soak's run directory again; one without results.json is verified again first",
    )
    args = p.parse_args()
    profile = load_profile("baseline")
    run = dataclasses.replace(profile.run, steady_s=args.minutes * 60, max_lag_s=600, drain_max_s=600)
    profile = dataclasses.replace(profile, run=run)
    if args.analyse is not None:
        start, end = steady_of_samples(args.analyse)
        return analyse(
            args.analyse, start, end, args.tolerance, args.window, verdict_of(args.analyse, profile)
        )
    run_dir = args.run_dir or Path("runs") / f"soak-{time.strftime('%Y%m%d-%H%M%S')}"
    retention_path = run_dir.with_name(run_dir.name + "-retention.jsonl")
    retention_path.parent.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    sampler = threading.Thread(target=sample_retention, args=(retention_path, stop), daemon=True)
    sampler.start()
    try:
        results = execute(
            RunRequest(profile, parse_load(args.load), run_dir, command=" ".join(sys.argv)),
            progress=lambda m: print(f"[{time.strftime('%H:%M:%S')}] {m}", file=sys.stderr, flush=True),
        )
    finally:
        stop.set()
        sampler.join()
        if run_dir.is_dir():
            retention_path.rename(run_dir / "retention.jsonl")
    steady = next(ph for ph in results.phases if ph.name == "steady")
    return analyse(
        run_dir, steady.start_ms, steady.end_ms, args.tolerance, args.window, results.verdict.verdict
    )


if __name__ == "__main__":
    raise SystemExit(main())

"""A run's figures and verdict: from the sampler's rows, the ledger and the pipeline's output to ``Results``.

Every headline figure is stated once, with the phase it covers (``results.SCOPES``). Rates, lag and
latency percentiles cover the **steady phase**: rates and lag from the samples taken in it, latencies over the
messages the simulator *intended* to send in it (so warm-up messages, slow because the JVM was still
compiling, do not inflate the tail, and a late producer cannot hide latency). The drain time covers the drain.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from loadtest.correctness.expect import read_ledger
from loadtest.correctness.latency import LEDGER_COLUMNS, end_to_end_of, latency_summary
from loadtest.correctness.outputspec import OutputSpec
from loadtest.gameday.incidents import IncidentRecord
from loadtest.gameday.recovery import Stop, Window, measure
from loadtest.measure.resources import COMPONENTS, harness_overhead, per_second, resources
from loadtest.measure.verdict import verdict
from loadtest.reports.results import (
    SCHEMA_VERSION,
    Correctness,
    Figure,
    IncidentResult,
    LatencySummary,
    Phase,
    Results,
    RunInfo,
    Series,
)
from loadtest.run.profile import Profile
from pipeline.progress import input_messages

THREAD_GROUPS = ("simulator", "sampler", "other")
STEADY = "steady"
BATCH_STEP = "time per batch: "
"""Prefix of the summary figures that say where a micro-batch spends its time (one per step)."""

# Steps of Spark's trigger (``durationMs``) and the name a reader knows them by.
TRIGGER_STEPS = {
    "latestOffset": "find new offsets (broker)",
    "getBatch": "plan the batch",
    "addBatch": "read + rebuild + write",
    "walCommit": "checkpoint offsets",
    "commitOffsets": "checkpoint commit",
    "triggerExecution": "whole trigger",
}


@dataclass(frozen=True)
class Outcome:
    """What one run did, as the runner saw it: everything its figures and verdict are computed from.

    Parameters
    ----------
    profile, load_factor
        What was asked for.
    run_dir
        The run directory (ledger, pipeline output).
    command, bootstrap
        For the report.
    started_ms, phases
        When the run started and its phases (epoch ms).
    samples
        The sampler's rows (``samples.jsonl``).
    correctness
        The verifier's verdict.
    drain_s
        Seconds the pipeline took to catch up after the load stopped; None if it did not.
    pipeline_failed
        Why the pipeline process ended on its own, if it did.
    interrupted
        The run was stopped (Ctrl-C) before it ended.
    verify_cpu_s
        CPU seconds the harness spent verifying the output (after the load); the latency figures' own
        reading of the ledger and output is added to it.
    incidents
        What each game-day incident did and when.
    stopped
        When and why the pipeline stopped on its own, if it did.
    data_loss_reports
        How many times the pipeline reported data the broker no longer had.
    output_spec
        The job's output, its contract and format; None for sotw's pipeline in the run directory.
    """

    profile: Profile
    load_factor: float
    run_dir: Path
    command: str
    bootstrap: str
    started_ms: int
    phases: list[Phase]
    samples: list[dict[str, Any]]
    correctness: Correctness
    drain_s: float | None
    pipeline_failed: str | None
    interrupted: bool
    verify_cpu_s: float = 0.0
    incidents: list[IncidentRecord] = field(default_factory=list)
    stopped: Stop | None = None
    data_loss_reports: int = 0
    output_spec: OutputSpec | None = None

    @property
    def target_rate(self) -> float:
        """Messages per second the simulator was asked for."""
        return self.profile.simulator.rate * self.load_factor

    @property
    def steady(self) -> Phase | None:
        """The steady phase, if the run reached it."""
        return next((p for p in self.phases if p.name == STEADY), None)

    @property
    def output(self) -> OutputSpec:
        """The pipeline's output."""
        return self.output_spec or OutputSpec(self.run_dir / "pipeline" / "output")


#: Every dated message's end-to-end latency (``intended_ts``, ``committed_ms``, ``latency_ms``), in the run dir.
LATENCY_FILE = "latency.parquet"


def results(outcome: Outcome, clock: Callable[[], float] = time.time) -> Results:
    """Every figure of the run, its verdict and what it ran on, as ``Results``."""
    import sotw

    df = frame(outcome.samples)
    throughput, lag, resource_series = series(df, outcome.started_ms / 1000.0)
    cpu0 = time.process_time()
    latency, latency_series, e2e = latencies(outcome.run_dir, outcome.output, outcome.steady)
    # Kept for what judges the run's windows afterwards (a capacity search's levels): the output it was read
    # from may be gone by then (a local broker's topic) or elsewhere (a team's --output).
    e2e[["intended_ts", "committed_ms", "latency_ms"]].astype("float64").to_parquet(
        outcome.run_dir / LATENCY_FILE, index=False
    )
    incidents = incident_results(outcome, df, e2e)
    verify_cpu_s = outcome.verify_cpu_s + time.process_time() - cpu0
    steady = steady_rows(df)
    summary = headline(outcome, steady, latency)
    profile = outcome.profile
    return Results(
        run=RunInfo(
            run_id=outcome.run_dir.name,
            started_ms=outcome.started_ms,
            ended_ms=int(clock() * 1000),
            load_factor=outcome.load_factor,
            policy=profile.pipeline.policy,
            profile_name=profile.name,
            profile=profile.as_dict(),
            command=outcome.command,
            bootstrap=outcome.bootstrap,
            host={
                "machine": platform.machine(),
                "cpus": os.cpu_count() or 0,
                "python": platform.python_version(),
            },
            versions={"sotw": sotw.__version__, "results_schema": str(SCHEMA_VERSION)},
            interrupted=outcome.interrupted,
        ),
        verdict=verdict(outcome, summary),
        phases=outcome.phases,
        throughput=throughput,
        lag=lag,
        latency_series=latency_series,
        latency=latency,
        resources=resources(steady),
        resource_series=resource_series,
        summary=summary,
        correctness=outcome.correctness,
        harness_overhead=harness_overhead(steady, verify_cpu_s),
        incidents=incidents,
        pipeline_stop=outcome.stopped.message if outcome.stopped else None,
        data_loss_reports=outcome.data_loss_reports,
    )


def incident_results(outcome: Outcome, samples: pd.DataFrame, e2e: pd.DataFrame) -> list[IncidentResult]:
    """Each incident's window, what was done, and what it did to the pipeline (``loadtest.gameday.recovery``).

    A stop is also counted in triggers: the batches the pipeline planned between the incident's end and its
    stop (from the checkpoint's offset log, which every trigger that plans a batch writes), plus the trigger
    that failed.
    """
    steady = outcome.steady
    planned = batch_times(outcome.run_dir / "pipeline" / "checkpoint")
    out = []
    for record in outcome.incidents:
        if not record.start_ms:
            continue  # the run ended before the incident's time
        window = Window(record.label, record.kind, record.start_ms, record.window_end_ms or record.start_ms)
        measured = measure(
            window,
            samples,
            e2e,
            outcome.profile.run.max_lag_s,
            outcome.stopped,
            steady.start_ms if steady else None,
        )
        triggers = None
        if measured.stopped and outcome.stopped is not None:
            triggers = 1 + sum(1 for t in planned if window.end_ms <= t <= outcome.stopped.at_ms)
        out.append(
            dataclasses.replace(
                measured,
                notes=list(record.notes),
                error=record.error,
                stop_triggers=triggers,
                figures=dict(record.figures),
            )
        )
    return out


def batch_times(checkpoint: Path) -> list[int]:
    """When each batch still in the checkpoint's offset log was planned (``batchTimestampMs``), ascending."""
    folder = checkpoint / "offsets"
    times = []
    for path in folder.glob("[0-9]*") if folder.is_dir() else []:
        try:
            times.append(int(json.loads(path.read_text().splitlines()[1])["batchTimestampMs"]))
        except (OSError, ValueError, KeyError, IndexError):
            continue
    return sorted(times)


# ------------------------------------------------------------------------------------------- samples


def frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The sampler's rows as a DataFrame (``t``, ``ts``, ``phase`` and one column per reading)."""
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=["t", "ts", "phase"])


def steady_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The samples taken during the steady phase."""
    return df[df["phase"] == STEADY] if "phase" in df else df.iloc[0:0]


def rate(df: pd.DataFrame, column: str) -> list[float]:
    """Per-second rate of a cumulative counter column (0 where it is unknown)."""
    if column not in df or df.empty:
        return [0.0] * len(df)
    values = df[column].ffill().fillna(0).to_numpy(dtype=float)
    dt = np.diff(df["ts"].to_numpy(dtype=float), prepend=np.nan)
    per_s = np.diff(values, prepend=values[0]) / np.where(dt > 0, dt, np.nan)
    return [float(x) if np.isfinite(x) else 0.0 for x in per_s]


def series(df: pd.DataFrame, t0_s: float) -> tuple[list[Series], list[Series], list[Series]]:
    """Throughput, lag and resource series over the whole run, in seconds since ``t0_s``."""
    t = [float(x) for x in (df["ts"].to_numpy(dtype=float) - t0_s)] if not df.empty else []
    throughput = [
        Series("produced", "msg/s", t, rate(df, "sent"), "simulator"),
        Series("acknowledged", "msg/s", t, rate(df, "acked"), "broker"),
        Series("consumed", "msg/s", t, rate(df, "consumed"), "pipeline"),
        Series("written", "rows/s", t, rate(df, "written_changes"), "pipeline"),
    ]

    def col(name: str) -> list[float]:
        if name not in df:
            return [0.0] * len(t)
        return [float(x) for x in df[name].ffill().fillna(0).to_numpy(dtype=float)]

    lag = [
        Series("lag_offsets", "offsets", t, col("lag_offsets"), "pipeline"),
        Series("lag_max_partition", "offsets", t, col("lag_max_partition"), "pipeline"),
        Series("lag_age", "s", t, col("lag_age_s"), "pipeline"),
    ]
    resource_series = [Series(f"cpu_{c}", "% of a core", t, col(f"cpu_{c}"), c) for c in COMPONENTS] + [
        Series(f"rss_{c}", "MB", t, col(f"rss_mb_{c}"), c) for c in COMPONENTS
    ]
    return throughput, lag, resource_series


# ------------------------------------------------------------------------------------------ latency


def in_phase(intended_ms: pd.Series, phase: Phase | None) -> npt.NDArray[np.bool_]:
    """Which messages the simulator intended to send within ``phase`` (none if there is no such phase)."""
    if phase is None:
        return np.zeros(len(intended_ms), dtype=bool)
    ts = intended_ms.to_numpy(dtype=float)
    return (ts >= phase.start_ms) & (ts < phase.end_ms)


def latencies(
    run_dir: Path, output: Path | OutputSpec, steady: Phase | None
) -> tuple[list[LatencySummary], list[Series], pd.DataFrame]:
    """End-to-end, publish and schedule-lateness percentiles over the steady phase's messages.

    Also the end-to-end p50 and p99 over the whole run, by 5 s of commit time, for the latency chart, and
    every applied message's end-to-end latency (``latency.end_to_end``) for the incident measurements.
    """
    full = not isinstance(output, OutputSpec) or output.contract == "full"
    ledger = read_ledger(run_dir, columns=LEDGER_COLUMNS if full else None)
    summaries: list[LatencySummary] = []
    series_out: list[Series] = []
    e2e = end_to_end_of(ledger, output)
    t0 = float(ledger["intended_ts"].min()) / 1000.0 if not ledger.empty else 0.0
    if not e2e.empty:
        steady_e2e = e2e[in_phase(e2e["intended_ts"], steady)]
        summaries.append(latency_summary("end_to_end", steady_e2e["latency_ms"].to_numpy()))
        buckets = ((e2e["committed_ms"] / 1000.0 - t0) // 5 * 5).astype(float)
        grouped = e2e.groupby(buckets)["latency_ms"]
        p50, p99 = grouped.median(), grouped.quantile(0.99)
        series_out.append(Series("e2e_p50", "ms", list(p50.index), [float(v) for v in p50], "pipeline"))
        series_out.append(Series("e2e_p99", "ms", list(p99.index), [float(v) for v in p99], "pipeline"))
    meant = ledger[in_phase(ledger["intended_ts"], steady)]
    if "acked_ts" in meant:
        acked = meant[meant["acked_ts"].notna() & meant["sent_ts"].notna()]
        summaries.append(
            latency_summary("publish", (acked["acked_ts"] - acked["sent_ts"]).to_numpy(dtype=float))
        )
    on_time = meant[(meant["fault"] == "none") & meant["sent_ts"].notna()]
    lateness = (on_time["sent_ts"] - on_time["intended_ts"]).to_numpy(dtype=float)
    summaries.append(latency_summary("schedule_lateness", np.clip(lateness, 0, None)))
    return [s for s in summaries if s.count], series_out, e2e


def time_breakdown(progress_path: Path, steady: Phase | None) -> dict[str, float]:
    """Mean milliseconds per micro-batch with data in the steady phase, by step of Spark's trigger."""
    rows = []
    if steady is not None and progress_path.is_file():
        for line in progress_path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            ts = pd.Timestamp(rec.get("timestamp")).value // 1_000_000 if rec.get("timestamp") else 0
            if steady.start_ms <= ts <= steady.end_ms and input_messages(rec) > 0:
                rows.append(rec)
    if not rows:
        return {}
    out: dict[str, float] = {}
    for key, name in TRIGGER_STEPS.items():
        out[name] = float(np.mean([float((r.get("durationMs") or {}).get(key, 0)) for r in rows]))
    state = [(r.get("stateOperators") or [{}])[0] for r in rows]
    out["stateful step: update"] = float(np.mean([float(s.get("allUpdatesTimeMs", 0)) for s in state]))
    out["stateful step: commit"] = float(np.mean([float(s.get("commitTimeMs", 0)) for s in state]))
    return out


# ------------------------------------------------------------------------------------------ headline


def headline(outcome: Outcome, steady: pd.DataFrame, latency: list[LatencySummary]) -> list[Figure]:
    """The summary figures, each once, each with the phase it covers."""

    def quantile(column: str, q: float) -> float:
        values = steady[column].dropna() if column in steady else pd.Series(dtype=float)
        return float(values.quantile(q)) if not values.empty else math.nan

    figures = [
        Figure("target_rate", STEADY, outcome.target_rate, "msg/s"),
        Figure("produced_rate", STEADY, per_second(steady, "sent"), "msg/s"),
        Figure("acked_rate", STEADY, per_second(steady, "acked"), "msg/s"),
        Figure("consumed_rate", STEADY, per_second(steady, "consumed"), "msg/s"),
        Figure("written_rate", STEADY, per_second(steady, "written_changes"), "rows/s"),
        Figure("lag_age_p95", STEADY, quantile("lag_age_s", 0.95), "s"),
        Figure("lag_age_max", STEADY, quantile("lag_age_s", 1.0), "s"),
        Figure("lag_offsets_max", STEADY, quantile("lag_offsets", 1.0), "offsets"),
    ]
    for lat in latency:
        if lat.name == "end_to_end":
            figures.append(Figure("end_to_end_p50", lat.scope, lat.p50, "ms"))
        figures.append(Figure(f"{lat.name}_p99", lat.scope, lat.p99, "ms"))
    figures.append(
        Figure("drain_time", "drain", math.nan if outcome.drain_s is None else outcome.drain_s, "s")
    )
    breakdown = time_breakdown(outcome.output.path / "progress.jsonl", outcome.steady)
    figures += [Figure(f"{BATCH_STEP}{step}", STEADY, ms, "ms") for step, ms in breakdown.items()]
    return figures

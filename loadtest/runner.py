"""One load-test run, end to end: broker, pipeline process, simulator, samplers, verdict, report.

The phases are those of a game day: a **warm-up** (the JVM compiles, the first batches are slow), a measured
**steady** phase at the profile's rate times the load factor, and a **drain** (the load stops; how long until the
pipeline has caught up). Then the harness waits for quiet sessions to time out, stops the pipeline gracefully,
verifies its output against the ledger and writes ``results.json`` and the report. Ctrl-C at any point stops
every part cleanly and still writes a partial report, marked as interrupted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from loadtest.errors import HarnessError
from loadtest.expect import Policy, read_ledger
from loadtest.processes import PipelineProcess, PipelineProcessConfig
from loadtest.profile import Profile
from loadtest.results import (
    SCHEMA_VERSION,
    Correctness,
    LatencySummary,
    Phase,
    ResourceUsage,
    Results,
    RunInfo,
    Series,
    Verdict,
)
from loadtest.samplers import KafkaLagProbe, OutputProbe, ProgressProbe, ResourceProbe, Sampler
from loadtest.verify import end_to_end, latency_summary, read_output, verify_run
from pipeline.config import parse_trigger
from pipeline.progress import input_messages
from simulator.producer import Simulator
from sotw.broker import EmbeddedBroker
from sotw.kafka import KafkaConfig

log = logging.getLogger(__name__)

COMPONENTS = ("broker", "pipeline", "harness")


@dataclass(frozen=True)
class RunRequest:
    """What to run.

    Parameters
    ----------
    profile
        The 1x baseline (fleet, faults, pipeline settings, phases, criteria).
    load_factor
        Multiplier of the profile's rate.
    run_dir
        Everything the run writes goes here (must not exist yet, or be empty).
    kafka
        A running cluster; None starts the embedded broker for this run.
    pipeline_args
        Extra ``sotw pipeline`` flags (the harness's self-tests use ``--drop-batch``).
    command
        The command line that asked for this run, for the report.
    """

    profile: Profile
    load_factor: float
    run_dir: Path
    kafka: KafkaConfig | None = None
    pipeline_args: tuple[str, ...] = ()
    command: str = ""

    @property
    def target_rate(self) -> float:
        """Messages per second the simulator is asked for."""
        return self.profile.simulator.rate * self.load_factor


@dataclass
class _Clock:
    """Phase boundaries in epoch ms, filled in as the run goes."""

    started_ms: int = 0
    phases: list[Phase] = field(default_factory=list)
    current: str = "setup"

    def enter(self, name: str) -> None:
        now = int(time.time() * 1000)
        if self.phases and self.phases[-1].end_ms == 0:
            last = self.phases[-1]
            self.phases[-1] = Phase(last.name, last.start_ms, now)
        self.phases.append(Phase(name, now, 0))
        self.current = name

    def close(self) -> None:
        if self.phases and self.phases[-1].end_ms == 0:
            last = self.phases[-1]
            self.phases[-1] = Phase(last.name, last.start_ms, int(time.time() * 1000))


Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def execute(request: RunRequest, stop: threading.Event | None = None, progress: Progress = _quiet) -> Results:
    """Run the whole system once and return its results (also written to ``run_dir/results.json``).

    Raises
    ------
    HarnessError
        If the run directory is in use or a part cannot be started.
    """
    stop = stop or threading.Event()
    run_dir = request.run_dir
    if run_dir.exists() and any(run_dir.iterdir()):
        raise HarnessError(f"run directory {run_dir} is not empty; choose a new one")
    run_dir.mkdir(parents=True, exist_ok=True)
    clock = _Clock(started_ms=int(time.time() * 1000))
    with contextlib.ExitStack() as stack:
        if request.kafka is None:
            progress("starting the embedded broker")
            broker = stack.enter_context(EmbeddedBroker(log_path=run_dir / "broker.log"))
            kafka = KafkaConfig(broker.bootstrap)
            broker_pid: Callable[[], int | None] = lambda: broker.process.pid if broker.process else None  # noqa: E731
        else:
            kafka = request.kafka
            broker_pid = lambda: None  # noqa: E731 - a remote broker's CPU is not ours to measure
        return _run(request, kafka, broker_pid, clock, stop, progress)
    raise AssertionError("unreachable")  # pragma: no cover - ExitStack does not swallow exceptions here


def _run(
    request: RunRequest,
    kafka: KafkaConfig,
    broker_pid: Callable[[], int | None],
    clock: _Clock,
    stop: threading.Event,
    progress: Progress,
) -> Results:
    profile, run_dir = request.profile, request.run_dir
    tag = secrets.token_hex(3)
    # A run-specific topic prefix: runs sharing a cluster (bench, capacity, --bootstrap) never read each other.
    prefix = f"{profile.simulator.topic_prefix}{tag}-"
    settings = profile.run
    sim_config = profile.simulator.replace(
        topic_prefix=prefix,
        load_factor=request.load_factor,
        # The harness ends the load itself: the warm-up lasts until the pipeline has finished a batch.
        duration_s=None,
        max_messages=None,
    )
    out_root = run_dir / "pipeline"
    pipe = PipelineProcess(
        PipelineProcessConfig(
            bootstrap=kafka.bootstrap,
            output=out_root / "output",
            checkpoint=out_root / "checkpoint",
            pattern=re.escape(prefix) + ".*",
            policy=profile.pipeline.policy,
            trigger=profile.pipeline.trigger,
            session_timeout=profile.pipeline.session_timeout,
            extra_args=(
                "--discovery-interval",
                "1s",
                "-q",
                *_kafka_flags(kafka),
                *profile.pipeline.extra_args,
                *request.pipeline_args,
            ),
        ),
        log_path=out_root / "pipeline.log",
    )
    simulator = Simulator(sim_config, kafka, run_dir)
    sampler = Sampler(
        {
            "simulator": _SimulatorProbe(simulator),
            "lag": KafkaLagProbe(kafka, pipe.config.pattern, pipe.config.checkpoint),
            "output": OutputProbe(pipe.config.output),
            "progress": ProgressProbe(pipe.config.output / "progress.jsonl"),
            "resources": ResourceProbe(
                {
                    "broker": broker_pid,
                    "pipeline": lambda: pipe.pid if pipe.alive() else None,
                    "harness": os.getpid,
                },
                alone=("harness",),  # the harness's children are the broker and the pipeline
            ),
        },
        run_dir / "samples.jsonl",
        phase=lambda: clock.current,
    )
    interrupted = False
    pipeline_failed: str | None = None
    drain_s: float | None = None
    sim_error: list[BaseException] = []
    try:
        progress(
            f"starting the pipeline ({profile.pipeline.policy} policy, trigger {profile.pipeline.trigger})"
        )
        pipe.start()
        pipe.wait_ready(settings.pipeline_start_timeout_s)
        sampler.start()
        sim_stop = threading.Event()

        def produce() -> None:
            try:
                simulator.run(sim_stop)
            except BaseException as exc:  # reported by the main thread
                sim_error.append(exc)

        producer = threading.Thread(target=produce, name="sotw-simulator", daemon=True)
        load_start = time.monotonic()
        clock.enter("warmup")
        progress(
            f"warm-up: {request.target_rate:,.0f} msg/s ({request.load_factor:g}x) for {settings.warmup_s:g} s"
        )
        producer.start()
        applied: set[int] = set()
        steady_start = 0.0
        while producer.is_alive():
            elapsed = time.monotonic() - load_start
            if (
                clock.current == "warmup"
                and elapsed >= settings.warmup_s
                and _pipeline_warm(sampler, elapsed, settings)
            ):
                clock.enter("steady")
                steady_start = time.monotonic()
                progress(f"steady: measuring for {settings.steady_s:g} s")
            if clock.current == "steady" and time.monotonic() - steady_start >= settings.steady_s:
                sim_stop.set()
            _apply_schedule(profile, simulator, elapsed, applied)
            if stop.is_set():
                interrupted = True
                sim_stop.set()
            if not pipe.alive() and pipeline_failed is None:
                pipeline_failed = (
                    f"the pipeline exited with code {pipe.returncode()} during the load: {pipe.tail(2)}"
                )
                progress(pipeline_failed)
                sim_stop.set()  # nothing left to measure; the verdict says why
            producer.join(0.25)
        if sim_error:
            raise HarnessError(f"the simulator failed: {sim_error[0]}") from sim_error[0]
        clock.enter("drain")
        if not interrupted and pipeline_failed is None:
            progress(
                f"drain: load stopped; waiting up to {settings.drain_max_s:g} s for the pipeline to catch up"
            )
            drain_s = _drain(sampler, pipe, settings.drain_max_s, stop)
            interrupted = stop.is_set()
            if drain_s is not None and not interrupted:
                # Sessions without an `end` (abandoned) close only when their timeout passes: wait for it.
                clock.enter("settle")
                _settle(profile, pipe, stop)
                interrupted = stop.is_set()
        if not pipe.alive() and pipeline_failed is None:
            pipeline_failed = f"the pipeline exited with code {pipe.returncode()}: {pipe.tail(2)}"
    except KeyboardInterrupt:
        interrupted = True
    finally:
        clock.close()
        sampler.stop()
        code = pipe.stop()
        progress(f"pipeline stopped (exit code {code})")
    progress("verifying the output against the ledger")
    policy = Policy(
        profile.pipeline.policy,
        window_messages=_extra_int(profile.pipeline.extra_args, "--window-messages"),
        window_ms=_extra_int(profile.pipeline.extra_args, "--window-ms"),
        timeouts_expire=not interrupted and drain_s is not None,
    )
    correctness = verify_run(
        run_dir, pipe.config.output, policy, kafka, pipeline_stopped=pipeline_failed is not None
    )
    results = _results(
        request, kafka, clock, sampler.rows, correctness, drain_s, pipeline_failed, interrupted
    )
    results.to_json(run_dir / "results.json")
    return results


def _kafka_flags(kafka: KafkaConfig) -> list[str]:
    flags: list[str] = []
    for key, value in kafka.settings.items():
        flags += ["-X", f"{key}={value}"]
    return flags


def _extra_int(args: Sequence[str], flag: str) -> int | None:
    args = list(args)
    return int(args[args.index(flag) + 1]) if flag in args else None


def _pipeline_warm(sampler: Sampler, elapsed: float, settings: Any) -> bool:
    """True once the pipeline has consumed data (its first batches compile and start Python workers)."""
    if elapsed >= settings.warmup_s + settings.pipeline_start_timeout_s:
        return True  # measure anyway; the lag will tell
    return bool(sampler.rows) and sampler.rows[-1].get("consumed", 0) > 0


def _apply_schedule(profile: Profile, simulator: Simulator, elapsed: float, applied: set[int]) -> None:
    """Switch scheduled fault windows on and off (each edge once)."""
    for i, window in enumerate(profile.schedule):
        if elapsed >= window.start_s and 2 * i not in applied:
            applied.add(2 * i)
            log.info("fault window %d on: %s", i, window.faults)
            simulator.set_faults(window.faults)
        if elapsed >= window.end_s and 2 * i + 1 not in applied:
            applied.add(2 * i + 1)
            simulator.set_faults(profile.simulator.faults)


def _drain(sampler: Sampler, pipe: PipelineProcess, limit_s: float, stop: threading.Event) -> float | None:
    """Seconds until the pipeline had consumed everything (two samples in a row at zero lag), or None."""
    start = time.monotonic()
    seen = len(sampler.rows)
    zero_in_a_row = 0
    while time.monotonic() - start < limit_s and not stop.is_set() and pipe.alive():
        time.sleep(0.5)
        for row in sampler.rows[seen:]:
            zero_in_a_row = zero_in_a_row + 1 if row.get("lag_offsets", 1) == 0 else 0
        seen = len(sampler.rows)
        if zero_in_a_row >= 2:
            return time.monotonic() - start
    return None


def _settle(profile: Profile, pipe: PipelineProcess, stop: threading.Event) -> None:
    """Wait for the session timeout plus two triggers, so sessions left open by the load are closed."""
    timeout_ms = parse_trigger(profile.pipeline.session_timeout) or 0
    trigger_ms = parse_trigger(profile.pipeline.trigger) or 1000
    deadline = time.monotonic() + (timeout_ms + 3 * trigger_ms) / 1000.0
    while time.monotonic() < deadline and not stop.is_set() and pipe.alive():
        time.sleep(0.25)


class _SimulatorProbe:
    """The simulator's counters as sampler columns."""

    def __init__(self, simulator: Simulator) -> None:
        self._sim = simulator

    def sample(self) -> dict[str, Any]:
        s = self._sim.stats()
        return {
            "planned": s.planned,
            "sent": s.sent,
            "acked": s.acked,
            "failed": s.failed,
            "lateness_p99_ms": s.lateness_p99_ms,
            "faults_injected": sum(s.faults.values()),
        }


# ------------------------------------------------------------------------------------------ results


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=["t", "ts", "phase"])


def _rate(df: pd.DataFrame, column: str) -> list[float]:
    if column not in df or df.empty:
        return [0.0] * len(df)
    values = df[column].ffill().fillna(0).to_numpy(dtype=float)
    dt = np.diff(df["ts"].to_numpy(dtype=float), prepend=np.nan)
    rate = np.diff(values, prepend=values[0]) / np.where(dt > 0, dt, np.nan)
    return [float(x) if np.isfinite(x) else 0.0 for x in rate]


def _series(df: pd.DataFrame, t0_s: float) -> tuple[list[Series], list[Series], list[Series]]:
    t = [float(x) for x in (df["ts"].to_numpy(dtype=float) - t0_s)] if not df.empty else []
    throughput = [
        Series("produced", "msg/s", t, _rate(df, "sent"), "simulator"),
        Series("acknowledged", "msg/s", t, _rate(df, "acked"), "broker"),
        Series("consumed", "msg/s", t, _rate(df, "consumed"), "pipeline"),
        Series("written", "rows/s", t, _rate(df, "written_changes"), "pipeline"),
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
    resources = [Series(f"cpu_{c}", "% of a core", t, col(f"cpu_{c}"), c) for c in COMPONENTS] + [
        Series(f"rss_{c}", "MB", t, col(f"rss_mb_{c}"), c) for c in COMPONENTS
    ]
    return throughput, lag, resources


def _steady(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["phase"] == "steady"] if "phase" in df else df.iloc[0:0]


def _resources(df: pd.DataFrame) -> list[ResourceUsage]:
    steady = _steady(df)
    out = []
    for c in COMPONENTS:
        cpu, rss = f"cpu_{c}", f"rss_mb_{c}"
        if cpu not in steady or steady.empty:
            continue
        out.append(
            ResourceUsage(
                c,
                float(steady[cpu].mean()),
                float(steady[cpu].max()),
                float(steady[rss].mean()),
                float(steady[rss].max()),
            )
        )
    return out


def _latencies(run_dir: Path, output: Path) -> tuple[list[LatencySummary], list[Series], float]:
    """End-to-end, publish and schedule-lateness percentiles, and e2e p99 over time."""
    ledger = read_ledger(run_dir)
    summaries: list[LatencySummary] = []
    series: list[Series] = []
    e2e = end_to_end(ledger, read_output(output))
    t0 = float(ledger["intended_ts"].min()) / 1000.0 if not ledger.empty else 0.0
    if not e2e.empty:
        summaries.append(latency_summary("end_to_end", e2e["latency_ms"].to_numpy()))
        buckets = ((e2e["committed_ms"] / 1000.0 - t0) // 5 * 5).astype(float)
        grouped = e2e.groupby(buckets)["latency_ms"]
        series.append(
            Series(
                "e2e_p50",
                "ms",
                list(grouped.median().index),
                [float(v) for v in grouped.median()],
                "pipeline",
            )
        )
        q99 = grouped.quantile(0.99)
        series.append(Series("e2e_p99", "ms", list(q99.index), [float(v) for v in q99], "pipeline"))
    sent = ledger[(ledger["fault"] == "none") & ledger["sent_ts"].notna()]
    if not sent.empty:
        lateness = (sent["sent_ts"] - sent["intended_ts"]).to_numpy(dtype=float)
        summaries.append(latency_summary("schedule_lateness", np.clip(lateness, 0, None)))
    if "acked_ts" in ledger:
        acked = ledger[ledger["acked_ts"].notna() & ledger["sent_ts"].notna()]
        if not acked.empty:
            summaries.append(
                latency_summary("publish", (acked["acked_ts"] - acked["sent_ts"]).to_numpy(dtype=float))
            )
    return summaries, series, t0


def _time_breakdown(progress_path: Path, steady_from_ms: int, steady_to_ms: int) -> dict[str, float]:
    """Mean milliseconds per micro-batch in the steady phase, by step of Spark's trigger."""
    rows = []
    if progress_path.is_file():
        for line in progress_path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            ts = pd.Timestamp(rec.get("timestamp")).value // 1_000_000 if rec.get("timestamp") else 0
            if steady_from_ms <= ts <= steady_to_ms and input_messages(rec) > 0:
                rows.append(rec)
    if not rows:
        return {}
    keys = {
        "latestOffset": "find new offsets (broker)",
        "getBatch": "plan the batch",
        "addBatch": "read + rebuild + write",
        "walCommit": "checkpoint offsets",
        "commitOffsets": "checkpoint commit",
        "triggerExecution": "whole trigger",
    }
    out: dict[str, float] = {}
    for key, name in keys.items():
        values = [float((r.get("durationMs") or {}).get(key, 0)) for r in rows]
        out[name] = float(np.mean(values))
    state = [(r.get("stateOperators") or [{}])[0] for r in rows]
    out["stateful step: update"] = float(np.mean([float(s.get("allUpdatesTimeMs", 0)) for s in state]))
    out["stateful step: commit"] = float(np.mean([float(s.get("commitTimeMs", 0)) for s in state]))
    return out


def _results(
    request: RunRequest,
    kafka: KafkaConfig,
    clock: _Clock,
    rows: list[dict[str, Any]],
    correctness: Correctness,
    drain_s: float | None,
    pipeline_failed: str | None,
    interrupted: bool,
) -> Results:
    profile = request.profile
    df = _frame(rows)
    t0_s = clock.started_ms / 1000.0
    throughput, lag, resource_series = _series(df, t0_s)
    latency, latency_series, _ = _latencies(request.run_dir, request.run_dir / "pipeline" / "output")
    steady = _steady(df)
    steady_phase = next((p for p in clock.phases if p.name == "steady"), None)

    def steady_rate(column: str) -> float:
        if steady.empty or column not in steady or len(steady) < 2:
            return 0.0
        span = float(steady["ts"].iloc[-1] - steady["ts"].iloc[0])
        return float(steady[column].iloc[-1] - steady[column].iloc[0]) / span if span > 0 else 0.0

    lag_age = steady["lag_age_s"].dropna() if "lag_age_s" in steady else pd.Series(dtype=float)
    summary: dict[str, float] = {
        "target_rate": request.target_rate,
        "produced_rate": steady_rate("sent"),
        "acked_rate": steady_rate("acked"),
        "consumed_rate": steady_rate("consumed"),
        "written_rate": steady_rate("written_changes"),
        "lag_age_p95_s": float(lag_age.quantile(0.95)) if not lag_age.empty else float("nan"),
        "lag_age_max_s": float(lag_age.max()) if not lag_age.empty else float("nan"),
        "lag_offsets_max": float(steady["lag_offsets"].max())
        if "lag_offsets" in steady and len(steady)
        else 0.0,
        "drain_s": float("nan") if drain_s is None else drain_s,
    }
    for lat in latency:
        summary[f"{lat.name}_p99_ms"] = lat.p99
    reasons: list[str] = []
    if interrupted:
        reasons.append("the run was interrupted (Ctrl-C); results are partial")
    if pipeline_failed and not correctness.must_stop:
        reasons.append(pipeline_failed)
    if drain_s is None and not interrupted and pipeline_failed is None:
        reasons.append(
            f"the pipeline did not catch up within {profile.run.drain_max_s:g} s after the load stopped"
        )
    if summary["lag_age_p95_s"] > profile.run.max_lag_s:
        reasons.append(
            f"lag during the steady phase: p95 age of the oldest unprocessed message "
            f"{summary['lag_age_p95_s']:.1f} s > {profile.run.max_lag_s:g} s"
        )
    if summary["produced_rate"] < 0.9 * request.target_rate and not interrupted:
        reasons.append(
            f"the simulator produced {summary['produced_rate']:,.0f} msg/s, under 90% of the "
            f"{request.target_rate:,.0f} msg/s asked for: the load generator or broker is the bottleneck"
        )
    if not correctness.passed:
        reasons += [f"correctness: {r}" for r in correctness.reasons] or ["correctness checks failed"]
    verdict = Verdict("FAIL" if reasons else "PASS", reasons)
    progress_path = request.run_dir / "pipeline" / "output" / "progress.jsonl"
    breakdown = (
        _time_breakdown(progress_path, steady_phase.start_ms, steady_phase.end_ms) if steady_phase else {}
    )
    summary.update({f"time_ms: {k}": v for k, v in breakdown.items()})
    harness_cpu = float(df["harness_cpu_s"].iloc[-1]) if "harness_cpu_s" in df and len(df) else 0.0
    wall = max(1e-9, (clock.phases[-1].end_ms - clock.phases[0].start_ms) / 1000.0) if clock.phases else 1.0
    import sotw

    return Results(
        run=RunInfo(
            run_id=request.run_dir.name,
            started_ms=clock.started_ms,
            ended_ms=int(time.time() * 1000),
            load_factor=request.load_factor,
            policy=profile.pipeline.policy,
            profile_name=profile.name,
            profile=profile.as_dict(),
            command=request.command,
            bootstrap=kafka.bootstrap,
            host={
                "machine": platform.machine(),
                "cpus": os.cpu_count() or 0,
                "python": platform.python_version(),
            },
            versions={"sotw": sotw.__version__, "results_schema": str(SCHEMA_VERSION)},
            interrupted=interrupted,
        ),
        verdict=verdict,
        phases=clock.phases,
        throughput=throughput,
        lag=lag,
        latency_series=latency_series,
        latency=latency,
        resources=_resources(df),
        resource_series=resource_series,
        summary=summary,
        correctness=correctness,
        harness_overhead={
            "sampler_cpu_s": harness_cpu,
            "sampler_cpu_percent_of_a_core": 100.0 * harness_cpu / wall,
            "samples": float(len(df)),
        },
    )

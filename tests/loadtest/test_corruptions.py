"""The verifier checks itself: every single corruption of a real faulted run's output must FAIL.

One small simulation meets every fault kind (gap, duplicate, delayed, malformed, abandon) after a clean
start, so that a ``strict`` pipeline commits whole sessions before its first violation stops it. sotw's own
pipeline writes it under each policy (``availableNow``, so session timeouts never fire and the verifier is
told ``timeouts_expire=False``), and a team's job (``jobs/plain_kafka_job.py --mode highest-seq``) writes its
final table (the tables contract). ``tests/loadtest/corruptions.py`` applies one corruption at a time to a
copy of each output; the untouched output must PASS and every corruption that is wrong under the contract
and the policy must FAIL, verified whole and a few sensors at a time (``shard_rows``). What a policy allows is
listed with its rule, not verified. Each test prints its table (``pytest -s``) and puts it, with every
uncaught corruption, in its assertion message.

The fast form (``make test``) runs sotw's pipeline under ``ordered`` only, and the team's job beside it. On
the 2-core machine the session's first streaming query pays for starting Spark's Python workers and state
store (the ``ordered`` run takes 14-21 s then, 4-6 s once they are up), and a verdict takes 0.2-0.4 s whole
and 0.5-0.7 s sharded. With one corruption of each kind the module took 28-36 s of its own (the simulation in
the fixture's setup, the two tests, the teardown; ``--durations``, while other test runs shared the machine),
about 22 s beyond that first start; a second policy would add 10-15 s. ``ordered`` is the one kept because its
output has every dataset, every violation kind and every fault's trace in it; ``strict`` (whose stop makes
what is allowed subtle), ``once``, ``window`` and ``none`` are in the long form. The fast form verifies
sharded too the untouched output and the corruptions the sensor partitions decide (a row under another sensor
or none, a dead letter, a commit marker). The long form (``slow``) runs every policy and applies every kind
and variant (and the other columns docs/loadtest.md says are checked) to many targets, whole and sharded.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from loadtest.correctness.policies import Policy
from pipeline import query
from pipeline.config import PipelineConfig
from pipeline.errors import IntegrityStopped
from pipeline.policies import PolicyConfig
from simulator import FaultConfig, Simulator, SimulatorConfig
from sotw.kafka import KafkaConfig, ensure_topics, topic_pattern
from tests.loadtest.corruptions import (
    FAST_KINDS,
    Corruption,
    FullRun,
    Outcome,
    TablesRun,
    full_corruptions,
    report,
    tables_corruptions,
    untouched,
    verify_corruptions,
)

JOB = Path(__file__).resolve().parent / "jobs" / "plain_kafka_job.py"

#: Seconds of schedule without faults, then every fault kind: strict commits whole sessions before it stops.
CLEAN_S = 0.45
FAULTS = FaultConfig(
    gap=0.03, duplicate=0.04, delayed=0.04, malformed=0.03, abandon=0.6, delay_ms=20, delay_max_ms=80
)
FAULT_KINDS = ("gap", "duplicate", "delayed", "malformed", "abandoned")
FLEET: dict[str, Any] = {
    "sensors": 2,
    "rows": 8,
    "partitions": 1,
    "rate": 400.0,
    "duration_s": 1.2,
    "session_interval_s": 0.4,
}
#: Each policy's pipeline settings and the verifier's model of it.
POLICIES: dict[str, dict[str, Any]] = {
    "ordered": {},
    "strict": {},
    "once": {},
    "window": {"window_messages": 3},
    "none": {},
}
#: Offsets a micro-batch reads at most: several batches, so a marker removed hides only part of the output;
#: strict's smaller batches commit the clean start before the batch that meets the first fault.
BATCH_OFFSETS = {"strict": 90}
DEFAULT_BATCH_OFFSETS = 250

#: Fast form: the kinds also verified sharded, those whose reading depends on the sensor partitions.
SHARDED_IN_FAST_FORM = frozenset(
    {
        "move a change row to another sensor",
        "null a change row's session",
        "add a dead letter for a valid message",
        "remove a commit marker",
    }
)
#: Long form: targets per kind (different sessions and seqs).
MANY = 6


@dataclass
class FaultedRun:
    """One simulation with every fault kind, and the outputs of the jobs run over it (each made once)."""

    kafka: KafkaConfig
    spark: Any
    base: Path
    run_dir: Path
    prefix: str
    faults: dict[str, int]
    fulls: dict[str, FullRun] = field(default_factory=dict)
    table: TablesRun | None = None
    team: tuple[subprocess.Popen[bytes], str, Path] | None = None

    def full(self, policy: str) -> FullRun:
        """sotw's pipeline's output under ``policy`` (full contract), run once."""
        if policy not in self.fulls:
            settings = POLICIES[policy]
            where = self.base / policy
            cfg = PipelineConfig(
                kafka=self.kafka,
                output=where / "output",
                checkpoint=where / "checkpoint",
                pattern=topic_pattern(self.prefix),
                policy=PolicyConfig(policy, **settings),
                trigger_ms=None,  # availableNow: drain the run in a few batches, then stop
                max_offsets_per_trigger=BATCH_OFFSETS.get(policy, DEFAULT_BATCH_OFFSETS),
                discovery_interval_ms=0,
            )
            stopped, error = False, ""
            started = time.monotonic()
            try:
                query.run(self.spark, cfg)
            except IntegrityStopped as exc:
                stopped, error = True, str(exc)
            print(f"\n{policy}: the pipeline ran {time.monotonic() - started:.1f} s")
            assert stopped == (policy == "strict"), f"{policy}: stopped={stopped} {error}"
            verifier = Policy(policy, timeouts_expire=False, **settings)
            self.fulls[policy] = FullRun(policy, self.run_dir, cfg.output, verifier, stopped, error)
        return self.fulls[policy]

    def start_team_job(self) -> None:
        """Start the team's job at once: it reads the run while the pipeline runs, and ``tables`` collects it."""
        out = self.base / "team" / "table"
        group = f"corruptions-{uuid.uuid4().hex[:8]}"
        argv = [sys.executable, str(JOB), "--bootstrap", self.kafka.bootstrap]
        argv += ["--topics", topic_pattern(self.prefix), "--out", str(out), "--group", group]
        argv += ["--mode", "highest-seq", "--flush-ms", "200"]
        with (self.base / "team.log").open("w") as log:
            self.team = (subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT), group, out)

    def tables(self) -> TablesRun:
        """A correct team job's final table, once it has read every message."""
        if self.table is None:
            if self.team is None:
                self.start_team_job()
            assert self.team is not None
            job, group, out = self.team
            try:
                wait_until_consumed(self.kafka, group, self.prefix, job)
            finally:
                job.send_signal(signal.SIGTERM)
                job.wait(60)
            assert job.returncode == 0, (self.base / "team.log").read_text()[-2000:]
            self.table = TablesRun("tables", self.run_dir, out)
        return self.table

    def stop_team_job(self) -> None:
        if self.team is not None and self.team[0].poll() is None:
            self.team[0].kill()
            self.team[0].wait(10)


def simulate(kafka: KafkaConfig, run_dir: Path, prefix: str) -> dict[str, int]:
    """The simulation: ``CLEAN_S`` seconds without faults, then ``FAULTS``; the faults injected by kind."""
    sim = Simulator(SimulatorConfig(topic_prefix=prefix, seed=5, **FLEET), kafka, run_dir)
    done = threading.Event()

    def faults_on() -> None:
        while not done.is_set() and sim.stats().elapsed_s < CLEAN_S:
            time.sleep(0.005)
        sim.set_faults(FAULTS)

    switch = threading.Thread(target=faults_on, daemon=True)
    switch.start()
    try:
        summary = sim.run()
    finally:
        done.set()
        switch.join()
    return dict(summary.stats.faults)


def wait_until_consumed(
    kafka: KafkaConfig, group: str, prefix: str, job: subprocess.Popen[bytes], timeout_s: float = 90.0
) -> None:
    """Until the job's group has committed the end of every partition of the run's topics."""
    watcher = Consumer(kafka.client(**{"group.id": group, "enable.auto.commit": False}))
    try:
        topics = [t for t in watcher.list_topics(timeout=10).topics if t.startswith(prefix)]
        partitions = [
            TopicPartition(t, p)
            for t in topics
            for p in watcher.list_topics(t, timeout=10).topics[t].partitions
        ]
        ends = {
            (tp.topic, tp.partition): watcher.get_watermark_offsets(tp, timeout=10)[1] for tp in partitions
        }
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert job.poll() is None, f"the team's job exited with code {job.returncode}"
            done = watcher.committed(partitions, timeout=10)
            if all(tp.offset >= ends[(tp.topic, tp.partition)] for tp in done):
                return
            time.sleep(0.1)
        raise AssertionError(f"the team's job did not consume {ends} within {timeout_s} s")
    finally:
        watcher.close()


@pytest.fixture(scope="module")
def faulted(kafka: KafkaConfig, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultedRun]:
    base = tmp_path_factory.mktemp("corruptions")
    started = time.monotonic()
    for attempt in range(3):
        prefix = f"c{uuid.uuid4().hex[:6]}-sensor-"
        run_dir = base / f"sim{attempt}"
        # The long form outlasts the local broker's 10-minute retention: the run's topics keep their data.
        keep = {"retention.ms": "-1", "retention.bytes": "-1"}
        ensure_topics(
            kafka,
            {f"{prefix}{i:04d}": FLEET["partitions"] for i in range(FLEET["sensors"])},
            topic_config=keep,
        )
        faults = simulate(kafka, run_dir, prefix)
        if all(faults.get(k, 0) for k in FAULT_KINDS):
            break
    assert all(faults.get(k, 0) for k in FAULT_KINDS), f"the simulation must meet every fault kind: {faults}"
    print(f"\nsimulated in {time.monotonic() - started:.1f} s: {faults}")
    run = FaultedRun(kafka, spark, base, run_dir, prefix, faults)
    run.start_team_job()
    yield run
    run.stop_team_job()


def judge(
    runs: list[FullRun | TablesRun],
    make: Callable[[Any], list[Corruption]],
    scratch: Path,
    sharded: Callable[[Corruption], bool],
    untouched_sharded: bool = True,
) -> tuple[list[Outcome], str]:
    """The untouched outputs' and every corruption's outcomes, and the report of them."""
    outcomes: list[Outcome] = []
    for run in runs:
        started = time.monotonic()
        baseline = untouched(run, sharded=untouched_sharded and isinstance(run, FullRun))
        outcomes.append(baseline)
        corruptions = make(run)
        made = time.monotonic()
        outcomes += verify_corruptions(
            corruptions, run, scratch / run.name, sharded=sharded, baseline=baseline
        )
        print(
            f"\n{run.name}: {len(corruptions)} corruptions made in {made - started:.1f} s (untouched verified), "
            f"verified in {time.monotonic() - made:.1f} s"
        )
    text = report(outcomes, [r.name for r in runs])
    print("\n" + text)
    return outcomes, text


def misses(outcomes: list[Outcome]) -> list[Outcome]:
    return [o for o in outcomes if o.misses()]


def kinds_of(outcomes: list[Outcome]) -> set[str]:
    return {o.corruption.kind for o in outcomes}


# ------------------------------------------------------------------------------------------- fast form


def test_every_single_corruption_of_a_faulted_ordered_run_fails_and_the_untouched_output_passes(
    faulted: FaultedRun, tmp_path: Path
) -> None:
    run = faulted.full("ordered")
    outcomes, text = judge(
        [run],
        lambda r: full_corruptions(r, 1, kinds=FAST_KINDS),
        tmp_path,
        lambda c: c.kind in SHARDED_IN_FAST_FORM,
    )

    assert len(kinds_of(outcomes)) == 1 + len(FAST_KINDS), text  # every kind met a target, and the untouched
    assert not misses(outcomes), text


def test_every_single_corruption_of_a_team_job_s_final_table_fails_and_an_exact_decimal_passes(
    faulted: FaultedRun, tmp_path: Path
) -> None:
    run = faulted.tables()
    outcomes, text = judge([run], lambda r: tables_corruptions(r, 1), tmp_path, lambda c: False)

    assert kinds_of(outcomes) == {
        "untouched output (must PASS)",
        "drop a row",
        "duplicate a row",
        "change a value",
        "add a row",
        "move a row to another session",
        "write a float as an exact decimal (no corruption)",
    }, text
    assert not misses(outcomes), text


# ------------------------------------------------------------------------------------------- long form


@pytest.mark.slow
@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_corruption_of_every_kind_on_many_targets_fails_under_each_policy_whole_and_sharded(
    faulted: FaultedRun, tmp_path: Path, policy: str
) -> None:
    run = faulted.full(policy)
    if policy == "strict":
        assert run.stopped and len(run.markers) > 1 and run.recorded, (
            "strict must stop at its first violation after committing whole sessions of the clean start"
        )
    outcomes, text = judge([run], lambda r: full_corruptions(r, MANY), tmp_path, lambda c: True)

    assert all(o.corruption.allowed for o in outcomes if o.skipped), text
    assert not misses(outcomes), text


@pytest.mark.slow
def test_every_corruption_of_a_team_job_s_final_table_on_many_targets_fails(
    faulted: FaultedRun, tmp_path: Path
) -> None:
    run = faulted.tables()
    outcomes, text = judge([run], lambda r: tables_corruptions(r, 2 * MANY), tmp_path, lambda c: False)

    assert not misses(outcomes), text

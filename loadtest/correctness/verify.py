"""The independent correctness verdict: the pipeline's output against the ledger's expectation.

``loadtest.correctness.expect`` says what a correct pipeline must write under the run's policy; this module reads what
the pipeline did write (with pyarrow and delta-rs, not Spark, so the verdict does not share the system under
test's machinery), compares session by session and message by message, scores the detection of injected
faults, triages every discrepancy to a layer, and summarises it all as a ``results.Correctness``. In sotw's
Parquet layout only batches whose ``_commits/<batch>.json`` marker exists are read: anything else is not
visible output; a Delta table shows only what it committed. An output under the tables contract (final
tables only) is judged by ``loadtest.correctness.contracts``; ``verify_run`` chooses, and verifies a long run a
few sensors at a time (``loadtest.correctness.shards``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import pyarrow.dataset as ds

from loadtest.correctness.checks import (
    check_broker_kept,
    check_dead_letters,
    check_delivery,
    check_placement,
    check_timeouts,
    check_values,
    faults_delivered,
    score_faults,
)
from loadtest.correctness.contracts import verify_tables
from loadtest.correctness.expect import (
    Expectation,
    build_expectation,
    read_ledger,
    read_truth,
    relax_after_data_loss,
    with_partition_ends,
)
from loadtest.correctness.output import PipelineOutput, read_output
from loadtest.correctness.outputspec import COMMIT_SOURCES, OutputSpec
from loadtest.correctness.policies import Policy
from loadtest.correctness.sessions import check_sessions, observed_events
from loadtest.correctness.shards import (
    SHARD_ROWS,
    Shard,
    merge,
    of_sessions,
    outside,
    plan_shards,
    plus,
    summarise,
)
from loadtest.correctness.stops import (
    FoundStop,
    JobExit,
    StopExpected,
    judge_stop,
    last_batch,
    policy_stop,
    policy_stops,
    stop_expected,
)
from loadtest.correctness.tables import read_tables, read_truth_tables
from loadtest.correctness.tally import Tally, ratio
from loadtest.correctness.triage import READ_BACK_LIMIT, Triager
from loadtest.correctness.values import read_snapshots
from loadtest.reports.results import Correctness, Discrepancy
from sotw.kafka import KafkaConfig

log = logging.getLogger(__name__)


def verify(
    expectation: Expectation,
    output: PipelineOutput,
    triager: Triager | None = None,
    job_exit: JobExit | None = None,
    *,
    judge_the_stop: bool = True,
) -> Correctness:
    """Compare the pipeline's output with the expectation and triage each discrepancy.

    Parameters
    ----------
    expectation
        From ``loadtest.correctness.expect.build_expectation``.
    output
        From ``read_output``.
    triager
        Names the layer at fault for each discrepancy; None triages from the ledger alone.
    job_exit
        How the job ended (``loadtest.correctness.stops``); None when not known. A job that stopped on its
        own after the broker lost data need not have read what the broker took after the loss
        (``loadtest.correctness.expect.relax_after_data_loss``); under ``strict`` the stop is judged by
        what its integrity output names (``loadtest.correctness.stops``).
    judge_the_stop
        False leaves the strict stop to the caller: a long run's shards judge it once, over all of them.
    """
    if job_exit is not None and job_exit.on_its_own:
        expectation = relax_after_data_loss(expectation)
    own = triager or Triager(expectation.ledger, kafka=None)
    delivered = expectation.ledger.dropna(subset=["offset", "partition"])
    ends = own.partition_ends(
        sorted(set(zip(delivered["topic"], delivered["partition"].astype(int), strict=True)))
    )
    if ends:
        expectation = with_partition_ends(expectation, ends)
    own.gave_away(expectation.overwritten.index)
    tally = Tally()
    events, invalid = observed_events(output.integrity, expectation.top_seqs)
    stops = policy_stops(expectation, events, output.integrity)
    found = stops[0] if stops else None
    check_sessions(expectation, output, tally, events, invalid)
    check_placement(expectation, output, tally)
    check_values(expectation, output.changes, tally)
    check_timeouts(expectation, output, tally)
    score_faults(expectation, tally)
    check_dead_letters(expectation, output, tally, stops)
    check_delivery(expectation, tally)
    check_broker_kept(expectation, tally)
    discrepancies = own.triage_all(tally.discrepancies)
    if judge_the_stop:
        discrepancies += judge_stop(stop_expected(expectation), found, job_exit, last_batch(output))
    return _correctness(expectation, tally, discrepancies, found.text if found is not None else None)


def _correctness(
    exp: Expectation, tally: Tally, discrepancies: list[Discrepancy], stop: str | None
) -> Correctness:
    required, exact = tally.counts["exact_required"], tally.counts["exact"]
    return Correctness(
        policy=exp.policy.name,
        passed=not discrepancies,
        sessions_expected=len(exp.sessions),
        sessions_exact_required=required,
        sessions_exact=exact,
        exact_match_rate=ratio(exact, required),
        rows_expected=tally.counts["rows_expected"],
        rows_written=tally.counts["rows_written"],
        rows_lost=tally.counts["rows_lost"],
        rows_repeated=tally.counts["rows_repeated"],
        rows_unexpected=tally.counts["rows_unexpected"],
        rows_wrong=tally.counts["rows_wrong"],
        rows_values_checked=tally.counts["rows_values_checked"],
        malformed_sent=len(exp.malformed),
        malformed_quarantined=tally.counts["malformed_quarantined"],
        must_stop=exp.must_stop,
        statuses=dict(tally.statuses),
        faults=tally.faults,
        damage=tally.damage,
        discrepancies=discrepancies,
        sessions_judged=tally.counts["sessions_judged"],
        faults_delivered=faults_delivered(exp.ledger),
        policy_stop=stop,
        **summarise(discrepancies),
    )


def verify_run(
    run_dir: Path,
    output: Path | OutputSpec,
    policy: Policy,
    kafka: KafkaConfig | None = None,
    job_exit: JobExit | None = None,
    progress: Callable[[str], None] | None = None,
    shard_rows: int = SHARD_ROWS,
) -> Correctness:
    """Verify one run directory's ledger and truth against an output, reading Kafka for triage.

    ``output`` is an output root read under the full contract, or an ``OutputSpec`` naming the contract and
    format (``loadtest.correctness.contracts``), and, for an output several runs share, the run's topic
    prefix; under the tables contract ``policy`` is used only to judge a strict job's stop.

    A Parquet output under the full contract of a run with more than ``shard_rows`` ledger rows is verified a
    few sensors at a time (``loadtest.correctness.shards``), so that memory follows ``shard_rows`` and not
    the run's length; ``progress`` hears each shard. A Delta output and the tables contract are read whole:
    the tables contract's tables are not partitioned by sensor, and a Delta table is read through its log.
    """
    spec = output if isinstance(output, OutputSpec) else OutputSpec(output)
    fmt = spec.resolved_format()
    shards = plan_shards(run_dir, shard_rows) if spec.contract == "full" and fmt == "parquet" else []
    if len(shards) > 1:
        sharded = _Shards(run_dir, spec, policy, kafka, job_exit, progress or log.info)
        return replace(sharded.verify(shards), output_format=fmt, latency_source=COMMIT_SOURCES["markers"])
    ledger = read_ledger(run_dir)
    with Triager(ledger, kafka) as triager:
        if spec.contract == "tables":
            tables = read_tables(spec)
            correctness, found = verify_tables(
                ledger,
                read_truth(run_dir),
                read_truth_tables(run_dir),
                tables,
                read_snapshots(run_dir),
                strict=policy.name == "strict",
                job_exit=job_exit,
            )
            source = tables.commit_source
            discrepancies = triager.triage_all(found)
            blame = Counter(d.triage.layer for d in discrepancies if d.triage is not None)
            correctness = replace(
                correctness,
                discrepancies=discrepancies,
                blame=dict(blame),
                faults_delivered=faults_delivered(ledger),
            )
        else:
            expectation = build_expectation(policy, ledger, read_truth(run_dir), read_snapshots(run_dir))
            output_read = read_output(spec.path, fmt, topic_prefix=spec.topic_prefix)
            correctness = verify(expectation, output_read, triager, job_exit)
            source = "delta" if fmt == "delta" else "markers"
    return replace(correctness, output_format=fmt, latency_source=COMMIT_SOURCES[source])


class _Verdict(NamedTuple):
    correctness: Correctness
    injected: Counter[str]
    must: StopExpected | None
    stop: FoundStop | None
    last: int | None


class _Shards:
    """``verify`` over a run's shards of sensors, one at a time, their verdicts merged (``shards.merge``).

    Each shard reads only its sensors' ledger, truth and output. Output rows no shard's reader finds (filed
    under a sensor the ledger lacks, or none, or under a sensor whose sessions do not include theirs) are
    read once, beforehand: each goes with the shard that has its session, and the rest (with dead letters of
    topics the run never had) are checked last against no ledger, as the whole run would find them. Kafka
    is read back for at most ``READ_BACK_LIMIT`` discrepancies over all the shards; a strict stop is judged
    once, over all of them.
    """

    def __init__(
        self,
        run_dir: Path,
        spec: OutputSpec,
        policy: Policy,
        kafka: KafkaConfig | None,
        job_exit: JobExit | None,
        say: Callable[[str], None],
    ) -> None:
        self.run_dir, self.spec, self.policy, self.kafka = run_dir, spec, policy, kafka
        self.job_exit = job_exit
        self.say = say
        self.read_back_left = READ_BACK_LIMIT
        self.stray = PipelineOutput(pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), pd.DataFrame())
        self.sessions: set[str] = set()

    def _read(self, where: dict[str, ds.Expression]) -> PipelineOutput:
        return read_output(self.spec.path, "parquet", where, topic_prefix=self.spec.topic_prefix)

    def verify(self, shards: Sequence[Shard]) -> Correctness:
        """The run's verdict, from every shard's."""
        self.stray = self._read(outside(shards))
        sensors = shards[-1].last
        verdicts = []
        for i, shard in enumerate(shards, 1):
            self.say(f"verifying {shard.named()} of {sensors} (shard {i} of {len(shards)})")
            verdicts.append(self._one(shard))
        # Under strict one session's violation must stop the query, which relaxes every other session.
        if any(v.correctness.must_stop for v in verdicts):
            for i, shard in enumerate(shards):
                if not verdicts[i].correctness.must_stop:
                    self.say(f"verifying {shard.named()} again: a session elsewhere must stop the query")
                    verdicts[i] = self._one(shard, stops_elsewhere=True)
        rest = of_sessions(self.stray, self.sessions, others=True)
        if any(not f.empty for f in (rest.changes, rest.sessions, rest.integrity, rest.dead_letters)):
            self.say("verifying the output of sensors the ledger does not have")
            verdicts.append(self._one(Shard((), (), 0, 0, 0), rest))
        injected = sum((v.injected for v in verdicts), Counter[str]())
        merged = merge([v.correctness for v in verdicts], injected)
        must = min(
            (v.must for v in verdicts if v.must is not None),
            key=lambda m: (m.after_loss, m.session),
            default=None,
        )
        found = min((v.stop for v in verdicts if v.stop is not None), key=lambda f: f.session, default=None)
        last = max((v.last for v in verdicts if v.last is not None), default=None)
        stops = judge_stop(must, found, self.job_exit, last)
        stop = found.text if found is not None else None
        if not stops:
            return replace(merged, policy_stop=stop)
        discrepancies = [*merged.discrepancies, *stops]
        return replace(
            merged, passed=False, policy_stop=stop, discrepancies=discrepancies, **summarise(discrepancies)
        )

    def _one(
        self, shard: Shard, output: PipelineOutput | None = None, stops_elsewhere: bool = False
    ) -> _Verdict:
        """One shard's verdict; its frames are freed on return."""
        ledger = read_ledger(self.run_dir, shard.sensors)
        truth = read_truth(self.run_dir, shard.sensors)
        snapshots = read_snapshots(self.run_dir, shard.sensors)
        expectation = build_expectation(self.policy, ledger, truth, snapshots, stops_elsewhere)
        if output is None:
            mine = set(ledger["session"].astype(str).unique())
            self.sessions |= mine
            output = plus(self._read(shard.where()), of_sessions(self.stray, mine))
        with Triager(ledger, self.kafka, limit=self.read_back_left) as triager:
            correctness = verify(expectation, output, triager, self.job_exit, judge_the_stop=False)
            self.read_back_left -= triager.read_back
        events, _ = observed_events(output.integrity, expectation.top_seqs)
        return _Verdict(
            correctness,
            Counter(expectation.injected),
            stop_expected(expectation),
            policy_stop(expectation, events, output.integrity),
            last_batch(output),
        )

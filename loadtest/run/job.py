"""Which job a run tests, and how the harness watches it: the one place those choices are made.

By default the job is sotw's own pipeline. ``JobSpec`` describes any other: a command template the harness
starts, stops, kills and restarts (``--pipeline-cmd``) or a job already running (``--attach``); where its
position is read for lag (its Spark checkpoint, or its consumer group's committed offsets: ``--lag-from``);
and which output contract and format the verifier reads (``--contract``, ``--format``; ``--format topic``:
a Kafka topic, ``--output-topic``). ``job_parts`` turns it into the process, the probes and the output a run
uses (``loadtest.run.driver``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.correctness.outputspec import FULL_DATASETS, OutputSpec
from loadtest.correctness.topicoutput import TopicOutputProbe, create_output_topic
from loadtest.errors import HarnessError
from loadtest.gameday.incident import Incident
from loadtest.measure.lag import CheckpointLag, GroupLag, KafkaLagProbe, LagSource
from loadtest.measure.outputs import (
    CheckpointProbe,
    DeltaOutputProbe,
    FilesOutputProbe,
    OutputProbe,
    ProgressProbe,
)
from loadtest.measure.samplers import Probe
from loadtest.run.processes import AttachedPipeline, CommandTemplate, PipelineProcess, PipelineProcessConfig
from loadtest.run.profile import Profile
from sotw.errors import SotwError
from sotw.kafka import KafkaConfig, topic_pattern
from sotw.topics import output_topic

# Incidents that act on the pipeline process: a job the harness attached to cannot take them.
_PROCESS_INCIDENTS = frozenset({"pipeline_kill", "pipeline_restart"})


@dataclass(frozen=True)
class LagFrom:
    """Where a job's position is read: ``checkpoint`` (a Spark checkpoint directory) or ``group`` (a group id)."""

    kind: str
    value: str

    @classmethod
    def parse(cls, text: str) -> LagFrom:
        """``checkpoint:PATH`` or ``group:ID``.

        Raises
        ------
        HarnessError
            If ``text`` is neither.
        """
        kind, sep, value = text.partition(":")
        if not sep or kind not in ("checkpoint", "group") or not value:
            raise HarnessError(f"--lag-from must be checkpoint:PATH or group:ID, got {text!r}")
        return cls(kind, value)


@dataclass(frozen=True)
class JobSpec:
    """The job under test when it is not ``sotw pipeline`` (or sotw's with another output contract).

    Parameters
    ----------
    command
        A command template (``loadtest.run.processes.PLACEHOLDERS``); None runs ``sotw pipeline``.
    attach
        The job already runs: the harness neither starts nor stops it. Needs ``output`` and ``lag_from``.
    output
        Where an attached job writes (a template job writes to ``{output}``, in the run directory).
    lag_from
        Where its position is read; None reads the checkpoint the template was given (``{checkpoint}``).
    contract, format
        How the verifier reads its output (``loadtest.correctness.contracts``).
    ignore_columns
        Tables contract: columns of the job's table that are not the rows' (``--ignore-column``).
    output_topic
        ``format = "topic"``: the topic the job writes its table to (``--output-topic``); None names it after
        the run (``sotw.topics.output_topic``), which an attached job cannot be told.
    """

    command: str | None = None
    attach: bool = False
    output: Path | None = None
    lag_from: LagFrom | None = None
    contract: str = "full"
    format: str = "auto"
    ignore_columns: tuple[str, ...] = ()
    output_topic: str | None = None

    def __post_init__(self) -> None:
        OutputSpec(Path("."), self.contract, self.format)  # checks both names
        if self.output_topic is not None and self.format != "topic":
            raise HarnessError("--output-topic names the topic of --format topic: pass --format topic too")
        if self.format == "topic" and self.attach and self.output_topic is None:
            raise HarnessError("--attach --format topic needs --output-topic: the topic the job writes to")
        if self.format == "topic" and self.output is not None:
            raise HarnessError("--format topic reads the job's table from --output-topic, not --output")
        if self.attach and self.command:
            raise HarnessError(
                "--attach and --pipeline-cmd exclude each other: attach to a running job, or start one"
            )
        if self.attach and (self.output is None or self.lag_from is None):
            raise HarnessError(
                "--attach needs --output (where the job writes) and --lag-from checkpoint:PATH or group:ID"
            )
        if self.command is not None:
            self.template()  # a bad template fails here, before any load

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-ready values (``from_dict`` reads them back)."""
        return {
            "command": self.command,
            "attach": self.attach,
            "output": str(self.output) if self.output is not None else None,
            "lag_from": f"{self.lag_from.kind}:{self.lag_from.value}" if self.lag_from is not None else None,
            "contract": self.contract,
            "format": self.format,
            "ignore_columns": list(self.ignore_columns),
            "output_topic": self.output_topic,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        """The spec ``to_dict`` wrote (checked again)."""
        return cls(
            command=data.get("command"),
            attach=bool(data.get("attach")),
            output=Path(data["output"]) if data.get("output") else None,
            lag_from=LagFrom.parse(data["lag_from"]) if data.get("lag_from") else None,
            contract=data.get("contract", "full"),
            format=data.get("format", "auto"),
            ignore_columns=tuple(data.get("ignore_columns") or ()),
            output_topic=data.get("output_topic"),
        )

    def template(self) -> CommandTemplate | None:
        """The checked command template, if there is one."""
        if self.command is None:
            return None
        need = "output" if self.format != "topic" else "output_topic" if self.output_topic is None else None
        return CommandTemplate(self.command, need_checkpoint=self.lag_from is None, need_output=need)

    def topic(self, prefix: str) -> str | None:
        """The output topic of a ``--format topic`` job in the run of topic prefix ``prefix``; else None.

        Raises
        ------
        HarnessError
            If the topic is one of the run's own (it starts with ``prefix``): the job, subscribed to the run's
            pattern, would read its own output, and its lag would count it.
        """
        if self.format != "topic":
            return None
        try:
            topic = self.output_topic or output_topic(prefix)
        except SotwError as exc:
            raise HarnessError(str(exc)) from None
        if topic.startswith(prefix):
            raise HarnessError(
                f"the output topic {topic} starts with the run's prefix {prefix}, so the run's pattern matches it: "
                "the job would read its own output. Name one outside it"
            )
        return topic

    def check_policy(self, policy: str) -> None:
        """Refuse, before the load, a strict stop that cannot be judged.

        Under the tables contract a strict job's stop is judged by its exit (docs/own-pipeline.md), which the
        harness does not see of a job it attached to.

        Raises
        ------
        HarnessError
            For ``--attach`` with ``--contract tables`` under ``strict``.
        """
        if self.attach and self.contract == "tables" and policy == "strict":
            raise HarnessError(
                "under strict a job writing the tables contract is judged by how it exits, which a job attached "
                "with --attach does not tell: run it with --pipeline-cmd, or write the full contract"
            )

    def check_incidents(self, incidents: tuple[Incident, ...]) -> None:
        """Refuse, before the load, incidents an attached job cannot take.

        Raises
        ------
        HarnessError
            Naming the first such incident.
        """
        if not self.attach:
            return
        for incident in incidents:
            if incident.kind in _PROCESS_INCIDENTS:
                raise HarnessError(
                    f"incident {incident.kind} kills or restarts the pipeline, which a job attached with --attach "
                    "cannot take: run the job with --pipeline-cmd instead"
                )


@dataclass
class JobParts:
    """What the runner needs of the job: its process, its output, and the probes that watch it."""

    process: PipelineProcess
    output: OutputSpec
    probes: dict[str, Probe]


def job_process(
    job: JobSpec | None,
    profile: Profile,
    kafka: KafkaConfig,
    root: Path,
    prefix: str,
    extra_args: tuple[str, ...],
    run_dir: Path | None = None,
    where: tuple[str, ...] = (),
) -> PipelineProcess:
    """The job's process, writing its output, checkpoint and log under ``root`` (not started).

    ``sotw pipeline`` (None, or a spec without a command), a template's command, or a job already running;
    ``where`` is the command prefix that starts it in another network namespace (``loadtest.run.hostnet``).
    """
    job = job or JobSpec()
    if job.command is None and not job.attach and job.format == "delta":
        extra_args = (*extra_args, "--format", "delta")
    config = PipelineProcessConfig(
        bootstrap=kafka.bootstrap,
        output=job.output or root / "output",
        checkpoint=root / "checkpoint",
        pattern=topic_pattern(prefix),
        settings=profile.pipeline,
        extra_args=extra_args,
        template=job.template(),
        prefix=prefix,
        run_dir=run_dir,
        kafka_settings=dict(kafka.settings),
        output_topic=job.topic(prefix) or "",
        where=where,
    )
    log_path = root / "pipeline.log"
    return AttachedPipeline(config, log_path) if job.attach else PipelineProcess(config, log_path)


def job_parts(
    job: JobSpec | None,
    profile: Profile,
    kafka: KafkaConfig,
    run_dir: Path,
    prefix: str,
    extra_args: tuple[str, ...],
    running: PipelineProcess | None = None,
    where: tuple[str, ...] = (),
) -> JobParts:
    """The process, output and probes for one run of ``job`` (None: ``sotw pipeline``).

    ``running`` is a process that serves several runs (a Locust session's own pipeline, or the job it
    attached to): its output holds every run's topics, so the run watches and verifies only its own
    (``prefix``).
    """
    job = job or JobSpec()
    root = run_dir / "pipeline"
    ours = job.command is None and not job.attach
    process = running or job_process(job, profile, kafka, root, prefix, extra_args, run_dir, where)
    config = process.config
    # A process serving several runs (a Locust session's) writes to the topic it was started with.
    topic = (config.output_topic or None) if job.format == "topic" else None
    if topic is not None:
        create_output_topic(kafka, topic)
    output = OutputSpec(
        config.output,
        job.contract,
        job.format,
        seen=root / "output_seen.json",
        ignored=job.ignore_columns,
        topic_prefix=prefix if running is not None or job.attach else None,
        topic=topic,
        kafka=kafka if topic is not None else None,
    )
    source: LagSource
    if job.lag_from is None:
        source = CheckpointLag(config.checkpoint)
    elif job.lag_from.kind == "checkpoint":
        source = CheckpointLag(Path(job.lag_from.value))
    else:
        source = GroupLag(kafka, job.lag_from.value)
    pattern = topic_pattern(prefix)
    probes: dict[str, Probe] = {"lag": KafkaLagProbe(kafka, pattern, source, report_consumed=not ours)}
    if ours:
        probes["progress"] = ProgressProbe(config.output / "progress.jsonl")
    elif isinstance(source, CheckpointLag):
        probes["checkpoint"] = CheckpointProbe(source.checkpoint)
    probes["output"] = _output_probe(output)
    return JobParts(process, output, probes)


def groups_of(job: JobSpec | None) -> tuple[str, ...]:
    """The job's own consumer group (``--lag-from group:ID``), if it has one, as a tuple.

    It is a Kafka Streams job's ``application.id``: the run's clean-up deletes the internal topics Streams
    named after it (``sotw.topics.delete_topics``).
    """
    if job is None or job.lag_from is None or job.lag_from.kind != "group":
        return ()
    return (job.lag_from.value,)


def _output_probe(output: OutputSpec) -> Probe:
    """Rows written, from sotw's markers, the Delta log, the Parquet files themselves, or the output topic.

    With ``format = "auto"`` the format shows only once the job has written, so both are watched until then.
    """
    if output.topic is not None and output.kafka is not None:
        return TopicOutputProbe(output.kafka, output.topic)
    if output.contract == "full":
        delta: Probe = DeltaOutputProbe({name: output.path / name for name in FULL_DATASETS})
        parquet: Probe = OutputProbe(output.path)
    else:
        assert output.seen is not None
        delta = DeltaOutputProbe({"changes": output.path})
        parquet = FilesOutputProbe(output.path, output.seen)
    if output.format != "auto":
        return delta if output.format == "delta" else parquet
    return _EitherProbe(output, delta, parquet)


class _EitherProbe:
    """The Delta probe once the output is a Delta table, the Parquet one otherwise."""

    def __init__(self, output: OutputSpec, delta: Probe, parquet: Probe) -> None:
        self._output = output
        self._delta = delta
        self._parquet = parquet

    def sample(self) -> dict[str, Any]:
        """Rows written so far."""
        probe = self._delta if self._output.resolved_format() == "delta" else self._parquet
        return probe.sample()

    def close(self) -> None:
        """Close the Parquet probe (it writes its files' first-seen times)."""
        close = getattr(self._parquet, "close", None)
        if close is not None:
            close()

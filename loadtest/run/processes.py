"""The pipeline as its own process, as it runs in production: start, watch, stop gracefully or kill -9.

The harness never runs Spark in its own process: a pipeline that falls over must not take the measurements
with it, and its CPU and memory must be attributable. The process is ``sotw pipeline`` by default, or any
team's job from a command template (``CommandTemplate``, ``--pipeline-cmd``), started, stopped, killed and
restarted the same way, drills included; ``AttachedPipeline`` stands for a job the harness did not start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import string
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from loadtest.errors import HarnessError
from loadtest.run.profile import PipelineSettings
from sotw.clientfiles import FILES, SettingsFiles
from sotw.errors import SotwError
from sotw.kafka import KafkaConfig

log = logging.getLogger(__name__)


PLACEHOLDERS: dict[str, str] = {
    "bootstrap": "the Kafka bootstrap address (HOST:PORT)",
    "pattern": "a regex matching exactly the run's topics (Spark's subscribePattern)",
    "prefix": "the run's topic prefix, for jobs that take a prefix rather than a regex",
    "output": "where the job must write (the harness reads it from there)",
    "output_topic": "--format topic: the Kafka topic the job must write its table to",
    "checkpoint": "the job's checkpoint directory (the harness reads its lag from there)",
    "run_dir": "the run directory",
    "python": "the Python interpreter running the harness (its Spark has the Kafka connector's and Delta's jars)",
    "jars": "the Kafka connector's and Delta's jars, comma-separated, for spark-submit --jars or spark.jars",
    "trigger": "the profile's micro-batch interval (1s, 500ms)",
    "trigger_ms": "the same in milliseconds",
    "session_timeout": "the profile's session timeout (20s)",
    "policy": "the profile's integrity policy (ordered, strict, ...)",
    "kafka_config": "a librdkafka settings file (key=value lines, as --kafka-config reads), mode 0600",
    "java_config": "the same settings in the Java client's names, bootstrap.servers included (.properties), mode 0600",
    "spark_options": "Spark's Kafka connector options (kafka.-prefixed Java names) as one JSON object, mode 0600",
}
"""The placeholders a ``--pipeline-cmd`` template may use (docs/own-pipeline.md lists them too)."""


@dataclass(frozen=True)
class CommandTemplate:
    """A team's pipeline command with ``{placeholders}`` the harness fills in for each run.

    The template is split like a shell would (``shlex``), then each word is filled in, so a path with
    spaces stays one argument; nothing goes through a shell.

    Parameters
    ----------
    text
        The template, e.g. ``spark-submit job.py --bootstrap {bootstrap} --topics {pattern} --out {output}
        --checkpoint {checkpoint}``.
    need_checkpoint
        Whether ``{checkpoint}`` is required (the harness reads the job's lag from its checkpoint).
    need_output
        The placeholder that tells the job where to write: ``output`` (files), ``output_topic`` (a topic
        named after the run), or None (a topic the user named with ``--output-topic``, written in the template).

    Raises
    ------
    HarnessError
        If the template cannot be split, uses an unknown or positional placeholder, or lacks one the harness
        needs (``{bootstrap}``, ``{pattern}`` or ``{prefix}``, ``{output}``, and ``{checkpoint}`` when lag is
        read from it). Raised when the template is made, before any load starts.
    """

    text: str
    need_checkpoint: bool = True
    need_output: str | None = "output"

    def __post_init__(self) -> None:
        used = self.placeholders()
        missing = [name for name in ("bootstrap", self.need_output) if name is not None and name not in used]
        if "bootstrap" in missing and used & {"java_config", "spark_options"}:
            missing.remove("bootstrap")  # both files hold bootstrap.servers
        if not used & {"pattern", "prefix"}:
            missing.append("pattern")
        if self.need_checkpoint and "checkpoint" not in used:
            missing.append("checkpoint")
        if missing:
            raise HarnessError(
                f"--pipeline-cmd must use {', '.join('{' + m + '}' for m in missing)}: the run's broker, topics, "
                "output location and checkpoint are new for every run (pass --lag-from group:ID if the job keeps "
                "no Spark checkpoint)"
            )

    def placeholders(self) -> set[str]:
        """The placeholder names the template uses, checked."""
        try:
            words = shlex.split(self.text)
        except ValueError as exc:
            raise HarnessError(f"--pipeline-cmd cannot be split into words ({exc}): {self.text!r}") from None
        if not words:
            raise HarnessError("--pipeline-cmd is empty")
        used: set[str] = set()
        for word in words:
            try:
                fields = list(string.Formatter().parse(word))
            except ValueError as exc:
                raise HarnessError(
                    f"--pipeline-cmd has a broken placeholder in {word!r} ({exc}); write a literal brace as {{{{ or }}}}"
                ) from None
            for _, name, spec, conversion in fields:
                if name is None:
                    continue
                if name not in PLACEHOLDERS:
                    known = ", ".join("{" + k + "}" for k in PLACEHOLDERS)
                    raise HarnessError(
                        f"--pipeline-cmd uses an unknown placeholder {{{name}}}; known: {known}"
                    )
                if spec or conversion:
                    raise HarnessError(f"--pipeline-cmd: write {{{name}}} without a format or conversion")
                used.add(name)
        return used

    def argv(self, values: dict[str, str]) -> list[str]:
        """The command line with every placeholder filled in from ``values``."""
        return [word.format(**values) for word in shlex.split(self.text)]


@dataclass(frozen=True)
class PipelineProcessConfig:
    """How the harness starts the pipeline: ``sotw pipeline``, or a team's job from ``template``.

    Parameters
    ----------
    bootstrap
        Kafka bootstrap address.
    output, checkpoint
        The pipeline's output root and checkpoint.
    pattern
        The topic regex.
    settings
        The pipeline's settings from the profile (policy, trigger, lateness, ...).
    extra_args
        Flags the harness adds to ``sotw pipeline`` for this run (``-q``, ``-X k=v``, the self-tests'
        ``--drop-batch``); not used with a template.
    template
        A team's command (``--pipeline-cmd``); None runs ``sotw pipeline``.
    prefix
        The run's topic prefix, for the template's ``{prefix}``.
    run_dir
        The run directory, for the template's ``{run_dir}``.
    kafka_settings
        The cluster's librdkafka settings. They reach the process in files (``sotw.clientfiles``) written
        beside its checkpoint when it starts and deleted when it stops: ``--kafka-config`` for
        ``sotw pipeline``, ``{kafka_config}``, ``{java_config}`` and ``{spark_options}`` for a template.
    output_topic
        The topic a ``--format topic`` job writes its table to, for the template's ``{output_topic}``.
    where
        The command prefix that starts the process where it runs (``ip netns exec ...`` for a run on a
        network of hosts, ``loadtest.run.hostnet``); empty: here.
    """

    bootstrap: str
    output: Path
    checkpoint: Path
    pattern: str = "sotw-sensor-.*"
    settings: PipelineSettings = field(default_factory=PipelineSettings)
    extra_args: tuple[str, ...] = field(default_factory=tuple)
    template: CommandTemplate | None = None
    prefix: str = ""
    run_dir: Path | None = None
    kafka_settings: Mapping[str, str] = field(default_factory=dict)
    output_topic: str = ""
    where: tuple[str, ...] = ()

    @property
    def kafka(self) -> KafkaConfig:
        """The cluster, as the settings files describe it."""
        return KafkaConfig(self.bootstrap, self.kafka_settings)

    def settings_files(self) -> SettingsFiles:
        """Where the process's settings files go: beside its checkpoint, in the run's job directory."""
        return SettingsFiles(self.checkpoint.parent)

    def files_needed(self) -> list[str]:
        """The settings files the process reads (keys of ``sotw.clientfiles.FILES``)."""
        if self.template is not None:
            return [kind for kind in FILES if kind in self.template.placeholders()]
        return ["kafka_config"] if self.kafka_settings else []

    def placeholder_values(self) -> dict[str, str]:
        """What each of ``PLACEHOLDERS`` stands for in this run."""
        from pipeline.config import parse_trigger

        files = self.settings_files()
        return {
            "bootstrap": self.bootstrap,
            "pattern": self.pattern,
            "prefix": self.prefix,
            "output": str(self.output),
            "output_topic": self.output_topic,
            "checkpoint": str(self.checkpoint),
            "run_dir": str(self.run_dir or self.output.parent),
            "python": sys.executable,
            "jars": self._jars(),
            "trigger": self.settings.trigger,
            "trigger_ms": str(parse_trigger(self.settings.trigger)),
            "session_timeout": self.settings.session_timeout,
            "policy": self.settings.policy,
            **{kind: str(files.path(kind)) for kind in FILES},
        }

    def _jars(self) -> str:
        """``{jars}``, looked up only for a template that uses it (a bundle missing fails the run at start)."""
        if self.template is None or "jars" not in self.template.placeholders():
            return ""
        from sotw.sparkjars import spark_jars

        try:
            return ",".join(str(p) for p in spark_jars())
        except SotwError as exc:
            raise HarnessError(f"--pipeline-cmd uses {{jars}}: {exc}") from None

    def argv(self) -> list[str]:
        """The command line, started where the process runs."""
        return [*self.where, *self._command()]

    def _command(self) -> list[str]:
        if self.template is not None:
            return self.template.argv(self.placeholder_values())
        return [
            sys.executable,
            "-m",
            "sotw",
            "pipeline",
            "--bootstrap",
            self.bootstrap,
            "--pattern",
            self.pattern,
            "--output",
            str(self.output),
            "--checkpoint",
            str(self.checkpoint),
            *self.settings.args(),
            *(
                ["--kafka-config", str(self.settings_files().path("kafka_config"))]
                if self.kafka_settings
                else []
            ),
            *self.extra_args,
        ]


class PipelineProcess:
    """A running ``sotw pipeline`` subprocess whose output goes to ``log_path``."""

    def __init__(self, config: PipelineProcessConfig, log_path: Path) -> None:
        self.config = config
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.files: SettingsFiles | None = None

    def start(self) -> PipelineProcess:
        """Start the process (returns at once; Spark takes seconds to come up).

        Its settings files are written first (mode 0600); ``stop`` and ``kill`` delete them.

        Raises
        ------
        HarnessError
            If a settings file the process needs cannot be written (a setting with no Java equivalent).
        """
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.files = self.config.settings_files()
        for kind in self.config.files_needed():
            try:
                self.files.write(kind, self.config.kafka)
            except (SotwError, ValueError) as exc:
                self.remove_files()
                raise HarnessError(f"the job's settings file {{{kind}}}: {exc}") from None
        try:
            with self.log_path.open("ab") as out:
                self.proc = subprocess.Popen(
                    self.config.argv(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
                )
        except BaseException:
            self.remove_files()
            raise
        log.info("pipeline started, pid %d, log %s", self.proc.pid, self.log_path)
        return self

    @property
    def pid(self) -> int:
        """The driver's process id."""
        if self.proc is None:
            raise HarnessError("the pipeline process was not started")
        return self.proc.pid

    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc is not None and self.proc.poll() is None

    def returncode(self) -> int | None:
        """Exit code, or None while running."""
        return None if self.proc is None else self.proc.poll()

    def tail(self, lines: int = 5) -> str:
        """The pipeline's own error line if it printed one, else the last lines of its log."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        errors = [line for line in text if line.startswith("sotw pipeline") and "error" in line]
        return errors[-1] if errors else "\n".join(text[-lines:])

    def wait_ready(self, timeout: float) -> None:
        """Wait until the query has started (its checkpoint has Spark's ``metadata``).

        A template job that keeps no Spark checkpoint counts as started once it has run for a second.
        """
        deadline = time.monotonic() + timeout
        marker = self.config.checkpoint / "metadata"
        spark = self.config.template is None or self.config.template.need_checkpoint
        started = time.monotonic()
        while time.monotonic() < deadline:
            if not self.alive():
                raise HarnessError(
                    f"the pipeline exited with code {self.returncode()} while starting:\n{self.tail()}"
                )
            if marker.exists() or (not spark and time.monotonic() - started >= 1.0):
                return
            time.sleep(0.2)
        raise HarnessError(f"the pipeline did not start within {timeout:g} s:\n{self.tail()}")

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM (the pipeline stops its query cleanly), then SIGKILL after ``timeout``.

        Children the process leaves behind (a team's job may start its JVM or workers in ways that outlive
        it) are killed once it has exited.
        """
        if self.proc is None:
            self.remove_files()
            return None
        if self.proc.poll() is None:
            family = self._family()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("pipeline did not stop within %g s; killing it", timeout)
                self.kill()
            _, alive = psutil.wait_procs(family[1:], timeout=5)
            for p in alive:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
        self.remove_files()
        return self.proc.returncode

    def remove_files(self) -> None:
        """Delete the settings files written for the process (``start`` writes them again)."""
        if self.files is not None:
            self.files.remove()

    def _family(self) -> list[psutil.Process]:
        """The process and its descendants now."""
        assert self.proc is not None
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def kill(self) -> None:
        """SIGKILL the whole process tree at once, as a crash would (driver, JVM and Python workers)."""
        if self.proc is None:
            return
        for p in self._family():
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(30)
        self.remove_files()


class AttachedPipeline(PipelineProcess):
    """A job the harness did not start (``--attach``): watched and verified, never started, stopped or killed.

    A ``PipelineProcess`` so the runner and the drills' stage treat both alike; killing it is refused with a
    message saying why (``loadtest.run.job`` refuses such incidents before the load starts).
    """

    def _refuse(self, what: str) -> Any:
        raise HarnessError(
            f"cannot {what} a job the harness attached to (--attach): run it with --pipeline-cmd so drills can "
            "kill and restart it"
        )

    def start(self) -> AttachedPipeline:
        """Nothing to start: the job runs already."""
        return self

    def alive(self) -> bool:
        """Assumed running: its lag tells whether it keeps up."""
        return True

    def returncode(self) -> int | None:
        """Never known."""
        return None

    def tail(self, lines: int = 5) -> str:
        """No log of its own."""
        return ""

    def wait_ready(self, timeout: float) -> None:
        """Nothing to wait for."""

    def stop(self, timeout: float = 60.0) -> int | None:
        """Left running: the harness only watched it. Incidents that stop it are refused."""
        return None

    def kill(self) -> None:
        """Refused."""
        self._refuse("kill")

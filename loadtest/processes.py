"""The pipeline as its own process, as it runs in production: start, watch, stop gracefully or kill -9.

The harness never runs Spark in its own process: a pipeline that falls over must not take the measurements
with it, and its CPU and memory must be attributable.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from loadtest.errors import HarnessError
from loadtest.profile import PipelineSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PipelineProcessConfig:
    """How the harness starts ``sotw pipeline``.

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
        Flags the harness adds for this run (``-q``, ``-X k=v``, the self-tests' ``--drop-batch``).
    """

    bootstrap: str
    output: Path
    checkpoint: Path
    pattern: str = "sotw-sensor-.*"
    settings: PipelineSettings = field(default_factory=PipelineSettings)
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    def argv(self) -> list[str]:
        """The command line."""
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
            *self.extra_args,
        ]


class PipelineProcess:
    """A running ``sotw pipeline`` subprocess whose output goes to ``log_path``."""

    def __init__(self, config: PipelineProcessConfig, log_path: Path) -> None:
        self.config = config
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> PipelineProcess:
        """Start the process (returns at once; Spark takes seconds to come up)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                self.config.argv(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
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
        """Wait until the query has started (the output directory is claimed or a batch ran)."""
        deadline = time.monotonic() + timeout
        marker = self.config.checkpoint / "metadata"
        while time.monotonic() < deadline:
            if not self.alive():
                raise HarnessError(
                    f"the pipeline exited with code {self.returncode()} while starting:\n{self.tail()}"
                )
            if marker.exists():
                return
            time.sleep(0.2)
        raise HarnessError(f"the pipeline did not start within {timeout:g} s:\n{self.tail()}")

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM (the pipeline stops its query cleanly), then SIGKILL after ``timeout``."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("pipeline did not stop within %g s; killing it", timeout)
                self.kill()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the whole process tree at once, as a crash would (driver, JVM and Python workers)."""
        if self.proc is None:
            return
        try:
            family = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            family = []
        for p in family:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(30)

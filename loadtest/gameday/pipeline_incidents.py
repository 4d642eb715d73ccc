"""Incidents that hit the pipeline: killed (and restarted), restarted gracefully (a deploy), its checkpoint made unwritable, the machine's CPU taken, a Spark worker killed."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from loadtest.errors import HarnessError
from loadtest.gameday.incident import Incident, Stage, number


@dataclass(frozen=True)
class PipelineKill(Incident):
    """kill -9 of the pipeline's process tree (driver, JVM, Python workers), restarted after a while."""

    kind: ClassVar[str] = "pipeline_kill"
    restart_after_s: float = 5.0

    def __post_init__(self) -> None:
        super().__post_init__()
        number("pipeline_kill: restart_after_s", self.restart_after_s)

    @property
    def duration(self) -> float:
        """Until the restart."""
        return self.restart_after_s

    def begin(self, stage: Stage) -> str:
        """Kill the pipeline."""
        stage.kill_pipeline()
        return "pipeline killed (SIGKILL to its process tree)"

    def end(self, stage: Stage) -> str:
        """Start it again on the same checkpoint."""
        stage.start_pipeline({})
        return "pipeline restarted on the same checkpoint"


@dataclass(frozen=True)
class PipelineRestart(Incident):
    """A deploy: graceful stop, optionally a pause, and a start with changed settings.

    ``settings`` changes the harness's pipeline settings for the new start (``trigger = "2s"`` works; a
    change the checkpoint cannot take, such as ``shuffle_partitions``, must be refused by the pipeline).
    """

    kind: ClassVar[str] = "pipeline_restart"
    downtime_s: float = 0.0
    settings: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        number("pipeline_restart: downtime_s", self.downtime_s)

    @property
    def duration(self) -> float:
        """The time between stop and start."""
        return self.downtime_s

    def begin(self, stage: Stage) -> str:
        """Stop the pipeline gracefully."""
        code = stage.stop_pipeline()
        return f"pipeline stopped gracefully (exit code {code})"

    def end(self, stage: Stage) -> str:
        """Start it with the new settings."""
        stage.start_pipeline(self.settings)
        changed = ", ".join(f"{k}={v}" for k, v in self.settings.items()) or "unchanged settings"
        return f"pipeline started again ({changed})"


@dataclass(frozen=True)
class CheckpointStall(Incident):
    """The checkpoint directory stops taking writes for a while (the design documents' failing checkpoint).

    Every directory under the checkpoint is made immutable (``chattr +i``, which holds even for root) or,
    for other users, read-only (no write permission), and given back at the end.
    """

    kind: ClassVar[str] = "checkpoint_stall"
    duration_s: float = 20.0

    def __post_init__(self) -> None:
        super().__post_init__()
        number("checkpoint_stall: duration_s", self.duration_s)

    @property
    def duration(self) -> float:
        """How long the checkpoint refuses writes."""
        return self.duration_s

    def begin(self, stage: Stage) -> str:
        """Make the checkpoint unwritable."""
        how = set_writable(stage.checkpoint, False)
        return f"checkpoint {stage.checkpoint} unwritable ({how})"

    def end(self, stage: Stage) -> str:
        """Make it writable again."""
        set_writable(stage.checkpoint, True)
        return "checkpoint writable again"

    def close(self, stage: Stage) -> None:
        """Never leave the checkpoint unwritable."""
        set_writable(stage.checkpoint, True)


def set_writable(root: Path, writable: bool) -> str:
    """Let the directories under ``root`` take new files again, or stop them; return how it was done.

    Root ignores permission bits, so as root the directories get the immutable attribute (``chattr``); other
    users lose (or get back) the write permission of their directories.

    Raises
    ------
    HarnessError
        If the file system does not support it (``chattr`` on overlay or network file systems).
    """
    folders = [str(p) for p in [root, *root.rglob("*")] if p.is_dir()]
    if os.geteuid() == 0:
        done = subprocess.run(
            ["chattr", "+i" if not writable else "-i", *folders], capture_output=True, text=True, check=False
        )
        if done.returncode != 0 and not writable:
            raise HarnessError(
                f"cannot make {root} unwritable with chattr (is it on ext4, xfs or btrfs?): {done.stderr.strip()}"
            )
        return "immutable attribute"
    for folder in folders:
        mode = os.stat(folder).st_mode
        os.chmod(folder, mode | 0o200 if writable else mode & ~0o222)
    return "write permission removed"


@dataclass(frozen=True)
class CpuHog(Incident):
    """A noisy neighbour: ``cores`` busy processes for ``duration_s`` (the slow-node case)."""

    kind: ClassVar[str] = "cpu_hog"
    duration_s: float = 30.0
    cores: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        number("cpu_hog: duration_s", self.duration_s)
        if isinstance(self.cores, bool) or not isinstance(self.cores, int) or self.cores < 1:
            raise HarnessError(f"cpu_hog: cores must be a whole number >= 1, got {self.cores!r}")

    @property
    def duration(self) -> float:
        """How long the neighbour is busy."""
        return self.duration_s

    def begin(self, stage: Stage) -> str:
        """Start the busy processes."""
        stage.start_cpu_hogs(self.cores)
        return f"{self.cores} busy process(es) started"

    def end(self, stage: Stage) -> str:
        """Stop them."""
        stage.stop_cpu_hogs()
        return "busy processes stopped"

    def close(self, stage: Stage) -> None:
        """Stop them."""
        stage.stop_cpu_hogs()


@dataclass(frozen=True)
class WorkerKill(Incident):
    """A Spark node going down: SIGKILL of the standalone cluster's executor JVMs, or of its worker with them.

    The pipeline must run on the cluster (``--master spark://...``) and its workers on this machine. With
    ``worker = false`` the worker stays and the master gives the pipeline new executors at once; with
    ``worker = true`` the worker JVM dies too and is started again after ``restart_after_s``.
    """

    kind: ClassVar[str] = "worker_kill"
    worker: bool = False
    restart_after_s: float = 10.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.worker, bool):
            raise HarnessError(f"worker_kill: worker must be true or false, got {self.worker!r}")
        number("worker_kill: restart_after_s", self.restart_after_s)

    @property
    def duration(self) -> float:
        """Until the worker is started again (an executor kill is an instant)."""
        return self.restart_after_s if self.worker else 0.0

    def begin(self, stage: Stage) -> str:
        """Kill the executors (and the worker)."""
        return stage.kill_spark(self.worker)

    def end(self, stage: Stage) -> str:
        """Start the worker again."""
        return stage.restart_spark_workers() if self.worker else "over"

    def close(self, stage: Stage) -> None:
        """Never leave the cluster without its worker."""
        if self.worker:
            stage.restart_spark_workers()

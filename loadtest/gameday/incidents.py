"""Game-day incidents: what goes wrong in production, done on purpose at a set time during a run.

A drill (or a profile) lists incidents, each ``at_s`` seconds into the steady phase with a duration or
parameters. Each kind is a small frozen dataclass that checks its parameters when it is read and acts on the
running system through a ``Stage`` (the simulator, the pipeline process, the broker, the checkpoint) when it
begins and when it ends; ``Schedule`` carries them out on a thread of its own, so a slow action (a graceful
stop, a broker restart) does not hold up the run's clock, and records each one's window on the timeline that
the report shades and the recovery measurements start from.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from loadtest.errors import HarnessError
from simulator.config import FaultConfig, SimulatorError
from sotw.broker import PartitionState

log = logging.getLogger(__name__)


class ClusterControl(Protocol):
    """What node incidents do to a cluster of several nodes (the local three-node cluster, ``kafka-3``)."""

    @property
    def node_ids(self) -> list[int]:
        """The nodes' ids."""

    def partitions(self) -> list[PartitionState]:
        """Every partition but the internal topics', with leader, replicas and replicas in sync, as now."""

    def under_replicated(self) -> int:
        """How many partitions of every topic (the internal ones too) have fewer replicas in sync than assigned."""

    def stop_node(self, node: int, kill: bool) -> None:
        """Stop one node: SIGTERM (a controlled shutdown), or SIGKILL with ``kill``; it stays down."""

    def start_node(self, node: int) -> None:
        """Start a stopped node and return once it is registered and serving."""

    def pause_node(self, node: int) -> None:
        """Freeze one node (SIGSTOP)."""

    def resume_nodes(self) -> None:
        """Thaw every frozen node (SIGCONT)."""

    @property
    def down_nodes(self) -> list[int]:
        """The nodes an incident stopped and nobody started again."""

    def restore(self) -> None:
        """Thaw every frozen node and start every stopped one: nothing an incident did is left behind."""


class BrokerControl(Protocol):
    """The incident operations a broker offers (one the harness started, or a cluster driven by commands)."""

    @property
    def cluster(self) -> ClusterControl | None:
        """Control of single nodes, for a broker of several; None for one node or a broker given by commands."""

    def pause(self) -> None:
        """Freeze the broker (it stops answering, connections stay open)."""

    def resume(self) -> None:
        """Thaw a frozen broker."""

    def restart(self, downtime_s: float, lose_data: bool) -> None:
        """Stop the broker, wait ``downtime_s``, start it on the same address; return once it answers.

        ``lose_data=True`` brings it back without the records it had acknowledged.
        """


class Stage(Protocol):
    """The running parts of one run that incidents act on."""

    @property
    def broker(self) -> BrokerControl | None:
        """The broker's controls; None when the run cannot touch its broker."""

    @property
    def checkpoint(self) -> Path:
        """The pipeline's checkpoint directory."""

    @property
    def topic_prefix(self) -> str:
        """The prefix of every topic of this run (its sensors' topics)."""

    @property
    def base_load_factor(self) -> float:
        """The run's load factor, which load incidents return to."""

    def set_load_factor(self, factor: float) -> None:
        """Change the simulator's load factor now."""

    def set_faults(self, faults: FaultConfig | None, sensor: str | None = None) -> None:
        """Change fault rates for all sensors or one; None gives a sensor back the profile's rates."""

    def profile_faults(self) -> FaultConfig:
        """The profile's global fault rates."""

    def add_sensors(self, count: int) -> None:
        """Have ``count`` new sensors join now."""

    def recreate_topics(self) -> None:
        """Have the simulator create its topics again, as clients do after a broker lost its data."""

    def kill_pipeline(self) -> None:
        """Send SIGKILL to the pipeline's whole process tree at once, as a crash would."""

    def stop_pipeline(self) -> int | None:
        """Stop the pipeline gracefully (SIGTERM, as a deploy does); return its exit code."""

    def start_pipeline(self, changes: Mapping[str, Any]) -> None:
        """Start the pipeline again on the same checkpoint, with ``changes`` to its settings."""

    def start_cpu_hogs(self, count: int) -> None:
        """Start ``count`` busy processes beside the system under test."""

    def kill_spark(self, worker: bool) -> str:
        """SIGKILL the Spark cluster's executor JVMs (with ``worker``, the worker JVMs too); say what died."""

    def restart_spark_workers(self) -> str:
        """Start the worker JVMs that ``kill_spark`` killed again; say what was started."""

    def stop_cpu_hogs(self) -> None:
        """Stop the busy processes."""


def _number(where: str, value: Any, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
        raise HarnessError(f"{where} must be a number >= {minimum:g}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Step:
    """What one action of an incident did, when a line of text is not all of it.

    Parameters
    ----------
    note
        The line for the timeline.
    figures
        What the action measured (seconds, counts), kept with the incident in ``results.json``; NaN for one
        it waited for in vain.
    outage_end_ms
        When the outage ended (epoch ms), for an incident whose later actions (a node started again, its
        replicas catching up) are not part of it: recovery is measured from there.
    """

    note: str
    figures: Mapping[str, float] = field(default_factory=dict)
    outage_end_ms: int | None = None


@dataclass(frozen=True)
class Incident:
    """One scheduled incident: when it starts (seconds into the steady phase) and its name on the timeline.

    Subclasses set ``kind`` and add their parameters; ``duration`` is how long the incident lasts (0 for one
    that happens at an instant, like a sensor storm).
    """

    kind: ClassVar[str] = ""
    at_s: float = 0.0
    name: str = ""

    def __post_init__(self) -> None:
        _number(f"incident {self.kind}: at_s", self.at_s)

    @property
    def label(self) -> str:
        """How the timeline, the charts and the scorecard name this incident."""
        return self.name or self.kind

    @property
    def duration(self) -> float:
        """Seconds from ``begin`` to ``end``."""
        return 0.0

    def begin(self, stage: Stage) -> str | Step:
        """Start the incident; return what was done, for the timeline."""
        raise NotImplementedError

    def tick(self, stage: Stage, into_s: float) -> None:
        """Called about once a second while the incident lasts (ramps change rates here)."""

    def end(self, stage: Stage) -> str | Step:
        """End the incident; return what was done."""
        return "over"

    def close(self, stage: Stage) -> None:
        """Undo whatever ``begin`` left behind if the run ends before ``end`` (never leave a broker frozen)."""


@dataclass(frozen=True)
class PipelineKill(Incident):
    """kill -9 of the pipeline's process tree (driver, JVM, Python workers), restarted after a while."""

    kind: ClassVar[str] = "pipeline_kill"
    restart_after_s: float = 5.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _number("pipeline_kill: restart_after_s", self.restart_after_s)

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
        _number("pipeline_restart: downtime_s", self.downtime_s)

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
class BrokerPause(Incident):
    """The broker freezes (SIGSTOP) and thaws (SIGCONT): a hung broker, a long GC pause, a partition."""

    kind: ClassVar[str] = "broker_pause"
    duration_s: float = 10.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _number("broker_pause: duration_s", self.duration_s)

    @property
    def duration(self) -> float:
        """How long the broker stays frozen."""
        return self.duration_s

    def begin(self, stage: Stage) -> str:
        """Freeze the broker."""
        _broker(stage, self.kind).pause()
        return "broker frozen (SIGSTOP)"

    def end(self, stage: Stage) -> str:
        """Thaw it."""
        _broker(stage, self.kind).resume()
        return "broker thawed (SIGCONT)"

    def close(self, stage: Stage) -> None:
        """Never leave the broker frozen."""
        if stage.broker is not None:
            stage.broker.resume()


@dataclass(frozen=True)
class BrokerRestart(Incident):
    """The broker stops and starts again keeping its data (Kafka keeps it on disk).

    ``begin`` returns once the broker answers again, so the incident's window is the outage itself.
    """

    kind: ClassVar[str] = "broker_restart"
    downtime_s: float = 5.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _number("broker_restart: downtime_s", self.downtime_s)

    def begin(self, stage: Stage) -> str:
        """Stop the broker and start it again with its data (returns once it answers)."""
        _broker(stage, self.kind).restart(self.downtime_s, lose_data=False)
        return f"broker stopped, down {self.downtime_s:g} s, answering again with its data"


@dataclass(frozen=True)
class BrokerDataLoss(Incident):
    """The broker comes back without the records it acknowledged (its data wiped while it was down).

    ``begin`` returns once the broker answers again, so the incident's window is the outage itself.
    """

    kind: ClassVar[str] = "broker_data_loss"
    downtime_s: float = 2.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _number("broker_data_loss: downtime_s", self.downtime_s)

    def begin(self, stage: Stage) -> str:
        """Kill the broker and start it again without its data (returns once it answers)."""
        _broker(stage, self.kind).restart(self.downtime_s, lose_data=True)
        # The broker came back without topics and creates none itself: the simulator makes its own again.
        stage.recreate_topics()
        return (
            f"broker killed, down {self.downtime_s:g} s, answering again without its data; "
            "topics created again"
        )


@dataclass(frozen=True)
class Load(Incident):
    """A burst (``factor`` for ``duration_s``) or a ramp (to ``ramp_to`` over ``ramp_s``, then held).

    Factors multiply the profile's 1x rate, like ``--load``; at the end the run's own factor is restored.
    """

    kind: ClassVar[str] = "load"
    factor: float | None = None
    ramp_to: float | None = None
    ramp_s: float = 0.0
    duration_s: float = 60.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.factor is None) == (self.ramp_to is None):
            raise HarnessError("incident load needs exactly one of factor (a burst) and ramp_to (a ramp)")
        _number("load: factor or ramp_to", self.factor if self.factor is not None else self.ramp_to, 0.01)
        _number("load: ramp_s", self.ramp_s)
        _number("load: duration_s", self.duration_s)
        if self.ramp_s > self.duration_s:
            raise HarnessError(
                f"load: ramp_s ({self.ramp_s:g}) must not exceed duration_s ({self.duration_s:g})"
            )

    @property
    def duration(self) -> float:
        """The burst, or the ramp and its hold."""
        return self.duration_s

    def _factor_at(self, stage: Stage, into_s: float) -> float:
        if self.factor is not None:
            return self.factor
        assert self.ramp_to is not None
        base = stage.base_load_factor
        share = 1.0 if self.ramp_s <= 0 else min(1.0, into_s / self.ramp_s)
        return base + (self.ramp_to - base) * share

    def begin(self, stage: Stage) -> str:
        """Set the first factor."""
        factor = self._factor_at(stage, 0.0)
        stage.set_load_factor(factor)
        if self.factor is not None:
            return f"load {factor:g}x"
        return f"load ramping from {stage.base_load_factor:g}x to {self.ramp_to:g}x over {self.ramp_s:g} s"

    def tick(self, stage: Stage, into_s: float) -> None:
        """Follow the ramp."""
        if self.ramp_to is not None:
            stage.set_load_factor(self._factor_at(stage, into_s))

    def end(self, stage: Stage) -> str:
        """Back to the run's own factor."""
        stage.set_load_factor(stage.base_load_factor)
        return f"load back to {stage.base_load_factor:g}x"

    def close(self, stage: Stage) -> None:
        """Back to the run's own factor."""
        stage.set_load_factor(stage.base_load_factor)


@dataclass(frozen=True)
class Faults(Incident):
    """Fault rates for a window, for every sensor or for the listed ones, optionally ramped in.

    With ``ramp_s`` the rates grow linearly from the profile's to ``faults`` over that time. At the end the
    sensors get the profile's rates back (per-sensor rates of other sensors are left alone).
    """

    kind: ClassVar[str] = "faults"
    faults: FaultConfig = field(default_factory=FaultConfig)
    sensors: tuple[str, ...] = ()
    ramp_s: float = 0.0
    duration_s: float = 30.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _number("faults: ramp_s", self.ramp_s)
        _number("faults: duration_s", self.duration_s)

    @property
    def duration(self) -> float:
        """The window."""
        return self.duration_s

    def _apply(self, stage: Stage, share: float) -> None:
        base = stage.profile_faults()
        rates = self.faults if share >= 1.0 else _blend(base, self.faults, share)
        for sensor in self.sensors or (None,):
            stage.set_faults(rates, sensor)

    def begin(self, stage: Stage) -> str:
        """Switch the rates on (or start the ramp)."""
        self._apply(stage, 0.0 if self.ramp_s > 0 else 1.0)
        who = ", ".join(self.sensors) if self.sensors else "every sensor"
        rates = ", ".join(f"{k}={v:g}" for k, v in _rates(self.faults).items() if v)
        return f"faults {rates or 'off'} for {who}" + (
            f", ramped in over {self.ramp_s:g} s" if self.ramp_s else ""
        )

    def tick(self, stage: Stage, into_s: float) -> None:
        """Follow the ramp."""
        if self.ramp_s > 0 and into_s <= self.ramp_s + 1.0:
            self._apply(stage, min(1.0, into_s / self.ramp_s))

    def end(self, stage: Stage) -> str:
        """Give the sensors the profile's rates back."""
        self.close(stage)
        return "faults back to the profile's"

    def close(self, stage: Stage) -> None:
        """Give the sensors the profile's rates back."""
        if self.sensors:
            for sensor in self.sensors:
                stage.set_faults(None, sensor)
        else:
            stage.set_faults(stage.profile_faults())


def _rates(faults: FaultConfig) -> dict[str, float]:
    return {k: getattr(faults, k) for k in ("gap", "duplicate", "delayed", "malformed", "abandon")}


def _blend(start: FaultConfig, stop: FaultConfig, share: float) -> FaultConfig:
    """Rates ``share`` of the way from ``start`` to ``stop`` (delays taken from ``stop``)."""
    mixed = {
        k: a + (b - a) * share for (k, a), b in zip(_rates(start).items(), _rates(stop).values(), strict=True)
    }
    return dataclasses.replace(stop, **mixed)


@dataclass(frozen=True)
class SensorStorm(Incident):
    """Many sensors join at once: new topics for the pipeline to discover under load."""

    kind: ClassVar[str] = "sensor_storm"
    sensors: int = 20

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.sensors, bool) or not isinstance(self.sensors, int) or self.sensors < 1:
            raise HarnessError(f"sensor_storm: sensors must be a whole number >= 1, got {self.sensors!r}")

    def begin(self, stage: Stage) -> str:
        """Add the sensors."""
        stage.add_sensors(self.sensors)
        return f"{self.sensors} new sensors joining at once"


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
        _number("checkpoint_stall: duration_s", self.duration_s)

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
        _number("cpu_hog: duration_s", self.duration_s)
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
        _number("worker_kill: restart_after_s", self.restart_after_s)

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


def _node_param(kind: str, node: Any) -> None:
    if node != "busiest" and (isinstance(node, bool) or not isinstance(node, int) or node < 1):
        raise HarnessError(f'{kind}: node must be a node id (1, 2, ...) or "busiest", got {node!r}')


def _cluster(stage: Stage, kind: str) -> ClusterControl:
    cluster = stage.broker.cluster if stage.broker is not None else None
    if cluster is None:
        raise HarnessError(
            f'incident {kind} needs a local cluster of several nodes: broker = "kafka-3" in the drill file '
            "(or --broker kafka-3)"
        )
    return cluster


def _run_partitions(cluster: ClusterControl, stage: Stage) -> list[PartitionState]:
    return [p for p in cluster.partitions() if p.topic.startswith(stage.topic_prefix)]


def _choose(cluster: ClusterControl, stage: Stage, node: int | str) -> tuple[int, int]:
    """The node to act on (``busiest``: the one leading the most of the run's partitions) and how many it leads."""
    counts = Counter(p.leader for p in _run_partitions(cluster, stage) if p.leader >= 0)
    chosen = max(sorted(cluster.node_ids), key=lambda n: counts[n]) if node == "busiest" else int(node)
    if chosen not in cluster.node_ids:
        raise HarnessError(f"there is no node {chosen}: the cluster's nodes are {cluster.node_ids}")
    return chosen, counts[chosen]


def _wait(check: Callable[[], bool], timeout_s: float, poll_s: float = 0.2) -> float:
    """Seconds until ``check()`` held (NaN if it did not within ``timeout_s``; an error counts as not yet)."""
    started = time.monotonic()
    while True:
        try:
            if check():
                return time.monotonic() - started
        except Exception as exc:  # KafkaException while the cluster is changing: ask again
            log.debug("cluster not ready yet: %s", exc)
        if time.monotonic() - started > timeout_s:
            return math.nan
        time.sleep(poll_s)


def _served_without(cluster: ClusterControl, stage: Stage, gone: int) -> bool:
    """Every partition of the run has a leader, and none is ``gone``."""
    return all(p.leader >= 0 and p.leader != gone for p in _run_partitions(cluster, stage))


def _start_again(cluster: ClusterControl, node: int) -> Step:
    """Start ``node`` again, measured: until it is registered (``outage_end_ms``) and until it is in sync.

    In sync: no partition under-replicated, waited for ``REPLICATED_TIMEOUT_S`` at most.
    """
    started = time.monotonic()
    cluster.start_node(node)
    registered_ms = _now_ms()
    rejoined = time.monotonic() - started
    replicated = rejoined + _wait(lambda: cluster.under_replicated() == 0, REPLICATED_TIMEOUT_S)
    caught_up = (
        f"every partition in sync again {replicated:.1f} s after its start"
        if math.isfinite(replicated)
        else f"still under-replicated {REPLICATED_TIMEOUT_S:g} s after it"
    )
    return Step(
        f"node {node} started again: registered after {rejoined:.1f} s, {caught_up}",
        {"rejoined_s": rejoined, "replicated_s": replicated},
        outage_end_ms=registered_ms,
    )


def _start_the_down_node(cluster: ClusterControl) -> Step:
    """Start the node the incident took down again, measured; the outage ended before (not at its return)."""
    down = cluster.down_nodes
    if not down:
        return Step("no node was down")
    return dataclasses.replace(_start_again(cluster, down[0]), outage_end_ms=None)


@dataclass(frozen=True)
class NodeIncident(Incident):
    """An incident on single nodes of a local cluster: whatever it stopped or froze is restored at the end."""

    def close(self, stage: Stage) -> None:
        """Never leave a node frozen or down."""
        if stage.broker is not None and stage.broker.cluster is not None:
            stage.broker.cluster.restore()


@dataclass(frozen=True)
class NodeOutage(NodeIncident):
    """A node taken down by ``begin`` and started again by ``end``, its return and catching up measured."""

    def end(self, stage: Stage) -> Step:
        """Start the node again; measure its return and its replicas catching up."""
        return _start_the_down_node(_cluster(stage, self.kind))


@dataclass(frozen=True)
class BrokerNodeKill(NodeOutage):
    """SIGKILL of one node of the cluster (by default the node leading the most of the run's partitions).

    The other nodes take over its partitions once the controller fences it (``broker.session.timeout.ms``
    after its last heartbeat): the outage, and the incident's window for recovery, lasts until every
    partition of the run is led by a live node again. ``restart_after_s`` after the kill it is started
    again; it rejoins and its replicas catch up. Figures: ``led`` (partitions of the run it led),
    ``leaders_moved_s``, ``rejoined_s`` (its start until registered), ``replicated_s`` (its start until no
    partition is under-replicated).
    """

    kind: ClassVar[str] = "broker_node_kill"
    node: int | str = "busiest"
    restart_after_s: float = 30.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _node_param(self.kind, self.node)
        _number("broker_node_kill: restart_after_s", self.restart_after_s)

    @property
    def duration(self) -> float:
        """Until the node is started again."""
        return self.restart_after_s

    def begin(self, stage: Stage) -> Step:
        """Kill the node and wait until its partitions are led by the others."""
        cluster = _cluster(stage, self.kind)
        node, led = _choose(cluster, stage, self.node)
        cluster.stop_node(node, kill=True)
        moved = _wait(lambda: _served_without(cluster, stage, node), self.restart_after_s)
        return Step(
            f"node {node} killed (SIGKILL; it led {led} of the run's partitions); "
            + (
                f"the others lead them all after {moved:.1f} s"
                if math.isfinite(moved)
                else "leadership not moved"
            ),
            {"node": float(node), "led": float(led), "leaders_moved_s": moved},
            outage_end_ms=_now_ms(),
        )


@dataclass(frozen=True)
class BrokerNodeRestart(NodeIncident):
    """One node stopped gracefully and started again, as each node in turn in a rolling restart (an upgrade).

    As an operator would, it first waits (up to ``settle_s``) until no partition is under-replicated, so
    that stopping the node cannot take a partition below ``min.insync.replicas``. SIGTERM is Kafka's
    controlled shutdown: the node hands its leaderships over before it exits. Down ``downtime_s``, then
    started; the window is from the SIGTERM until it is registered again. Figures: ``waited_s``, ``stop_s``
    (the controlled shutdown), ``rejoined_s`` and ``replicated_s``.
    """

    kind: ClassVar[str] = "broker_node_restart"
    node: int | str = "busiest"
    downtime_s: float = 5.0
    settle_s: float = 120.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _node_param(self.kind, self.node)
        _number("broker_node_restart: downtime_s", self.downtime_s)
        _number("broker_node_restart: settle_s", self.settle_s)

    def begin(self, stage: Stage) -> Step:
        """Wait for a healthy cluster, stop the node gracefully, start it again; measure each step."""
        cluster = _cluster(stage, self.kind)
        waited = _wait(lambda: cluster.under_replicated() == 0, self.settle_s)
        if not math.isfinite(waited):
            raise HarnessError(
                f"broker_node_restart: partitions were still under-replicated after {self.settle_s:g} s; "
                "a node was not stopped (it could take a partition below min.insync.replicas)"
            )
        node, led = _choose(cluster, stage, self.node)
        began = time.monotonic()
        cluster.stop_node(node, kill=False)
        stopped = time.monotonic() - began
        time.sleep(self.downtime_s)
        back = _start_again(cluster, node)
        return Step(
            f"node {node} (leading {led} of the run's partitions) stopped gracefully in {stopped:.1f} s, "
            f"down {self.downtime_s:g} s; {back.note.removeprefix(f'node {node} ')}",
            {"node": float(node), "led": float(led), "waited_s": waited, "stop_s": stopped, **back.figures},
            outage_end_ms=back.outage_end_ms,
        )


@dataclass(frozen=True)
class UncleanElection(NodeOutage):
    """A lagging follower made leader: acknowledged records the old leader alone had are gone.

    Needs a cluster set up for it: partitions with two replicas, ``min.insync.replicas=1`` and
    ``unclean.leader.election.enable=true`` (a drill's ``broker_settings``). The follower of the busiest
    leader's partitions is frozen (SIGSTOP): it is fenced and drops out of their ISR, and the leader goes on
    acknowledging alone. ``lag_s`` after the freeze (and at least ``ALONE_S`` after the follower left the
    ISR, which is waited for up to ``SHRINK_TIMEOUT_S`` longer) the leader is killed and the follower thawed; once the
    controller fences the dead leader it elects the follower, out of sync, whose log ends where it stopped:
    everything acknowledged since is lost. The window lasts until every partition of the run has a leader
    again; ``restart_after_s`` after the kill the old leader is started, truncates its log to the new
    leader's and catches up. Figures: ``led``, ``at_risk`` (partitions whose only other replica is the
    follower), ``isr_shrunk_s`` (the freeze until the follower is out of their ISR), ``elected_s`` (the kill
    until every partition has a leader), ``rejoined_s``, ``replicated_s``.
    """

    kind: ClassVar[str] = "unclean_election"
    lag_s: float = 20.0
    restart_after_s: float = 20.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _number("unclean_election: lag_s", self.lag_s, 1.0)
        _number("unclean_election: restart_after_s", self.restart_after_s)

    @property
    def duration(self) -> float:
        """The follower's lag, then the old leader down."""
        return self.lag_s + self.restart_after_s

    def begin(self, stage: Stage) -> Step:
        """Freeze the follower, let it fall behind, kill the leader, thaw the follower; wait for the election."""
        cluster = _cluster(stage, self.kind)
        began = time.monotonic()
        leader, led = _choose(cluster, stage, "busiest")
        mine = [p for p in _run_partitions(cluster, stage) if p.leader == leader]
        followers = Counter(r for p in mine for r in p.replicas if r != leader)
        at_risk = [p for p in mine if len(p.replicas) == 2]
        if not followers or not at_risk:
            raise HarnessError(
                "unclean_election needs partitions with two replicas: broker_settings = "
                '{ "default.replication.factor" = 2, "min.insync.replicas" = 1, '
                '"unclean.leader.election.enable" = true } in the drill file'
            )
        follower = followers.most_common(1)[0][0]
        exposed = {(p.topic, p.partition) for p in at_risk if follower in p.replicas}
        cluster.pause_node(follower)

        def shrunk() -> bool:
            return all(
                follower not in p.isr
                for p in _run_partitions(cluster, stage)
                if (p.topic, p.partition) in exposed
            )

        # Fencing the frozen node takes the controller its session timeout and more on a busy machine: wait for
        # it past lag_s if need be, then let the leader acknowledge alone a while, as what it takes then is what
        # the election loses.
        out_of_sync = _wait(shrunk, self.lag_s + SHRINK_TIMEOUT_S)
        time.sleep(max(ALONE_S, self.lag_s - (time.monotonic() - began)))
        cluster.stop_node(leader, kill=True)
        cluster.resume_nodes()
        elected = _wait(lambda: _served_without(cluster, stage, leader), max(60.0, self.restart_after_s))
        return Step(
            f"node {follower} frozen {self.lag_s:g} s (out of the ISR of the {len(exposed)} partitions it alone "
            f"followed for node {leader} after {out_of_sync:.1f} s), then node {leader} killed and node "
            f"{follower} thawed; "
            + (
                f"every partition led again after {elected:.1f} s"
                if math.isfinite(elected)
                else "no new leader"
            ),
            {
                "node": float(leader),
                "follower": float(follower),
                "led": float(led),
                "at_risk": float(len(exposed)),
                "isr_shrunk_s": out_of_sync,
                "elected_s": elected,
            },
            outage_end_ms=_now_ms(),
        )


def _now_ms() -> int:
    return int(time.time() * 1000)


#: How long past its lag an unclean election waits for the frozen follower to drop out of the ISR.
SHRINK_TIMEOUT_S = 60.0
#: How long at least the leader acknowledges alone before it is killed.
ALONE_S = 5.0

#: How long a node's replicas get to catch up after it is back before the figure says they never did.
REPLICATED_TIMEOUT_S = 120.0


def _broker(stage: Stage, kind: str) -> BrokerControl:
    if stage.broker is None:
        raise HarnessError(
            f"incident {kind} needs control of the broker: a local one, or --broker-stop-cmd and "
            "--broker-start-cmd for a cluster"
        )
    return stage.broker


KINDS: dict[str, type[Incident]] = {
    cls.kind: cls
    for cls in (
        PipelineKill,
        PipelineRestart,
        BrokerPause,
        BrokerRestart,
        BrokerDataLoss,
        BrokerNodeKill,
        BrokerNodeRestart,
        UncleanElection,
        Load,
        Faults,
        SensorStorm,
        CheckpointStall,
        CpuHog,
        WorkerKill,
    )
}


def incident_from_mapping(data: Mapping[str, Any], where: str) -> Incident:
    """Build one incident from a scenario or drill table (``kind``, ``at_s`` and the kind's parameters).

    Raises
    ------
    HarnessError
        Naming the table and the unknown kind, the unknown parameter or the bad value.
    """
    values = dict(data)
    kind = values.pop("kind", None)
    if kind not in KINDS:
        raise HarnessError(f"{where}: kind must be one of {', '.join(sorted(KINDS))}, got {kind!r}")
    cls = KINDS[kind]
    allowed = {f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")}
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise HarnessError(
            f"{where}: incident {kind} has no parameter {unknown[0]!r} (it takes {', '.join(sorted(allowed))})"
        )
    try:
        if "faults" in values and cls is Faults:
            values["faults"] = FaultConfig.from_mapping(values["faults"], where=f"{where}.faults")
        if "sensors" in values and cls is Faults:
            values["sensors"] = tuple(str(s) for s in values["sensors"])
        if "settings" in values:
            values["settings"] = dict(values["settings"])
        return cls(**values)
    except SimulatorError as exc:
        raise HarnessError(str(exc)) from None
    except TypeError as exc:
        raise HarnessError(f"{where}: {exc}") from None


@dataclass
class IncidentRecord:
    """What one incident did and when (epoch ms), for the timeline, the report and ``results.json``."""

    label: str
    kind: str
    start_ms: int = 0
    end_ms: int = 0
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    #: What its actions measured (``Step.figures``).
    figures: dict[str, float] = field(default_factory=dict)
    #: When its outage ended, if before ``end_ms`` (``Step.outage_end_ms``): recovery is measured from there.
    outage_end_ms: int | None = None

    @property
    def window_end_ms(self) -> int:
        """The end of the window recovery is measured from: the outage's end, else the incident's."""
        return self.outage_end_ms or self.end_ms


class Schedule(threading.Thread):
    """Carries out incidents at their times, counted from ``start()``, on a thread of its own.

    Parameters
    ----------
    incidents
        What to do, each with its ``at_s``.
    stage
        The running system.
    on_event
        Called with a line for the run's progress output at every begin and end.
    """

    def __init__(
        self,
        incidents: Sequence[Incident],
        stage: Stage,
        on_event: Callable[[str], None] = lambda _: None,
    ) -> None:
        super().__init__(name="sotw-incidents", daemon=True)
        self.incidents = sorted(incidents, key=lambda i: i.at_s)
        self.stage = stage
        self.on_event = on_event
        self.records = [IncidentRecord(i.label, i.kind) for i in self.incidents]
        self._halt = threading.Event()
        self._started_at = 0.0

    @property
    def span_s(self) -> float:
        """Seconds from the start until the last incident has ended."""
        return max((i.at_s + i.duration for i in self.incidents), default=0.0)

    def done(self) -> bool:
        """True once every incident has begun and ended."""
        return all(r.end_ms for r in self.records)

    def run(self) -> None:
        """Begin, tick and end each incident at its time."""
        self._started_at = time.monotonic()
        active: dict[int, float] = {}  # index -> monotonic time it began
        pending = list(range(len(self.incidents)))
        while (pending or active) and not self._halt.is_set():
            now = time.monotonic() - self._started_at
            for i in [i for i in pending if self.incidents[i].at_s <= now]:
                pending.remove(i)
                active[i] = time.monotonic()
                self._act(i, "begin")
            for i, began in list(active.items()):
                into = time.monotonic() - began
                if into >= self.incidents[i].duration:
                    del active[i]
                    self._act(i, "end")
                else:
                    self._tick(i, into)
            self._halt.wait(0.25)

    def _tick(self, i: int, into: float) -> None:
        def tick() -> None:
            self.incidents[i].tick(self.stage, into)

        self._guard(i, tick)

    def _act(self, i: int, step: str) -> None:
        incident, record = self.incidents[i], self.records[i]
        now_ms = int(time.time() * 1000)
        if step == "begin":
            record.start_ms = now_ms
            done = self._guard(i, lambda: incident.begin(self.stage))
        else:
            done = self._guard(i, lambda: incident.end(self.stage))
            record.end_ms = int(time.time() * 1000)
        if isinstance(done, Step):
            record.figures.update(done.figures)
            if done.outage_end_ms is not None:
                record.outage_end_ms = done.outage_end_ms
            done = done.note
        if done:
            record.notes.append(done)
            self.on_event(f"incident {record.label}: {done}")

    def _guard(self, i: int, action: Callable[[], str | Step | None]) -> str | Step | None:
        """Run one action; a failure is recorded on the incident, not raised into the run."""
        try:
            return action()
        except Exception as exc:  # an incident that cannot be carried out is a finding, not a crash
            record = self.records[i]
            record.error = record.error or f"{type(exc).__name__}: {exc}"
            log.warning("incident %s failed: %s", record.label, exc)
            self.on_event(f"incident {record.label} FAILED: {exc}")
            return None

    def stop(self) -> None:
        """Stop scheduling and undo whatever an unfinished incident left behind."""
        self._halt.set()
        if self.is_alive():
            self.join(120)
        for incident, record in zip(self.incidents, self.records, strict=True):
            if record.start_ms and not record.end_ms:
                record.end_ms = int(time.time() * 1000)
                record.notes.append("ended early: the run stopped")
            try:
                incident.close(self.stage)
            except Exception as exc:
                log.warning("could not undo incident %s: %s", record.label, exc)

"""What every incident is: its controls of the system (the stage, the broker, the cluster), its schedule time and actions, and what an action reports."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from loadtest.errors import HarnessError
from simulator.config import FaultConfig
from sotw.broker import PartitionState
from sotw.network import Network


class ClusterControl(Protocol):
    """What node incidents do to a cluster of several nodes (the local three-node cluster, ``kafka-3``)."""

    @property
    def node_ids(self) -> list[int]:
        """The nodes' ids."""

    def partitions(self) -> list[PartitionState]:
        """Every partition but the internal topics', with leader, replicas and replicas in sync, as now."""

    def active_controller(self) -> int | None:
        """The node leading the KRaft controller quorum now; None while an election runs."""

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

    @property
    def network(self) -> Network | None:
        """The network whose hosts the nodes and the pipeline are (``--netns``); None otherwise."""

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


def number(where: str, value: Any, minimum: float = 0.0) -> float:
    """``value`` as a float, refused naming ``where`` unless it is a number of at least ``minimum``."""
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
        number(f"incident {self.kind}: at_s", self.at_s)

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


def now_ms() -> int:
    """Epoch milliseconds now."""
    return int(time.time() * 1000)


def broker_of(stage: Stage, kind: str) -> BrokerControl:
    """The stage's broker control, refused naming the incident ``kind`` when the run has none."""
    if stage.broker is None:
        raise HarnessError(
            f"incident {kind} needs control of the broker: a local one, or --broker-stop-cmd and "
            "--broker-start-cmd for a cluster"
        )
    return stage.broker

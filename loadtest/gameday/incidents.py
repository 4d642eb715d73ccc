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
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from loadtest.errors import HarnessError
from loadtest.gameday.broker_incidents import (
    BrokerDataLoss,
    BrokerNodeKill,
    BrokerNodeRestart,
    BrokerPause,
    BrokerRestart,
    UncleanElection,
)
from loadtest.gameday.incident import Incident, Stage, Step
from loadtest.gameday.load_incidents import Faults, Load, SensorStorm
from loadtest.gameday.network_incidents import FlakyLink, LinkCap, Partition
from loadtest.gameday.pipeline_incidents import (
    CheckpointStall,
    CpuHog,
    PipelineKill,
    PipelineRestart,
    WorkerKill,
)
from simulator.config import FaultConfig, SimulatorError

log = logging.getLogger(__name__)


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
        Partition,
        FlakyLink,
        LinkCap,
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

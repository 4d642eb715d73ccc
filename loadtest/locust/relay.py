"""The simulators of a Locust run as the harness incidents see them: their controls leave as fleet events for the Locust side, their counters come back."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from loadtest.errors import HarnessError
from loadtest.locust.lines import Events
from loadtest.run.controls import (
    AddSensors,
    ClearFaults,
    Control,
    RecreateTopics,
    SetFaults,
    SetLoad,
    to_wire,
)
from loadtest.run.stage import RunStage
from simulator.config import FaultConfig


class FleetRelay:
    """The simulators of a Locust run as incidents see them: their controls go out as ``fleet`` events.

    The Locust side passes each one to the simulators of its processes, and sends back the fleet's counters
    and the load its users make (``update``), which the sampler records and load incidents return to.
    """

    def __init__(self, events: Events) -> None:
        self._events = events
        self._lock = threading.Lock()
        self.load = 1.0
        self.users = 0
        self.stats: dict[str, Any] = {}
        self.pids: list[int] = []
        self.stopping = False

    def update(self, stats: Mapping[str, Any], load: float, users: int, pids: Sequence[int]) -> None:
        """The fleet's latest counters, the load its users make and its local simulators' process ids.

        Once the load is stopping (``stop_load``) the load and users stay as they were: the users leave
        before the simulators have sent their last messages, and the run's load is the one asked for.
        """
        with self._lock:
            self.stats, self.pids = dict(stats), list(pids)
            if not self.stopping:
                self.load, self.users = float(load), int(users)

    def stop_load(self) -> None:
        """Locust is stopping the users: keep the load they made."""
        with self._lock:
            self.stopping = True

    def send(self, control: Control) -> None:
        """Send one control to every simulator of the run (as a ``fleet`` event to the Locust side)."""
        self._events.send("fleet", **to_wire(control))

    def set_load_factor(self, factor: float) -> None:
        """Have the simulators send at ``factor`` (the users' own load again when it equals theirs)."""
        self.send(SetLoad(factor))

    def set_faults(self, faults: FaultConfig, sensor: str | None = None) -> None:
        """Change fault rates on every simulator."""
        self.send(SetFaults(faults, sensor))

    def clear_faults(self, sensor: str | None = None) -> None:
        """Drop per-sensor rates on every simulator."""
        self.send(ClearFaults(sensor))

    def add_sensors(self, count: int) -> None:
        """Have ``count`` sensors join, shared among the simulators."""
        self.send(AddSensors(count))

    def recreate_topics(self) -> None:
        """Have every simulator create its sensors' topics again."""
        self.send(RecreateTopics())

    def sample(self) -> dict[str, Any]:
        """The fleet's counters as sampler columns (those ``sotw run`` records for its simulator)."""
        with self._lock:
            s, load, users = self.stats, self.load, self.users
        faults = s.get("faults") or {}
        return {
            "planned": s.get("planned", 0),
            "sent": s.get("sent", 0),
            "counters_ts": s.get("taken_s"),
            "acked": s.get("acked", 0),
            "failed": s.get("failed", 0),
            "lateness_p99_ms": s.get("lateness_p99_ms"),
            "faults_injected": sum(int(v) for v in faults.values()),
            "load": load,
            "users": users,
        }


class LocustStage(RunStage):
    """``RunStage`` of a Locust run: load incidents return to the users' load, not to a fixed factor."""

    def __init__(self, relay: FleetRelay, *args: Any, external: bool = False, topic_prefix: str = "") -> None:
        super().__init__(relay, *args)
        self._topic_prefix = topic_prefix
        self.relay = relay
        self.external = external

    @property
    def base_load_factor(self) -> float:
        """The load the users make now."""
        return self.relay.load

    def _ours(self) -> None:
        if self.external:
            raise HarnessError(
                "pipeline incidents need a pipeline the harness started (sotw's, or --pipeline-cmd), not one it "
                "only watches (--attach, --no-pipeline)"
            )

    def kill_pipeline(self) -> None:
        """SIGKILL the pipeline's process tree."""
        self._ours()
        super().kill_pipeline()

    def stop_pipeline(self) -> int | None:
        """Stop the pipeline gracefully."""
        self._ours()
        return super().stop_pipeline()

    def start_pipeline(self, changes: Mapping[str, Any]) -> None:
        """Start the pipeline again on its checkpoint."""
        self._ours()
        super().start_pipeline(changes)

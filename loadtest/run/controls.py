"""The simulator's live controls as one typed command set, and the one place that carries a command out.

Incidents and the UI change a running simulator: its load, its fault rates, its sensors, its topics. In
``sotw run`` they call the simulator directly; in a Locust run a control crosses three processes (the harness,
each Locust process, each feeder) as JSON lines. Each control is one frozen dataclass here; ``to_wire`` and
``from_wire`` are its JSON form (``{"op": "load", "factor": 2.0}``), and ``carry_out`` applies one to
anything with the simulator's controls (``loadtest.run.stage.SimulatorControls``). A new control is added here
and nowhere else matches its name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loadtest.run.stage import SimulatorControls
from simulator.config import FaultConfig
from sotw.errors import SotwError


@dataclass(frozen=True)
class SetLoad:
    """Send at ``factor`` times the profile's rate; None: back to the load the Locust users make."""

    factor: float | None


@dataclass(frozen=True)
class SetFaults:
    """Fault rates for every sensor, or for ``sensor`` alone."""

    faults: FaultConfig
    sensor: str | None = None


@dataclass(frozen=True)
class ClearFaults:
    """Drop the per-sensor fault rates of ``sensor`` (every sensor: None)."""

    sensor: str | None = None


@dataclass(frozen=True)
class AddSensors:
    """Have ``count`` new sensors join."""

    count: int


@dataclass(frozen=True)
class RecreateTopics:
    """Create the sensors' topics again (after a broker lost them)."""


@dataclass(frozen=True)
class StopFeeding:
    """End the simulator: close its sessions, flush, write its ledger (a feeder's last command)."""


Control = SetLoad | SetFaults | ClearFaults | AddSensors | RecreateTopics | StopFeeding

OPS: dict[str, type[Control]] = {
    "load": SetLoad,
    "faults": SetFaults,
    "clear_faults": ClearFaults,
    "add_sensors": AddSensors,
    "recreate_topics": RecreateTopics,
    "stop": StopFeeding,
}
"""Each control's name on the wire."""
_NAMES = {cls: op for op, cls in OPS.items()}


def to_wire(control: Control) -> dict[str, Any]:
    """The control as a JSON object: ``op`` and its fields."""
    fields = {f.name: getattr(control, f.name) for f in dataclasses.fields(control)}
    if isinstance(control, SetFaults):
        fields["faults"] = dataclasses.asdict(control.faults)
    return {"op": _NAMES[type(control)], **fields}


def from_wire(message: Mapping[str, Any]) -> Control:
    """The control a JSON object names.

    Raises
    ------
    ValueError
        If ``op`` names no control, or a field is missing or of the wrong kind (the message says which).
    """
    op = message.get("op")
    cls = OPS.get(op) if isinstance(op, str) else None
    if cls is None:
        raise ValueError(f"unknown control {op!r}; the controls are {', '.join(OPS)}")
    try:
        if cls is SetLoad:
            factor = message.get("factor")
            return SetLoad(None if factor is None else float(factor))
        if cls is SetFaults:
            return SetFaults(FaultConfig.from_mapping(message["faults"]), message.get("sensor"))
        if cls is ClearFaults:
            return ClearFaults(message.get("sensor"))
        if cls is AddSensors:
            return AddSensors(int(message["count"]))
        if cls is RecreateTopics:
            return RecreateTopics()
        return StopFeeding()
    except KeyError as exc:
        raise ValueError(f"control {op!r} needs {exc.args[0]!r}") from None
    except (SotwError, TypeError, ValueError) as exc:
        raise ValueError(f"control {op!r}: {exc}") from None


def carry_out(control: Control, simulator: SimulatorControls, base_load: float = 1.0) -> None:
    """Apply a control to ``simulator``; ``SetLoad(None)`` returns it to ``base_load``.

    ``StopFeeding`` is not a simulator control: whoever runs the simulator handles it before calling this.
    """
    match control:
        case SetLoad(factor=factor):
            simulator.set_load_factor(base_load if factor is None else factor)
        case SetFaults(faults=faults, sensor=sensor):
            simulator.set_faults(faults, sensor)
        case ClearFaults(sensor=sensor):
            simulator.clear_faults(sensor)
        case AddSensors(count=count):
            simulator.add_sensors(count)
        case RecreateTopics():
            simulator.recreate_topics()
        case StopFeeding():
            raise ValueError("StopFeeding stops the feeder; it is not a simulator control")

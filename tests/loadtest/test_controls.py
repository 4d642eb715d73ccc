"""The simulator's live controls: one typed set, the same on the wire in every process, carried out in one place."""

from __future__ import annotations

import pytest

from loadtest.run.controls import (
    OPS,
    AddSensors,
    ClearFaults,
    RecreateTopics,
    SetFaults,
    SetLoad,
    StopFeeding,
    carry_out,
    from_wire,
    to_wire,
)
from simulator.config import FaultConfig


class Recorder:
    """A simulator's controls, recorded (the SimulatorControls protocol)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def set_load_factor(self, factor: float) -> None:
        self.calls.append(("load", factor))

    def set_faults(self, faults: FaultConfig, sensor: str | None = None) -> None:
        self.calls.append(("faults", faults.gap, sensor))

    def clear_faults(self, sensor: str | None = None) -> None:
        self.calls.append(("clear", sensor))

    def add_sensors(self, count: int) -> None:
        self.calls.append(("add", count))

    def recreate_topics(self) -> None:
        self.calls.append(("recreate",))


CONTROLS = [
    SetLoad(2.5),
    SetLoad(None),
    SetFaults(FaultConfig(gap=0.1), "0003"),
    ClearFaults(None),
    AddSensors(4),
    RecreateTopics(),
    StopFeeding(),
]


@pytest.mark.parametrize("control", CONTROLS, ids=lambda c: type(c).__name__)
def test_every_control_comes_back_from_its_json_form_as_it_went(control) -> None:
    assert from_wire(to_wire(control)) == control
    assert to_wire(control)["op"] in OPS


def test_controls_are_carried_out_on_a_simulator_and_load_none_returns_to_the_base_load() -> None:
    sim = Recorder()
    for control in CONTROLS[:-1]:
        carry_out(control, sim, base_load=1.5)
    assert sim.calls == [
        ("load", 2.5),
        ("load", 1.5),
        ("faults", 0.1, "0003"),
        ("clear", None),
        ("add", 4),
        ("recreate",),
    ]
    with pytest.raises(ValueError, match="stops the feeder"):
        carry_out(StopFeeding(), sim)


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ({"op": "teleport"}, "unknown control 'teleport'; the controls are load, faults"),
        ({"op": "add_sensors"}, "control 'add_sensors' needs 'count'"),
        ({"op": "faults", "faults": {"gap": 0.1, "meteor": 1}}, "control 'faults': .*meteor"),
        ({"op": "load", "factor": "lots"}, "control 'load': could not convert"),
    ],
)
def test_a_bad_control_is_refused_naming_what_is_wrong(message, error) -> None:
    with pytest.raises(ValueError, match=error):
        from_wire(message)

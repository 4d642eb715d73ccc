"""What the Locust side asks of the harness session: one typed set, the same on the wire both ways."""

from __future__ import annotations

import json

import pytest

from loadtest.locust.commands import (
    OPS,
    Begin,
    Finish,
    FireIncident,
    Quit,
    StopLoad,
    UpdateFleet,
    from_wire,
    to_wire,
)

COMMANDS = [
    Begin(),
    UpdateFleet(2.0, 20, {"sent": 1200, "acked": 1190}, (4242, 4343)),
    FireIncident({"kind": "broker_freeze", "duration_s": 10}),
    StopLoad(),
    Finish(interrupted=True, command="sotw locust --headless"),
    Quit(),
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: type(c).__name__)
def test_every_command_comes_back_from_its_json_line_as_it_went(command) -> None:
    line = json.dumps(to_wire(command))  # what crosses the pipe
    assert from_wire(json.loads(line)) == command
    assert to_wire(command)["op"] in OPS


def test_a_line_naming_no_command_is_refused_with_the_commands_there_are() -> None:
    with pytest.raises(ValueError, match="unknown command 'fleets'; the commands are begin, fleet"):
        from_wire({"op": "fleets"})


def test_a_command_missing_a_field_names_it() -> None:
    with pytest.raises(ValueError, match="command 'fleet' needs 'users'"):
        from_wire({"op": "fleet", "load": 1.0})
    with pytest.raises(ValueError, match="command 'incident': incident must be an object"):
        from_wire({"op": "incident", "incident": "broker_freeze"})

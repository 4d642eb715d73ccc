"""What the Locust side asks of the harness session, as one typed command set.

The Locust process (``loadtest.locust.conductor``) drives a run in the harness process
(``loadtest.locust.live``) over a pipe, one JSON line a command. Each command is one frozen dataclass here;
``to_wire`` and ``from_wire`` are its JSON form (``{"op": "incident", "incident": {...}}``), and the session
carries one out in ``Session.handle``, the one place that matches them. A new command is added here and in
that one ``match``. The simulator's own controls (load, faults, sensors) are ``loadtest.run.controls``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Begin:
    """Start the next run (its warm-up first)."""


@dataclass(frozen=True)
class UpdateFleet:
    """The fleet's counters once a second: what Locust's users send, at which load, from which processes."""

    load: float
    users: int
    stats: Mapping[str, Any] = field(default_factory=dict)
    pids: tuple[int, ...] = ()


@dataclass(frozen=True)
class FireIncident:
    """Fire an incident now (the mapping of a drill file's ``[[incidents]]``, without ``at_s``)."""

    incident: Mapping[str, Any]


@dataclass(frozen=True)
class StopLoad:
    """Locust is about to stop its users: the run's load is the one they made until now."""


@dataclass(frozen=True)
class Finish:
    """The simulators have stopped: drain, settle and verify the run."""

    interrupted: bool = False
    command: str = ""


@dataclass(frozen=True)
class Quit:
    """End the session: stop the pipeline and the broker."""


Command = Begin | UpdateFleet | FireIncident | StopLoad | Finish | Quit

OPS: dict[str, type[Command]] = {
    "begin": Begin,
    "fleet": UpdateFleet,
    "incident": FireIncident,
    "stopping": StopLoad,
    "finish": Finish,
    "quit": Quit,
}
"""Each command's name on the wire."""
_NAMES = {cls: op for op, cls in OPS.items()}


def to_wire(command: Command) -> dict[str, Any]:
    """The command as a JSON object: ``op`` and its fields."""
    fields = {f.name: getattr(command, f.name) for f in dataclasses.fields(command)}
    if isinstance(command, UpdateFleet):
        fields["stats"], fields["pids"] = dict(command.stats), list(command.pids)
    if isinstance(command, FireIncident):
        fields["incident"] = dict(command.incident)
    return {"op": _NAMES[type(command)], **fields}


def op_of(command: Command) -> str:
    """The command's name on the wire (errors about it name it so)."""
    return _NAMES[type(command)]


def from_wire(message: Mapping[str, Any]) -> Command:
    """The command a JSON object names.

    Raises
    ------
    ValueError
        If ``op`` names no command, or a field is missing or of the wrong kind (the message says which).
    """
    op = message.get("op")
    cls = OPS.get(op) if isinstance(op, str) else None
    if cls is None:
        raise ValueError(f"unknown command {op!r}; the commands are {', '.join(OPS)}")
    try:
        if cls is UpdateFleet:
            stats = message.get("stats") or {}
            if not isinstance(stats, Mapping):
                raise TypeError(f"stats must be an object, not {type(stats).__name__}")
            pids = tuple(int(p) for p in message.get("pids") or ())
            return UpdateFleet(float(message["load"]), int(message["users"]), stats, pids)
        if cls is FireIncident:
            incident = message["incident"]
            if not isinstance(incident, Mapping):
                raise TypeError(f"incident must be an object, not {type(incident).__name__}")
            return FireIncident(incident)
        if cls is Finish:
            return Finish(bool(message.get("interrupted")), str(message.get("command") or ""))
        return cls()  # type: ignore[call-arg]  # the commands without fields
    except KeyError as exc:
        raise ValueError(f"command {op!r} needs {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"command {op!r}: {exc}") from None

"""Load over time for a Locust run, by name: steady 1x, step 1x to 10x, spike, soak.

A shape is a list of levels (seconds at a load factor). Its clock starts when the run's steady phase does:
until the pipeline has warmed up (``loadtest.run.runner``'s rule, applied by the harness), a shape holds its
first level, so a slow Spark start never eats into the measured levels. After the last level the shape ends,
and with it the Locust run (drain, verdict). ``loadtest/locust/locustfile.py`` turns the load into users
(``loadtest.locust.fleetplan``) in a ``LoadTestShape``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from loadtest.errors import HarnessError

#: Seconds a soak lasts unless ``stage_s`` says otherwise.
SOAK_S = 3600.0


@dataclass(frozen=True)
class Level:
    """``seconds`` at ``load`` times the profile's 1x rate."""

    seconds: float
    load: float


@dataclass(frozen=True)
class Shape:
    """A named sequence of levels."""

    name: str
    levels: tuple[Level, ...]

    @property
    def seconds(self) -> float:
        """How long the levels last in all."""
        return sum(level.seconds for level in self.levels)

    @property
    def first_load(self) -> float:
        """The load held during the warm-up."""
        return self.levels[0].load

    @property
    def peak(self) -> float:
        """The highest load."""
        return max(level.load for level in self.levels)

    def load_at(self, t: float) -> float | None:
        """The load ``t`` seconds into the steady phase; None once the shape is over."""
        for level in self.levels:
            if t < level.seconds:
                return level.load
            t -= level.seconds
        return None


def _positive(name: str, value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise HarnessError(f"{name} must be a number > 0, got {value!r}")
    return value


def make_shape(name: str, steady_s: float, load: float | None = None, stage_s: float | None = None) -> Shape:
    """The shape called ``name``.

    Parameters
    ----------
    name
        ``steady`` (hold ``load``, 1x by default, for ``steady_s``), ``step`` (1x, 2x, ... up to ``load``,
        10x by default, in equal stages over ``steady_s``), ``spike`` (1x, then ``load`` (10x), then 1x again,
        a third of ``steady_s`` each) or ``soak`` (hold ``load`` (1x) for an hour).
    steady_s
        The profile's steady-phase length, which the stages share.
    load
        The level held (steady, soak) or reached (step, spike).
    stage_s
        Seconds per stage instead (steady and soak have one stage).

    Raises
    ------
    HarnessError
        For an unknown name or a bad length or load, naming the choices.
    """
    if load is not None:
        _positive("--load", load)
    if stage_s is not None:
        _positive("--stage-s", stage_s)
    if name == "steady":
        return Shape(name, (Level(stage_s or _positive("steady_s", steady_s), load or 1.0),))
    if name == "soak":
        return Shape(name, (Level(stage_s or SOAK_S, load or 1.0),))
    if name == "step":
        peak = load or 10.0
        loads = [float(k) for k in range(1, math.ceil(peak))] + [peak]
        if peak < 1:
            loads = [peak]
        each = stage_s or _positive("steady_s", steady_s) / len(loads)
        return Shape(name, tuple(Level(each, x) for x in loads))
    if name == "spike":
        peak = load or 10.0
        each = stage_s or _positive("steady_s", steady_s) / 3
        return Shape(name, (Level(each, 1.0), Level(each, peak), Level(each, 1.0)))
    raise HarnessError(f"unknown shape {name!r}: choose one of {', '.join(SHAPES)}")


SHAPES = ("steady", "step", "spike", "soak")

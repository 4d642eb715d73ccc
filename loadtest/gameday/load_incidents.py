"""Incidents of the load: a burst or ramp of the rate, fault rates raised for a while, a storm of sensors joining."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

from loadtest.errors import HarnessError
from loadtest.gameday.incident import Incident, Stage, number
from simulator.config import FaultConfig


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
        number("load: factor or ramp_to", self.factor if self.factor is not None else self.ramp_to, 0.01)
        number("load: ramp_s", self.ramp_s)
        number("load: duration_s", self.duration_s)
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
        number("faults: ramp_s", self.ramp_s)
        number("faults: duration_s", self.duration_s)

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

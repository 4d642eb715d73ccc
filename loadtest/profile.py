"""Load-test profiles: the named 1x baseline a run multiplies, read from a TOML scenario file.

A profile states everything a run depends on (the fleet, the rate, the faults and their schedule, the pipeline's
policy and trigger, the phase lengths and the pass criteria), so the report can print it in full and a run can
be repeated. ``loadtest/scenarios.toml`` ships the defaults; users write their own with the same layout::

    [profiles.baseline]
    description = "..."
    [profiles.baseline.simulator]         # any SimulatorConfig field; rate is the 1x rate
    sensors = 24
    [profiles.baseline.simulator.faults]
    gap = 0.001
    [profiles.baseline.pipeline]           # policy, trigger, session_timeout, extra_args
    policy = "ordered"
    [profiles.baseline.run]                # warmup_s, steady_s, drain_max_s, max_lag_s, ...
    steady_s = 60
    [[profiles.baseline.schedule]]         # from start_s to end_s (seconds since load started): these faults
    start_s = 20
    end_s = 40
    faults = { gap = 0.01 }
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from loadtest.errors import HarnessError
from simulator.config import FaultConfig, SimulatorConfig, known_settings
from sotw.errors import SotwError

_FACTOR = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*x?\s*$", re.IGNORECASE)


def parse_load(text: str | float) -> float:
    """``"10x"``, ``"2.5x"``, ``"1"`` or a number -> the load factor."""
    if isinstance(text, int | float):
        factor = float(text)
    else:
        match = _FACTOR.match(text)
        if not match:
            raise HarnessError(f"load must look like 1x, 10x or 2.5x, got {text!r}")
        factor = float(match.group(1))
    if factor <= 0:
        raise HarnessError(f"load factor must be > 0, got {text!r}")
    return factor


@dataclass(frozen=True)
class PipelineSettings:
    """How the harness runs the pipeline under test."""

    policy: str = "ordered"
    trigger: str = "1s"
    session_timeout: str = "30s"
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunSettings:
    """Phase lengths and pass criteria.

    Parameters
    ----------
    warmup_s
        Load before measuring (the pipeline's first batches compile and warm the JVM).
    steady_s
        The measured phase.
    drain_max_s
        After the load stops, how long the pipeline may take to catch up before the run fails.
    max_lag_s
        Pass criterion: age of the oldest unprocessed message during the steady phase stays below this
        (the 95th percentile of the per-second samples, so one slow batch does not fail a run).
    pipeline_start_timeout_s
        How long Spark may take to start.
    """

    warmup_s: float = 15.0
    steady_s: float = 60.0
    drain_max_s: float = 90.0
    max_lag_s: float = 15.0
    pipeline_start_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        for name in ("warmup_s", "steady_s", "drain_max_s", "max_lag_s", "pipeline_start_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value < 0:
                raise HarnessError(f"run.{name} must be a number >= 0, got {value!r}")


@dataclass(frozen=True)
class FaultWindow:
    """Faults switched on from ``start_s`` to ``end_s`` seconds after the load starts."""

    start_s: float
    end_s: float
    faults: FaultConfig

    def __post_init__(self) -> None:
        if not 0 <= self.start_s < self.end_s:
            raise HarnessError(
                f"schedule window needs 0 <= start_s < end_s, got {self.start_s}..{self.end_s}"
            )


@dataclass(frozen=True)
class Profile:
    """A named 1x baseline: the fleet and its rate, faults, pipeline settings, phases and criteria."""

    name: str
    description: str
    simulator: SimulatorConfig
    pipeline: PipelineSettings = field(default_factory=PipelineSettings)
    run: RunSettings = field(default_factory=RunSettings)
    schedule: tuple[FaultWindow, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """Everything in the profile, JSON-ready, for ``results.json`` and the report."""
        out: dict[str, Any] = _jsonable(dataclasses.asdict(self))
        return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def profile_from_mapping(name: str, data: Mapping[str, Any], where: str = "scenario") -> Profile:
    """Build a ``Profile`` from one ``[profiles.NAME]`` table."""
    prefix = f"{where}: profiles.{name}"
    try:
        sim = SimulatorConfig.from_mapping(dict(data.get("simulator", {})), where=f"{prefix}.simulator")
        pipe = dict(known_settings(PipelineSettings, data.get("pipeline", {}), f"{prefix}.pipeline"))
        pipe["extra_args"] = tuple(pipe.get("extra_args", ()))
        run = RunSettings(**known_settings(RunSettings, data.get("run", {}), f"{prefix}.run"))
        schedule = tuple(
            FaultWindow(
                float(w["start_s"]),
                float(w["end_s"]),
                FaultConfig.from_mapping(w.get("faults", {}), where=f"{prefix}.schedule.faults"),
            )
            for w in data.get("schedule", [])
        )
    except (KeyError, TypeError) as exc:
        raise HarnessError(f"{prefix} is incomplete or mistyped: {exc}") from None
    except SotwError as exc:
        raise HarnessError(str(exc)) from None
    extra = set(data) - {"description", "simulator", "pipeline", "run", "schedule"}
    if extra:
        raise HarnessError(f"unknown section {prefix}.{sorted(extra)[0]}")
    return Profile(name, str(data.get("description", "")), sim, PipelineSettings(**pipe), run, schedule)


def default_scenario() -> Path:
    """The scenario file shipped with sotw."""
    return Path(str(resources.files("loadtest").joinpath("scenarios.toml")))


def load_profile(name: str = "baseline", path: Path | None = None) -> Profile:
    """Read profile ``name`` from ``path`` (default: the shipped ``scenarios.toml``)."""
    path = path or default_scenario()
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise HarnessError(f"cannot read scenario {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise HarnessError(f"scenario {path} is not valid TOML: {exc}") from None
    profiles = doc.get("profiles", {})
    if name not in profiles:
        raise HarnessError(
            f"scenario {path} has no profile {name!r} (profiles: {', '.join(sorted(profiles))})"
        )
    return profile_from_mapping(name, profiles[name], where=path.name)

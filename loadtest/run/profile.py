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
    [profiles.baseline.pipeline]           # any PipelineSettings field: policy, trigger, window_messages, ...
    policy = "ordered"
    [profiles.baseline.run]                # warmup_s, steady_s, drain_max_s, max_lag_s, max_end_to_end_p99_s
    steady_s = 60
    [[profiles.baseline.schedule]]         # from start_s to end_s (seconds since load started): these faults
    start_s = 20
    end_s = 40
    faults = { gap = 0.01 }
    [[profiles.baseline.incidents]]        # game-day incidents, at_s seconds into the steady phase
    kind = "pipeline_kill"                 # (loadtest.gameday.incidents lists every kind and its parameters)
    at_s = 30
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from loadtest.correctness.policies import Policy
from loadtest.errors import HarnessError
from loadtest.gameday.incident import Incident
from loadtest.gameday.incidents import incident_from_mapping
from pipeline.config import SOURCES, parse_trigger
from pipeline.errors import ConfigError
from pipeline.policies import PolicyConfig
from simulator.config import FaultConfig, SimulatorConfig, known_settings
from sotw.errors import SotwError
from sotw.tomlfile import read_toml

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


# ``sotw pipeline`` flags that PipelineSettings holds as typed fields: extra_args must not repeat them.
_TYPED_FLAGS = {
    "--policy": "policy",
    "--trigger": "trigger",
    "--session-timeout": "session_timeout",
    "--window-messages": "window_messages",
    "--window-ms": "window_ms",
    "--max-offsets-per-trigger": "max_offsets_per_trigger",
    "--fail-on-data-loss": "fail_on_data_loss",
    "--no-fail-on-data-loss": "fail_on_data_loss",
    "--shuffle-partitions": "shuffle_partitions",
    "--discovery-interval": "discovery_interval",
    "--master": "master",
    "--source": "source",
}


@dataclass(frozen=True)
class PipelineSettings:
    """How the harness runs the pipeline under test: the ``sotw pipeline`` settings the verifier also needs.

    The harness builds the pipeline's command line from these fields and the verifier's model of the policy
    from the same fields, so the two cannot disagree.

    Parameters
    ----------
    policy
        Integrity policy (``pipeline.policies.POLICIES``).
    trigger
        Micro-batch interval (``1s``, ``500ms``); the harness runs the pipeline continuously, so not
        ``availableNow``.
    session_timeout
        Sessions quiet for this long are closed as timed out (``20s``).
    window_messages, window_ms
        ``window`` policy only: the lateness, in messages and/or ms of event time.
    max_offsets_per_trigger
        Records per micro-batch, at most; None for no limit.
    fail_on_data_loss
        Stop if offsets still needed are gone.
    shuffle_partitions
        State partitions; None for the pipeline's default.
    discovery_interval
        How often the pipeline looks for new topics.
    master
        The Spark master the pipeline runs on (``spark://HOST:PORT`` for a standalone cluster); None for the
        pipeline's own default (``local[2]``).
    source
        The pipeline's Kafka reader (``pipeline.config.SOURCES``: ``spark-kafka``, Spark's own connector, or
        ``sotw-kafka``, sotw's Python data source); None for the pipeline's default.
    extra_args
        Any other ``sotw pipeline`` flags, passed through unread (``--conf k=v``); a flag that has a field
        above is refused here, so the harness never misreads it.
    """

    policy: str = "ordered"
    trigger: str = "1s"
    session_timeout: str = "30s"
    window_messages: int | None = None
    window_ms: int | None = None
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    shuffle_partitions: int | None = None
    discovery_interval: str = "1s"
    master: str | None = None
    source: str | None = None
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("window_messages", "window_ms", "max_offsets_per_trigger", "shuffle_partitions"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise HarnessError(f"pipeline.{name} must be a whole number, got {value!r}")
        for name in ("max_offsets_per_trigger", "shuffle_partitions"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise HarnessError(f"pipeline.{name} must be at least 1, got {value!r}")
        if not isinstance(self.fail_on_data_loss, bool):
            raise HarnessError(
                f"pipeline.fail_on_data_loss must be true or false, got {self.fail_on_data_loss!r}"
            )
        for name in ("trigger", "session_timeout", "discovery_interval"):
            value = getattr(self, name)
            try:
                ms = parse_trigger(value) if isinstance(value, str) else None
            except ValueError:
                ms = None
            if not ms:
                raise HarnessError(f"pipeline.{name} must be a duration such as 1s or 500ms, got {value!r}")
        if self.master is not None and (not isinstance(self.master, str) or not self.master.strip()):
            raise HarnessError(
                f"pipeline.master must be a Spark master URL such as spark://host:7077, got {self.master!r}"
            )
        if self.source is not None and self.source not in SOURCES:
            raise HarnessError(f"pipeline.source must be one of {', '.join(SOURCES)}, got {self.source!r}")
        if not isinstance(self.extra_args, tuple) or not all(isinstance(a, str) for a in self.extra_args):
            raise HarnessError(f"pipeline.extra_args must be a list of strings, got {self.extra_args!r}")
        for arg in self.extra_args:
            flag = arg.split("=", 1)[0]
            if flag in _TYPED_FLAGS:
                raise HarnessError(
                    f"pipeline.extra_args has {arg!r}: set pipeline.{_TYPED_FLAGS[flag]} instead, so the "
                    "verifier models the same setting"
                )
        try:
            self.policy_config()
        except ConfigError as exc:
            raise HarnessError(f"pipeline: {exc}") from None

    @property
    def trigger_ms(self) -> int:
        """The trigger interval in ms."""
        return parse_trigger(self.trigger) or 0

    @property
    def session_timeout_ms(self) -> int:
        """The session timeout in ms."""
        return parse_trigger(self.session_timeout) or 0

    def policy_config(self) -> PolicyConfig:
        """The policy as the pipeline will apply it (validated by the pipeline's own rules)."""
        return PolicyConfig(
            policy=self.policy,
            session_timeout_ms=self.session_timeout_ms,
            window_messages=self.window_messages,
            window_ms=self.window_ms,
        )

    def verifier_policy(self, timeouts_expire: bool = True) -> Policy:
        """The policy as the verifier models it, from the same fields the pipeline is started with.

        ``timeouts_expire``: whether the session timeout passed before the run ended (see ``Policy``).
        """
        return Policy(
            self.policy,
            window_messages=self.window_messages,
            window_ms=self.window_ms,
            timeouts_expire=timeouts_expire,
            session_timeout_ms=self.session_timeout_ms,
            trigger_ms=self.trigger_ms,
        )

    def args(self) -> list[str]:
        """These settings as ``sotw pipeline`` flags."""
        out = [
            "--policy",
            self.policy,
            "--trigger",
            self.trigger,
            "--session-timeout",
            self.session_timeout,
            "--discovery-interval",
            self.discovery_interval,
            "--fail-on-data-loss" if self.fail_on_data_loss else "--no-fail-on-data-loss",
        ]
        for flag, value in (
            ("--window-messages", self.window_messages),
            ("--window-ms", self.window_ms),
            ("--max-offsets-per-trigger", self.max_offsets_per_trigger),
            ("--shuffle-partitions", self.shuffle_partitions),
            ("--master", self.master),
            ("--source", self.source),
        ):
            if value is not None:
                out += [flag, str(value)]
        return [*out, *self.extra_args]


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
    max_end_to_end_p99_s
        Pass criterion: the p99 end-to-end latency of the messages meant for the steady phase stays below
        this; None for no bound.
    pipeline_start_timeout_s
        How long Spark may take to start; also how long past ``warmup_s`` the warm-up waits for the pipeline
        to catch up.
    min_judged
        The share of sessions the verifier must have judged for the run to PASS; below it the run is
        INCONCLUSIVE (``sotw run --min-judged``).
    min_steady_triggers
        The pipeline triggers the steady phase must last for the run to PASS; fewer is INCONCLUSIVE.
    """

    warmup_s: float = 15.0
    steady_s: float = 60.0
    drain_max_s: float = 90.0
    max_lag_s: float = 15.0
    max_end_to_end_p99_s: float | None = None
    pipeline_start_timeout_s: float = 120.0
    min_judged: float = 0.9
    min_steady_triggers: int = 10

    def __post_init__(self) -> None:
        for name in (
            "warmup_s",
            "steady_s",
            "drain_max_s",
            "max_lag_s",
            "max_end_to_end_p99_s",
            "pipeline_start_timeout_s",
        ):
            value = getattr(self, name)
            if value is None and name == "max_end_to_end_p99_s":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise HarnessError(f"run.{name} must be a number >= 0, got {value!r}")
        share = self.min_judged
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share <= 1:
            raise HarnessError(f"run.min_judged must be a share between 0 and 1, got {share!r}")
        if (
            isinstance(self.min_steady_triggers, bool)
            or not isinstance(self.min_steady_triggers, int)
            or (self.min_steady_triggers < 0)
        ):
            raise HarnessError(
                f"run.min_steady_triggers must be a whole number >= 0, got {self.min_steady_triggers!r}"
            )


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
    incidents: tuple[Incident, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """Everything in the profile, JSON-ready, for ``results.json`` and the report."""
        out: dict[str, Any] = _jsonable(dataclasses.asdict(self))
        out["incidents"] = [{"kind": i.kind, **_jsonable(dataclasses.asdict(i))} for i in self.incidents]
        return out


def changed(
    profile: Profile,
    where: str,
    simulator: Mapping[str, Any] | None = None,
    pipeline: Mapping[str, Any] | None = None,
    run: Mapping[str, Any] | None = None,
) -> Profile:
    """``profile`` with some settings changed (a drill's ``simulator``, ``pipeline`` and ``run`` tables).

    A ``faults`` table replaces the profile's fault rates whole (``faults = {}`` turns them off).

    Raises
    ------
    HarnessError
        Naming ``where`` and the unknown setting or the bad value.
    """
    try:
        sim_changes = dict(known_settings(SimulatorConfig, simulator or {}, f"{where}.simulator"))
        if "faults" in sim_changes:
            sim_changes["faults"] = FaultConfig.from_mapping(
                sim_changes["faults"], where=f"{where}.simulator.faults"
            )
        if "sensor_faults" in sim_changes:
            sim_changes["sensor_faults"] = {
                str(k): FaultConfig.from_mapping(v, where=f"{where}.simulator.sensor_faults.{k}")
                for k, v in dict(sim_changes["sensor_faults"]).items()
            }
        new_sim = profile.simulator.replace(**sim_changes)
        pipe_changes = dict(known_settings(PipelineSettings, pipeline or {}, f"{where}.pipeline"))
        if "extra_args" in pipe_changes:
            pipe_changes["extra_args"] = tuple(pipe_changes["extra_args"])
        new_pipeline = dataclasses.replace(profile.pipeline, **pipe_changes)
        new_run = dataclasses.replace(profile.run, **known_settings(RunSettings, run or {}, f"{where}.run"))
    except SotwError as exc:
        raise HarnessError(str(exc)) from None
    except TypeError as exc:
        raise HarnessError(f"{where}: {exc}") from None
    return dataclasses.replace(profile, simulator=new_sim, pipeline=new_pipeline, run=new_run)


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
        incidents = tuple(
            incident_from_mapping(item, where=f"{prefix}.incidents[{i}]")
            for i, item in enumerate(data.get("incidents", []))
        )
    except (KeyError, TypeError) as exc:
        raise HarnessError(f"{prefix} is incomplete or mistyped: {exc}") from None
    except SotwError as exc:
        raise HarnessError(str(exc)) from None
    extra = set(data) - {"description", "simulator", "pipeline", "run", "schedule", "incidents"}
    if extra:
        raise HarnessError(f"unknown section {prefix}.{sorted(extra)[0]}")
    return Profile(
        name, str(data.get("description", "")), sim, PipelineSettings(**pipe), run, schedule, incidents
    )


def default_scenario() -> Path:
    """The scenario file shipped with sotw."""
    return Path(str(resources.files("loadtest").joinpath("scenarios.toml")))


def load_profile(name: str = "baseline", path: Path | None = None) -> Profile:
    """Read profile ``name`` from ``path`` (default: the shipped ``scenarios.toml``)."""
    path = path or default_scenario()
    doc = read_toml(path, "scenario", HarnessError)
    profiles = doc.get("profiles", {})
    if name not in profiles:
        raise HarnessError(
            f"scenario {path} has no profile {name!r} (profiles: {', '.join(sorted(profiles))})"
        )
    return profile_from_mapping(name, profiles[name], where=path.name)

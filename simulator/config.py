"""Every knob of the simulator as frozen, validated dataclasses, and the TOML scenario loader.

Configuration flows one way: the CLI or a scenario file builds a ``SimulatorConfig``, the ``Simulator`` reads
it. Validation happens here, once, and every error names the field and the bad value.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sotw.errors import SotwError
from sotw.kafka import setting_text
from sotw.tomlfile import read_toml


class SimulatorError(SotwError):
    """An expected failure of the simulator: a bad configuration, a broker that will not take messages."""


#: librdkafka settings the simulator starts from: idempotent, acks from all replicas, big batches. A fleet
#: spreads its rate over one topic per sensor, so a short linger sends many tiny batches: 100 ms keeps
#: librdkafka's requests (and the broker's record batches) few, at the cost
#: of up to 0.1 s more publish latency, small beside a pipeline's trigger interval.
DEFAULT_PRODUCER: Mapping[str, str] = {
    "enable.idempotence": "true",
    "acks": "all",
    "linger.ms": "100",
    "batch.size": "1000000",
    "batch.num.messages": "100000",
    "queue.buffering.max.messages": "500000",
    "queue.buffering.max.kbytes": "1048576",
    "compression.type": "none",
    "message.timeout.ms": "60000",
}

#: ``SimulatorConfig.producer_path``'s values.
PRODUCER_PATHS = ("auto", "direct", "client")
FAULT_KINDS = ("gap", "duplicate", "delayed", "malformed", "abandoned")
#: The ``FaultConfig`` rate of each fault kind.
FAULT_RATES = {
    "gap": "gap",
    "duplicate": "duplicate",
    "delayed": "delayed",
    "malformed": "malformed",
    "abandoned": "abandon",
}
_SENSOR_ID = re.compile(r"^[A-Za-z0-9._-]+$")
_TOPIC_PREFIX = re.compile(r"^[A-Za-z0-9._-]*$")


def _check(ok: bool, name: str, value: Any, rule: str) -> None:
    if not ok:
        raise SimulatorError(f"{name} must be {rule}, got {value!r}")


def _rate(name: str, value: Any) -> None:
    _check(
        isinstance(value, int | float) and not isinstance(value, bool) and 0.0 <= value <= 1.0,
        name,
        value,
        "a number between 0 and 1",
    )


@dataclass(frozen=True)
class FaultConfig:
    """How often each fault is injected; all rates are fractions of messages (0..1).

    ``gap``, ``duplicate``, ``delayed`` and ``malformed`` apply to snapshots and updates and exclude each
    other, so their sum must stay at or below 1; ``abandon`` applies to the ``end`` of each session.

    Parameters
    ----------
    gap
        Fraction of messages recorded in the ledger but never sent.
    duplicate
        Fraction of messages sent twice; the copy goes out after a delay drawn like ``delayed``'s, or at once.
    delayed
        Fraction of messages held back; they go out after the delay and after a later seq of their session.
    malformed
        Fraction of messages whose value is replaced by bytes that break the wire format.
    abandon
        Fraction of sessions that end without an ``end`` message (the sensor starts a new session).
    delay_ms
        Mean of the exponential delay distribution, milliseconds.
    delay_max_ms
        Upper bound of a delay, milliseconds.
    """

    gap: float = 0.0
    duplicate: float = 0.0
    delayed: float = 0.0
    malformed: float = 0.0
    abandon: float = 0.0
    delay_ms: float = 200.0
    delay_max_ms: float = 2000.0

    def __post_init__(self) -> None:
        for name in ("gap", "duplicate", "delayed", "malformed", "abandon"):
            _rate(f"faults.{name}", getattr(self, name))
        total = self.gap + self.duplicate + self.delayed + self.malformed
        _check(total <= 1.0 + 1e-12, "faults.gap+duplicate+delayed+malformed", total, "at most 1")
        for name in ("delay_ms", "delay_max_ms"):
            value = getattr(self, name)
            _check(
                isinstance(value, int | float) and math.isfinite(value) and value >= 0,
                f"faults.{name}",
                value,
                "a non-negative number",
            )

    @property
    def any(self) -> bool:
        """True if any fault is switched on."""
        return bool(self.gap or self.duplicate or self.delayed or self.malformed or self.abandon)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "faults") -> FaultConfig:
        """Build from a TOML table or dict, naming any unknown key."""
        return cls(**known_settings(cls, data, where))


def known_settings(cls: type, data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``data`` as keyword arguments for dataclass ``cls``; an unknown key is named with ``where``."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise SimulatorError(f"unknown setting {where}.{unknown[0]} (known: {', '.join(sorted(names))})")
    return dict(data)


@dataclass(frozen=True)
class SimulatorConfig:
    """What the fleet looks like, how fast it publishes, how it breaks, and how the producer is tuned.

    Parameters
    ----------
    sensors
        Sensors at the start of the run.
    rows
        Rows in each sensor's table at the start (inserts and deletes make it drift around this size).
    columns
        Measurement columns besides ``id``: ``name``, ``unit``, ``value``, ``status``, then ``x1``, ``x2``...
    topic_prefix
        Each sensor publishes to ``<topic_prefix><sensor-id>``.
    partitions
        Partitions of each sensor topic.
    replication_factor, min_insync_replicas
        Replicas of each partition of the topics the simulator creates, and their ``min.insync.replicas``;
        None leaves them to the cluster's defaults.
    rate
        Target total messages per second before ``load_factor``; 0 means as fast as the broker takes them.
    load_factor
        Multiplies ``rate`` (1x, 10x...); changeable while running.
    skew
        Zipf exponent of the per-sensor share of the rate; 0 spreads it evenly.
    duration_s
        Stop after this many seconds of schedule (None: no time limit).
    max_messages
        Stop after planning this many messages (None: no count limit).
    session_interval_s
        Mean session length; each session lasts this +-20 %, and restarts with a new snapshot.
    join_rate
        New sensors per second (Poisson); each gets a new topic.
    retire_rate
        Sensors retired per second (Poisson); a retiring sensor ends its session and goes quiet.
    seed
        Seed of every random decision: same seed and config, same messages and faults.
    faults
        Fault rates for every sensor.
    sensor_faults
        Per-sensor fault rates by sensor id, replacing ``faults`` for that sensor.
    insert_ratio, delete_ratio
        Row churn: about ``(insert_ratio + delete_ratio) / 2`` of updates insert a new row and as many delete
        one (the rest upsert existing rows); tables keep about ``rows`` rows, so the two are not honoured
        separately (``simulator.model.TableStore`` explains why).
    close_on_stop
        End every open session with an ``end`` message when the run stops.
    producer
        librdkafka settings over ``DEFAULT_PRODUCER`` (``-X`` Kafka settings still win).
    flush_timeout_s
        How long to wait for outstanding acknowledgements at exit.
    connect_timeout_s
        How long to wait for the broker to answer at start.
    stall_timeout_s
        Give up when the producer queue stays full this long (the broker stopped taking messages).
    producer_path
        How the simulator reaches librdkafka: ``direct`` (its C API from compiled code,
        ``simulator.rdkafka``: the fast path), ``client`` (confluent-kafka's ``Producer``, a few times the
        CPU per message) or ``auto`` (direct where it loads, else client with a warning saying why).
    first_sensor
        Number of the first sensor's id; sensors that join later count up from it. Simulators that write
        to one cluster at once (Locust's workers) start far apart, so that no two of them own a sensor.
    record_every_s
        Close the ledger's open file and write the sessions closed since the last time to
        ``truth/closed/`` at least this often, so that another process can verify the run while it goes on
        (the Locust UI's live verifier); None: ledger files of 2 million rows, the truth at the end only.
    """

    sensors: int = 24
    rows: int = 200
    columns: int = 4
    topic_prefix: str = "sotw-sensor-"
    partitions: int = 3
    replication_factor: int | None = None
    min_insync_replicas: int | None = None
    rate: float = 2000.0
    load_factor: float = 1.0
    skew: float = 0.0
    duration_s: float | None = 30.0
    max_messages: int | None = None
    session_interval_s: float = 60.0
    join_rate: float = 0.0
    retire_rate: float = 0.0
    seed: int = 0
    faults: FaultConfig = field(default_factory=FaultConfig)
    sensor_faults: Mapping[str, FaultConfig] = field(default_factory=dict)
    insert_ratio: float = 0.05
    delete_ratio: float = 0.05
    close_on_stop: bool = True
    producer: Mapping[str, str] = field(default_factory=dict)
    flush_timeout_s: float = 30.0
    connect_timeout_s: float = 10.0
    stall_timeout_s: float = 60.0
    producer_path: str = "auto"
    first_sensor: int = 0
    record_every_s: float | None = None

    def __post_init__(self) -> None:
        def integer(name: str, low: int) -> None:
            value = getattr(self, name)
            _check(
                isinstance(value, int) and not isinstance(value, bool) and value >= low,
                name,
                value,
                f"an integer >= {low}",
            )

        def number(name: str, low: float, strict: bool = False) -> None:
            value = getattr(self, name)
            ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            ok = ok and (value > low if strict else value >= low)
            _check(ok, name, value, f"a number {'>' if strict else '>='} {low:g}")

        integer("sensors", 1)
        integer("rows", 1)
        integer("columns", 1)
        integer("partitions", 1)
        integer("seed", 0)
        integer("first_sensor", 0)
        number("rate", 0)
        number("load_factor", 0, strict=True)
        number("skew", 0)
        number("session_interval_s", 0, strict=True)
        number("join_rate", 0)
        number("retire_rate", 0)
        number("flush_timeout_s", 0)
        number("connect_timeout_s", 0, strict=True)
        number("stall_timeout_s", 0, strict=True)
        _rate("insert_ratio", self.insert_ratio)
        _rate("delete_ratio", self.delete_ratio)
        _check(
            self.insert_ratio + self.delete_ratio <= 1, "insert_ratio+delete_ratio", self.insert_ratio, "<= 1"
        )
        _check(
            isinstance(self.topic_prefix, str) and bool(_TOPIC_PREFIX.match(self.topic_prefix)),
            "topic_prefix",
            self.topic_prefix,
            "letters, digits, '.', '_' or '-'",
        )
        if self.duration_s is not None:
            number("duration_s", 0, strict=True)
        if self.max_messages is not None:
            integer("max_messages", 1)
        if self.record_every_s is not None:
            number("record_every_s", 0, strict=True)
        for name in ("replication_factor", "min_insync_replicas"):
            if getattr(self, name) is not None:
                integer(name, 1)
        if self.duration_s is None and self.max_messages is None and self.rate == 0:
            raise SimulatorError("an unthrottled run (rate 0) needs duration_s or max_messages")
        if not isinstance(self.faults, FaultConfig):
            raise SimulatorError(f"faults must be a FaultConfig, got {self.faults!r}")
        for sensor, faults in self.sensor_faults.items():
            _check(bool(_SENSOR_ID.match(str(sensor))), "sensor_faults key", sensor, "a sensor id")
            if not isinstance(faults, FaultConfig):
                raise SimulatorError(f"sensor_faults[{sensor!r}] must be a FaultConfig, got {faults!r}")
        object.__setattr__(self, "sensor_faults", dict(self.sensor_faults))
        for key, value in self.producer.items():
            _check(isinstance(key, str) and isinstance(value, str), "producer", (key, value), "str=str pairs")
        object.__setattr__(self, "producer", dict(self.producer))
        _check(
            self.producer_path in PRODUCER_PATHS,
            "producer_path",
            self.producer_path,
            "one of " + ", ".join(PRODUCER_PATHS),
        )

    def replace(self, **changes: Any) -> SimulatorConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (for ``run.json``)."""
        out = dataclasses.asdict(self)
        out["sensor_faults"] = {k: dataclasses.asdict(v) for k, v in self.sensor_faults.items()}
        out["producer"] = dict(self.producer)
        return out

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "scenario") -> SimulatorConfig:
        """Build from a TOML document or dict: ``[faults]``, ``[sensor_faults.<id>]`` and ``[producer]`` tables."""
        values = known_settings(cls, data, where)
        if "faults" in values:
            values["faults"] = FaultConfig.from_mapping(_table(values["faults"], f"{where}.faults"))
        if "sensor_faults" in values:
            per = _table(values["sensor_faults"], f"{where}.sensor_faults")
            values["sensor_faults"] = {
                str(k): FaultConfig.from_mapping(
                    _table(v, f"{where}.sensor_faults.{k}"), f"sensor_faults.{k}"
                )
                for k, v in per.items()
            }
        if "producer" in values:
            values["producer"] = {
                str(k): setting_text(v) for k, v in _table(values["producer"], f"{where}.producer").items()
            }
        try:
            return cls(**values)
        except TypeError as exc:
            raise SimulatorError(f"bad {where}: {exc}") from None


def _table(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SimulatorError(f"{where} must be a table, got {value!r}")
    return value


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load_scenario(path: Path | str, profile: str | None = None) -> SimulatorConfig:
    """Read a TOML scenario file into a ``SimulatorConfig``.

    The format is the harness's (``loadtest.run.profile.load_profile``), so one file serves ``sotw simulate``
    and ``sotw run``: a ``[profiles.NAME]`` table's ``simulator`` table, chosen with ``profile``, overrides the
    base key by key (its ``pipeline`` and ``run`` tables are the harness's and are not read here). The base is
    the ``[simulator]`` table if there is one, else the top level: ``SimulatorConfig`` fields, with
    ``[faults]``, ``[sensor_faults."0003"]`` and ``[producer]`` tables.

    Raises
    ------
    SimulatorError
        If the file cannot be read or parsed, the profile does not exist, or a setting is unknown or invalid.
    """
    path = Path(path)
    doc = read_toml(path, "scenario", SimulatorError)
    profiles = {
        name: _table(_table(table, f"profiles.{name}").get("simulator", {}), f"profiles.{name}.simulator")
        for name, table in _table(doc.pop("profiles", {}), "profiles").items()
    }
    if "simulator" in doc:
        doc = dict(_table(doc["simulator"], "simulator"))
    if "profile" in doc:
        raise SimulatorError(
            f"scenario {path}: a profile is a [profiles.NAME.simulator] table (the format of sotw run's "
            "scenario files), not [profile.NAME]"
        )
    if profile is not None:
        if profile not in profiles:
            known = ", ".join(sorted(profiles)) or "none"
            raise SimulatorError(f"scenario {path} has no profile {profile!r} (profiles: {known})")
        doc = _merge(doc, profiles[profile])
    return SimulatorConfig.from_mapping(doc, where=str(path.name))

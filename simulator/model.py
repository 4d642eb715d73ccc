"""The sensor model: each sensor's table of rows whose measurements move as random walks.

A ``SensorTable`` is the state a real sensor holds: the truth a perfect pipeline must rebuild. Updates are
applied here one at a time (the only per-message work that cannot be vectorized, because each update sees
the table the previous one left); their random inputs come in numpy blocks from the caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from faker import Faker

from sotw import wire

# (measurement, unit, typical level, spread of the level across rows, random-walk step)
MEASUREMENTS: tuple[tuple[str, str, float, float, float], ...] = (
    ("temperature", "C", 21.0, 6.0, 0.05),
    ("pressure", "kPa", 101.3, 3.0, 0.02),
    ("humidity", "%", 45.0, 12.0, 0.1),
    ("vibration", "mm/s", 2.5, 1.0, 0.03),
    ("flow", "l/min", 120.0, 30.0, 0.5),
    ("voltage", "V", 230.0, 4.0, 0.2),
)
STATUSES = ("ok", "ok", "ok", "warn", "alarm", "offline")
BASE_COLUMNS = ("value", "status", "name", "unit")
STATUS_CHANGE = 0.02
STEPS = tuple(m[4] for m in MEASUREMENTS)
_NM = len(MEASUREMENTS)
_STATUS_FROM = 1.0 - STATUS_CHANGE


def milli(x: float) -> float:
    """Round to 3 decimals the fast way: the nearest double to k/1000 prints as at most 3 decimals.

    ``round(x, 3)`` goes through correctly-rounded decimal conversion and costs about a microsecond; float
    floor division (``// 1.0``) is ``math.floor`` without the call and the int it returns, and gives the same
    double.
    """
    return (x * 1000.0 + 0.5) // 1.0 / 1000.0


def column_names(columns: int) -> list[str]:
    """The measurement columns of a table with ``columns`` columns besides ``id``."""
    names = list(BASE_COLUMNS[: min(columns, len(BASE_COLUMNS))])
    names += [f"x{k}" for k in range(1, columns - len(BASE_COLUMNS) + 1)]
    return names


@dataclass(frozen=True)
class SensorInfo:
    """A sensor's identity and the metadata Faker gives it (recorded in ``truth/sensors.parquet``)."""

    sensor: str
    topic: str
    site: str
    model: str
    serial: str


def sensor_info(sensor: str, topic: str, fake: Faker) -> SensorInfo:
    """Invent site, model and serial for a sensor from a seeded Faker."""
    return SensorInfo(
        sensor=sensor,
        topic=topic,
        site=f"{fake.city()} {fake.random_element(('plant', 'depot', 'yard', 'station'))}",
        model=fake.bothify("SX-###?").upper(),
        serial=fake.bothify("########"),
    )


def skew_weights(n: int, skew: float) -> np.ndarray:
    """Share of the total rate for each of ``n`` sensors: Zipf weights ``(k+1)**-skew``, normalised."""
    w = np.arange(1, n + 1, dtype=np.float64) ** -float(skew)
    w /= w.sum()
    return w


class SensorTable:
    """One sensor's rows, keyed by ``id``, with the operations an update can perform.

    Parameters
    ----------
    rows
        Rows at the start; inserts and deletes keep the size drifting around it.
    columns
        Measurement columns besides ``id`` (see ``column_names``).
    rng
        Source of the initial values.
    insert_ratio, delete_ratio
        Share of updates that insert or delete a row.
    """

    def __init__(
        self, rows: int, columns: int, rng: np.random.Generator, insert_ratio: float, delete_ratio: float
    ) -> None:
        self.target = rows
        self.names = column_names(columns)
        self.numeric = [c for c in self.names if c == "value" or c.startswith("x")]
        self.has_status = "status" in self.names
        self.insert_ratio = insert_ratio
        self.delete_ratio = delete_ratio
        self.rows: dict[int, dict[str, Any]] = {}
        self.ids: list[int] = []
        self.pos: dict[int, int] = {}
        # Parallel to ``ids``: each row's dict and random-walk step, so an upsert is two list lookups.
        self._at: list[dict[str, Any]] = []
        self._step: list[float] = []
        self.next_id = 0
        self._value_only = self.numeric == ["value"]
        self._ins = self._churn = 0.0
        z = rng.standard_normal((rows, 1 + len(self.numeric))).tolist()
        for k in range(rows):
            self._insert(z[k][0], z[k][1:] or [0.0])
        self._set_churn()

    def __len__(self) -> int:
        return len(self.ids)

    def _insert(self, z_level: float, z_cols: list[float]) -> dict[str, Any]:
        rid = self.next_id
        self.next_id += 1
        name, unit, level, spread, _ = MEASUREMENTS[rid % len(MEASUREMENTS)]
        row: dict[str, Any] = {"id": rid}
        for k, col in enumerate(self.names):
            if col == "value":
                row["value"] = milli(level + spread * z_level)
            elif col == "status":
                row["status"] = "ok"
            elif col == "name":
                row["name"] = f"{name}-{rid}"
            elif col == "unit":
                row["unit"] = unit
            else:
                row[col] = milli(10.0 * z_cols[k % len(z_cols)])
        self.rows[rid] = row
        self.pos[rid] = len(self.ids)
        self.ids.append(rid)
        self._at.append(row)
        self._step.append(STEPS[rid % _NM])
        return row

    def update(self, u_op: float, u_row: float, z: float) -> tuple[str, dict[str, Any]]:
        """Apply one random update and return ``(op, row)`` for the wire.

        ``u_op`` and ``u_row`` are uniforms in [0, 1) and ``z`` a standard normal, drawn by the caller in
        blocks. The returned row of an upsert is the table's own dict: encode it before the next update.
        This is the simulator's hottest function, so the common case (an upsert of ``value``) comes first.
        """
        if u_op < self._churn:
            return self._insert_or_delete(u_op, u_row, z)
        at = self._at
        k = int(u_row * len(at))
        row = at[k]
        if self._value_only:
            row["value"] = ((row["value"] + self._step[k] * z) * 1000.0 + 0.5) // 1.0 / 1000.0  # milli()
        elif self.numeric:
            # One numeric column moves per upsert; which one comes from the uniform's low digits.
            col = self.numeric[int(u_row * 7919 * len(at)) % len(self.numeric)]
            step = self._step[k] if col == "value" else 0.1
            row[col] = milli(row[col] + step * z)
        if u_op >= _STATUS_FROM and self.has_status:
            row["status"] = STATUSES[int(u_row * 997) % len(STATUSES)]
        return "upsert", row

    def _set_churn(self) -> None:
        # Mean reversion keeps the table near its target size over long runs.
        n = len(self.ids)
        self._ins = self.insert_ratio if n <= self.target else self.insert_ratio * 0.5
        dele = self.delete_ratio if n >= self.target else self.delete_ratio * 0.5
        self._churn = self._ins + dele

    def _insert_or_delete(self, u_op: float, u_row: float, z: float) -> tuple[str, dict[str, Any]]:
        ids = self.ids
        n = len(ids)
        if u_op < self._ins or n <= 1:
            row = self._insert(z, [z])
            self._set_churn()
            return "upsert", row
        k = int(u_row * n)
        rid = ids[k]
        last = ids.pop()
        last_row, last_step = self._at.pop(), self._step.pop()
        if last != rid:
            ids[k] = last
            self._at[k] = last_row
            self._step[k] = last_step
            self.pos[last] = k
        del self.pos[rid]
        del self.rows[rid]
        self._set_churn()
        return "delete", {"id": rid}

    def snapshot_rows(self) -> list[dict[str, Any]]:
        """The rows in id order (a copy, safe to keep)."""
        return [dict(self.rows[i]) for i in sorted(self.ids)]

    def digest(self) -> str:
        """The table digest as ``sotw.wire.table_digest`` defines it."""
        return wire.table_digest(self.rows.values())

    def canonical(self) -> list[tuple[int, str]]:
        """``(id, canonical_row)`` for every row, sorted by id: the truth table's content."""
        return [(i, wire.canonical_row(self.rows[i])) for i in sorted(self.ids)]

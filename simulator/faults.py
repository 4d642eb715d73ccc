"""Fault injection: which message gets which fault, and what a malformed value looks like.

Decisions are drawn in numpy blocks from the run's generator, one uniform per message whatever the rates, so
the same seed gives the same decisions and changing one rate does not shift the others. The four message
faults take disjoint slices of [0, 1): gap, malformed, delayed, duplicate, then none.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from simulator.config import FaultConfig

NONE, GAP, DUPLICATE, DELAYED, MALFORMED, ABANDONED = range(6)
#: Ledger ``fault`` values, indexed by the codes above.
FAULT_NAMES = ("none", "gap", "duplicate", "delayed", "malformed", "abandoned")
# Band order inside [0, 1) -> fault code; index = number of band edges the uniform passed.
_BAND_CODES = np.array([GAP, MALFORMED, DELAYED, DUPLICATE, NONE], dtype=np.int8)
MALFORMED_VARIANTS = ("truncated", "wrong_type", "missing_field")


class FaultTable:
    """Fault rates by sensor: a default and per-sensor overrides, as arrays for a block of decisions.

    An override replaces the default for its sensor entirely (every rate, not only those it names), and it
    stays until it is cleared: changing the default changes every sensor without an override and none of
    those with one, so a harness that opens and closes a global fault window leaves the per-sensor rates of
    its profile alone.

    Parameters
    ----------
    default
        Rates for sensors without an override.
    overrides
        Rates by sensor id.
    """

    def __init__(self, default: FaultConfig, overrides: Mapping[str, FaultConfig]) -> None:
        self.default = default
        self.overrides = dict(overrides)

    def set(self, faults: FaultConfig, sensor: str | None = None) -> None:
        """Set the rates of one sensor (an override), or the default (overrides are kept)."""
        if sensor is None:
            self.default = faults
        else:
            self.overrides[sensor] = faults

    def clear(self, sensor: str | None = None) -> None:
        """Drop the override of one sensor, or of every sensor: they follow the default again."""
        if sensor is None:
            self.overrides.clear()
        else:
            self.overrides.pop(sensor, None)

    def for_sensor(self, sensor: str) -> FaultConfig:
        """The rates that apply to ``sensor``."""
        return self.overrides.get(sensor, self.default)

    def edges(self, sensors: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Band edges ``(n, 4)``, abandon rates, delay means and delay caps (ms) for the given sensors."""
        cfgs = [self.for_sensor(s) for s in sensors]
        bands = np.array([[f.gap, f.malformed, f.delayed, f.duplicate] for f in cfgs], dtype=np.float64)
        edges = np.cumsum(bands, axis=1).reshape(len(cfgs), 4)
        abandon = np.array([f.abandon for f in cfgs], dtype=np.float64)
        delay = np.array([f.delay_ms for f in cfgs], dtype=np.float64)
        cap = np.array([f.delay_max_ms for f in cfgs], dtype=np.float64)
        return edges, abandon, delay, cap


def decide(u: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Fault code per message from its uniform ``u`` and its sensor's band ``edges`` (one row each)."""
    passed = (u[:, None] >= edges).sum(axis=1)
    codes: np.ndarray = _BAND_CODES[passed]
    return codes


def malform(value: bytes, kind: str, seq: int, variant: int) -> bytes:
    """Break a valid value in one of three ways the wire format rejects.

    ``truncated`` cuts the JSON in half (not JSON), ``wrong_type`` turns ``seq`` into a string, and
    ``missing_field`` drops ``kind``. The key is left alone, so the broken message still lands in its session.
    """
    if variant == 1:
        return value.replace(b'"seq":%d,' % seq, b'"seq":"%d",' % seq, 1)
    if variant == 2:
        return value.replace(b'"kind":"%s",' % kind.encode(), b"", 1)
    return value[: max(1, len(value) // 2)]

"""What the verifier's checks found, as they find it: one ``Tally`` the checks add to, and small helpers they share."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loadtest.reports.results import DamageWindow, Discrepancy, FaultScore

if TYPE_CHECKING:
    from loadtest.correctness.expect import SessionExpectation


# Violation kinds the pipeline reports, and the injected fault each one detects.
FAULT_OF_VIOLATION = {
    "gap": "gap",
    "duplicate": "duplicate",
    "reorder": "delayed",
    "timeout": "abandoned",
    "missing_snapshot": "gap",
    "digest_mismatch": "-",
    "late_after_close": "delayed",
}


@dataclass
class Tally:
    """What the checks found, accumulated before it becomes a ``Correctness``."""

    discrepancies: list[Discrepancy] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    damage: list[DamageWindow] = field(default_factory=list)
    faults: list[FaultScore] = field(default_factory=list)
    required: Counter[str] = field(default_factory=Counter)
    detected: Counter[str] = field(default_factory=Counter)
    hits: Counter[str] = field(default_factory=Counter)
    allowed_hits: Counter[str] = field(default_factory=Counter)

    def merge(self, other: Tally) -> None:
        """Add another tally's findings (one session's, under the reading chosen for it)."""
        self.discrepancies += other.discrepancies
        self.damage += other.damage
        self.faults += other.faults
        for mine, theirs in (
            (self.counts, other.counts),
            (self.statuses, other.statuses),
            (self.required, other.required),
            (self.detected, other.detected),
            (self.hits, other.hits),
            (self.allowed_hits, other.allowed_hits),
        ):
            mine.update(theirs)

    def add(self, kind: str, exp: SessionExpectation | None, detail: str, **where: Any) -> None:
        """Record one discrepancy; ``exp`` fills in session, sensor and topic unless ``where`` names them."""
        if exp is not None:
            where = {"session": exp.session, "sensor": exp.sensor, "topic": exp.topic, **where}
        where.setdefault("session", "")
        self.discrepancies.append(Discrepancy(kind=kind, detail=detail, **where))


def opt_int(value: Any) -> int | None:
    """``value`` as an int, None for a null (None or NaN, as pandas gives a missing number)."""
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else int(value)


def ratio(num: int, den: int) -> float:
    """``num / den``, or NaN when there is nothing to divide by."""
    return num / den if den else math.nan

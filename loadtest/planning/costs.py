"""What a capacity plan is made of: the pipeline's measured cost per batch and per message, fitted from drains at two batch sizes, and the machine it was measured on."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.errors import HarnessError
from loadtest.reports.plain import from_plain, to_plain

MEASUREMENTS_SCHEMA = 1
SMALL_BATCH, LARGE_BATCH = 3_000, 30_000


@dataclass(frozen=True)
class BatchCost:
    """The cost of a micro-batch on one set-up: ``seconds = fixed_s + per_message_s x messages``.

    ``points`` are the batches it was fitted to, ``[messages, seconds]`` each (the first batch of each drain,
    which also pays for the query's start, left out).
    """

    setup: str
    master: str
    cores: int
    fixed_s: float
    fixed_se: float
    per_message_s: float
    per_message_se: float
    points: list[list[float]] = field(default_factory=list)

    @property
    def rate(self) -> float:
        """Messages per second with batches so large the fixed cost vanishes: ``1 / c``."""
        return 1.0 / self.per_message_s if self.per_message_s > 0 else math.inf


@dataclass(frozen=True)
class Measurements:
    """Everything the plan is computed from, with where and how it was measured."""

    taken_utc: str
    machine: dict[str, Any]
    command: str
    backlog: dict[str, float]
    costs: list[BatchCost]
    partition_rate: float
    broker_produce_us: float
    broker_consume_us: float
    state_bytes_per_session: float
    provisional: bool = True
    schema_version: int = MEASUREMENTS_SCHEMA

    def cost(self, master_kind: str, cores: int) -> BatchCost | None:
        """The measured cost on ``master_kind`` (``local`` or ``standalone``) with ``cores`` cores."""
        return next((c for c in self.costs if c.setup == f"{master_kind}-{cores}"), None)

    def to_json(self, path: Path) -> None:
        """Write as JSON (NaN as null)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(to_plain(dataclasses.asdict(self)), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def from_json(cls, path: Path) -> Measurements:
        """Read ``sotw plan measure``'s output.

        Raises
        ------
        HarnessError
            If it is missing, of another version, or invalid.
        """
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError:
            raise HarnessError(f"no measurements at {path}: run `sotw plan measure` first") from None
        except json.JSONDecodeError as exc:
            raise HarnessError(f"{path} is not JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("schema_version") != MEASUREMENTS_SCHEMA:
            raise HarnessError(
                f"{path} is not plan measurements of version {MEASUREMENTS_SCHEMA}: measure again"
            )
        try:
            return from_plain(cls, data, path.name)
        except (TypeError, ValueError) as exc:
            raise HarnessError(f"{path} is invalid: {exc}") from None


def fit(points: Sequence[tuple[float, float]]) -> tuple[float, float, float, float]:
    """Least squares ``seconds = F + c x messages``: (F, standard error of F, c, standard error of c)."""
    x = np.array([p[0] for p in points], dtype=float)
    y = np.array([p[1] for p in points], dtype=float)
    if len(x) < 3 or np.ptp(x) == 0:
        raise HarnessError(f"a batch cost needs batches of at least two sizes, got {len(x)} batch(es)")
    a = np.vstack([np.ones_like(x), x]).T
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    residual = y - a @ coef
    dof = max(1, len(x) - 2)
    sigma2 = float(residual @ residual) / dof
    cov = sigma2 * np.linalg.inv(a.T @ a)
    return float(coef[0]), float(math.sqrt(cov[0, 0])), float(coef[1]), float(math.sqrt(cov[1, 1]))

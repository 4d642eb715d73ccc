"""How each copy the simulator sent fared at the broker: acknowledged, refused, or unknown.

The one place the verifier decides it, from the ledger's ``delivered``, ``sent_ts`` and ``error`` columns:

- **acknowledged**: the broker took the copy (``delivered``), with an offset or without one (librdkafka
  reports an idempotent retry the broker had already written, and a message acknowledged implicitly, with no
  offset: it is on the broker all the same, at a position its neighbours bound, ``kafka_positions``);
- **refused**: the copy certainly is not on the broker: it never left the client (purged while queued, a full
  queue, an unknown topic) or the broker answered no (a message too large, no authorization, not enough
  in-sync replicas before the append);
- **unknown**: sent and neither acknowledged nor refused: the flush gave up on it, its send timed out, it was
  purged in flight (at the end of a run or when a producer was replaced), or an error that does not say
  whether the broker wrote it. The broker may hold it or not; a job may have read it or not, and either is
  right (``loadtest.correctness.expect`` and ``loadtest.correctness.values`` judge the session both ways).

Copies never sent (an injected gap, an abandoned session's rest) are none of these.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd

#: Delivery errors that say the broker certainly does not hold the copy (librdkafka's texts, by prefix).
REFUSALS = (
    "Local: Purged in queue",
    "Local: Queue full",
    "Local: Unknown topic",
    "Local: Unknown partition",
    "Local: Invalid argument",
    "Local: Message size too large",
    "Broker: Unknown topic or partition",
    "Broker: Message size too large",
    "Broker: Invalid message",
    "Broker: Message batch larger than",
    "Broker: Not enough in-sync replicas",
    "Broker: Topic authorization failed",
    "Broker: Broker failed to validate record",
    "Broker: Policy violation",
)

ACKNOWLEDGED, REFUSED, UNKNOWN, NOT_SENT = "acknowledged", "refused", "unknown", "not sent"


def acknowledged(ledger: pd.DataFrame) -> pd.Series:
    """Whether the broker acknowledged each copy, with an offset or without one."""
    return ledger["delivered"].fillna(False).astype(bool)


def refused(ledger: pd.DataFrame) -> pd.Series:
    """Whether each copy was sent and certainly not taken by the broker (``REFUSALS``)."""
    if "error" not in ledger.columns:
        return pd.Series(False, index=ledger.index)
    error = ledger["error"].astype("string").fillna("")
    return ledger["sent_ts"].notna() & ~acknowledged(ledger) & error.str.startswith(REFUSALS)


def unknown(ledger: pd.DataFrame) -> pd.Series:
    """Whether each copy was sent and neither acknowledged nor refused: the broker may hold it or not."""
    return ledger["sent_ts"].notna() & ~acknowledged(ledger) & ~refused(ledger)


def outcomes(ledger: pd.DataFrame) -> pd.Series:
    """Each copy's outcome: ``acknowledged``, ``refused``, ``unknown`` or ``not sent``."""
    out = np.select(
        [acknowledged(ledger), refused(ledger), unknown(ledger)],
        [ACKNOWLEDGED, REFUSED, UNKNOWN],
        default=NOT_SENT,
    )
    return pd.Series(out, index=ledger.index, dtype=object)


def kafka_positions(copies: pd.DataFrame) -> pd.Series:
    """Where each copy sits in its partition, as a float that sorts like Kafka's order.

    A copy with an offset sits at it. One without (acknowledged without an offset, or of unknown outcome)
    sits right after the copy of its partition produced before it (by ``sent_ts``, then ledger order) that
    has an offset, or right before the first such copy: an idempotent producer writes a partition's
    messages in the order it produced them, so that is where the broker put it, if it has it.
    """
    if copies.empty:
        return pd.Series(dtype="float64")
    order = copies.assign(_row=np.arange(len(copies))).sort_values(
        ["topic", "partition", "sent_ts", "_row"], kind="stable", na_position="last"
    )
    keys = [order["topic"], order["partition"]]
    known = order["offset"].astype("float64")
    before = known.groupby(keys).ffill()
    after = known.groupby(keys).bfill()
    # Several copies between two known offsets keep their production order: a fraction of a step each.
    rank = order.groupby([*keys, before.fillna(-1.0)]).cumcount().astype("float64")
    step = 1.0 / (order.groupby(keys)["offset"].transform("size").astype("float64") + 1.0)
    position = known.where(known.notna(), before + rank * step)
    position = position.where(position.notna(), after - 1.0 + rank * step)
    position = position.where(position.notna(), rank)
    return position.reindex(copies.index)


#: Readings of a session with copies of unknown outcome: every subset of up to this many copies is one.
UNKNOWN_SUBSETS = 3


#: With more, the readings are prefixes of them in production order (a producer that lost its connection
#: had its earlier sends written and its later ones not), at most this many.
UNKNOWN_PREFIXES = 16


def unknown_variants(rows: pd.DataFrame) -> list[tuple[Any, ...]]:
    """The sets of a session's copies of unknown outcome that one reading takes as on the broker.

    Each such copy may be on the broker or not. Up to ``UNKNOWN_SUBSETS`` of them, every subset is a
    reading; beyond that, the prefixes of them in production order (the first k written, the rest not), at
    most ``UNKNOWN_PREFIXES`` of them, none and all included.
    """
    maybe = rows[rows["maybe"]] if "maybe" in rows else rows[unknown(rows)]
    if maybe.empty:
        return [()]
    labels = list(maybe.assign(_row=range(len(maybe))).sort_values(["sent_ts", "_row"], kind="stable").index)
    if len(labels) <= UNKNOWN_SUBSETS:
        return [tuple(c) for n in range(len(labels) + 1) for c in combinations(labels, n)]
    cuts = sorted({round(i * len(labels) / (UNKNOWN_PREFIXES - 1)) for i in range(UNKNOWN_PREFIXES)})
    return [tuple(labels[:k]) for k in cuts]

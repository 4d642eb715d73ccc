"""End-to-end latency: from each message's intended time to the commit of the batch that first wrote it, with exact percentiles."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from loadtest.correctness.contracts import LATENCY_COLUMNS, latencies, tables_end_to_end
from loadtest.correctness.output import PipelineOutput, read_changes
from loadtest.correctness.outputspec import OutputSpec
from loadtest.correctness.tables import read_tables
from loadtest.reports.results import LatencySummary

PERCENTILES = (50.0, 90.0, 99.0, 99.9)


#: The ledger's columns the full contract's latencies need (``read_ledger(..., columns=...)``).
LEDGER_COLUMNS = ("session", "seq", "fault", "intended_ts", "sent_ts", "acked_ts")


def end_to_end_of(ledger: pd.DataFrame, output: Path | OutputSpec) -> pd.DataFrame:
    """``end_to_end`` for an output of either contract and format (see ``loadtest.correctness.contracts``).

    Under the full contract only the changes' ``session``, ``seq`` and ``batch_id`` are read: a long run's
    changes, values and all, would not fit in memory beside its ledger.
    """
    spec = output if isinstance(output, OutputSpec) else OutputSpec(output)
    if spec.contract == "tables":
        return tables_end_to_end(ledger, read_tables(spec))
    changes, commits = read_changes(spec.path, ["session", "seq"], spec.format)
    empty = pd.DataFrame()
    return end_to_end(ledger, PipelineOutput(changes, empty, empty, empty, commits))


def end_to_end(ledger: pd.DataFrame, output: PipelineOutput) -> pd.DataFrame:
    """Per applied message: ``intended_ts``, ``committed_ms`` of the batch that first wrote it, ``latency_ms``."""
    if output.changes.empty or not output.commits:
        return pd.DataFrame(columns=LATENCY_COLUMNS)
    commits = pd.DataFrame({"batch_id": list(output.commits), "committed_ms": list(output.commits.values())})
    return latencies(ledger, output.changes[["session", "seq", "batch_id"]].merge(commits, on="batch_id"))


def latency_summary(name: str, latencies_ms: Any, scope: str = "steady") -> LatencySummary:
    """Exact percentiles of an array of latencies in ms (NaNs ignored; NaN figures when it is empty).

    The whole array is in memory, so the percentiles are exact: each is a value that occurred (the smallest
    value with at least that share of the values at or below it), not an interpolation between two.
    """
    values = np.asarray(latencies_ms, dtype=np.float64).ravel()
    values = values[~np.isnan(values)]
    if values.size == 0:
        nan = math.nan
        return LatencySummary(name, 0, nan, nan, nan, nan, nan, nan, nan, scope)
    p50, p90, p99, p99_9 = (float(v) for v in np.percentile(values, PERCENTILES, method="inverted_cdf"))
    return LatencySummary(
        name,
        int(values.size),
        p50,
        p90,
        p99,
        p99_9,
        float(values.max()),
        float(values.min()),
        float(values.mean()),
        scope,
    )

"""Where a job writes and how the verifier reads it.

The contract (sotw's full output, or a team's tables), the format (files, or a Kafka topic holding the table:
``loadtest.correctness.topicoutput``), and the columns each contract names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from loadtest.correctness.delta import FILE_COLUMN, is_delta_table
from loadtest.errors import HarnessError
from sotw.kafka import KafkaConfig

CONTRACTS = ("full", "tables")
FORMATS = ("auto", "parquet", "delta", "topic")
FULL_DATASETS = ("changes", "sessions", "integrity", "dead_letters")

KEYS = ("session", "sensor")
ROW_ID = ("row_id", "id")
SEQ = "seq"
DELETED = "deleted"
COMMITTED = "committed_ms"
# Columns of the tables contract that are not the row's own columns.
META = frozenset({*KEYS, *ROW_ID, SEQ, DELETED, COMMITTED, "values", "batch_id", "processed_ms", FILE_COLUMN})
# How a commit time was found, for the report (docs/own-pipeline.md, "Latency").
COMMIT_SOURCES = {
    "markers": "sotw's _commits markers",
    "delta": "Delta commit timestamps",
    "column": "the committed_ms column",
    "first_seen": "when the harness first saw the row's file",
    "record": "the output records' timestamps",
    "none": "not measured: the output has no seq column",
}


@dataclass(frozen=True)
class OutputSpec:
    """Where a job writes and which contract and format the verifier reads it with.

    Parameters
    ----------
    path
        The output root (full contract) or the table (tables contract).
    contract
        ``full`` or ``tables``.
    format
        ``parquet``, ``delta``, ``auto`` (a ``_delta_log`` makes it Delta), or ``topic`` (tables contract: the
        table is the Kafka topic ``topic`` on the cluster ``kafka``).
    seen
        A JSON file of ``{data file: epoch ms}`` the harness's output probe writes while the run goes: when
        it first saw each file, the commit time of last resort.
    ignored
        Columns of a tables-contract output that are not the rows' (``--ignore-column``), besides the ones
        the contract knows and those starting with ``_``.
    topic_prefix
        Full contract: only the rows of topics starting with it are the run's (a pipeline a Locust session
        keeps running writes every run of the session into one output).
    topic, kafka
        ``format = "topic"``: the output topic, and the run's cluster with its settings (security included).
    """

    path: Path
    contract: str = "full"
    format: str = "auto"
    seen: Path | None = None
    ignored: tuple[str, ...] = ()
    topic_prefix: str | None = None
    topic: str | None = None
    kafka: KafkaConfig | None = None

    def __post_init__(self) -> None:
        if self.contract not in CONTRACTS:
            raise HarnessError(
                f"output contract must be one of {', '.join(CONTRACTS)}, got {self.contract!r}"
            )
        if self.format not in FORMATS:
            raise HarnessError(f"output format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if self.format == "topic" and self.contract != "tables":
            # Four datasets with batch markers do not fit one keyed topic; one table does.
            raise HarnessError("--format topic is read under the tables contract: pass --contract tables")

    def resolved_format(self) -> str:
        """``parquet``, ``delta`` or ``topic``: as given, or detected from what is on disk."""
        if self.format != "auto":
            return self.format
        table = self.path / "changes" if self.contract == "full" else self.path
        return "delta" if is_delta_table(table) else "parquet"

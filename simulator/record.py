"""The run record: ``<run_dir>/run.json``, what a run was asked to do, with what, and what it did.

It is written when the schedule starts (so a run cut short by a crash still says what it was) and again
when the run ends, with its summary. Each write replaces the file at once (write, then rename), so a reader
never sees half of one.
"""

from __future__ import annotations

import json
import platform
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from simulator.config import SimulatorConfig
from sotw.kafka import KafkaConfig


def versions() -> dict[str, str]:
    """The versions of what the run's results depend on."""
    import confluent_kafka
    import pyarrow

    import sotw

    return {
        "sotw": sotw.__version__,
        "python": platform.python_version(),
        "confluent_kafka": confluent_kafka.version()[0],
        "librdkafka": confluent_kafka.libversion()[0],
        "numpy": np.__version__,
        "pyarrow": pyarrow.__version__,
    }


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, tz=UTC).isoformat(timespec="milliseconds")


class RunRecord:
    """Writes a run's ``run.json``.

    Parameters
    ----------
    run_dir
        The run directory; its name is the run id.
    config
        The run's configuration.
    kafka
        Where the brokers are (the names of its settings are recorded, not their values: they may be
        secrets).
    """

    def __init__(self, run_dir: Path, config: SimulatorConfig, kafka: KafkaConfig) -> None:
        self.path = run_dir / "run.json"
        self.run_id = run_dir.resolve().name
        self.config = config
        self.kafka = kafka

    def write(
        self,
        *,
        session_token: str,
        producer_path: str,
        started_s: float,
        ended_s: float | None = None,
        summary: dict[str, Any] | None = None,
    ) -> None:
        """Write ``run.json``: ``ended_s`` and ``summary`` (JSON-able) once the run is over."""
        doc: dict[str, Any] = {
            "run_id": self.run_id,
            "seed": self.config.seed,
            "session_token": session_token,
            "config": self.config.to_dict(),
            "kafka": {"bootstrap": self.kafka.bootstrap, "settings": sorted(self.kafka.settings)},
            "producer_path": producer_path,
            "versions": versions(),
            "started_ms": int(started_s * 1000),
            "started": _iso(started_s),
            "ended_ms": None if ended_s is None else int(ended_s * 1000),
            "ended": None if ended_s is None else _iso(ended_s),
        }
        if summary is not None:
            doc["summary"] = summary
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
        tmp.replace(self.path)

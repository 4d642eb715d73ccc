"""The results.json schema: round trip, validation and versioning."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from loadtest.errors import HarnessError
from loadtest.reports.results import SCHEMA_VERSION, Figure, Results, Series, Triage, Verdict
from tests.loadtest.sample_results import sample_results


def test_results_round_trip_through_json_unchanged(tmp_path: Path) -> None:
    original = sample_results(10.0, passed=False)
    path = tmp_path / "results.json"
    original.to_json(path)
    again = Results.from_json(path)
    assert again.to_dict() == original.to_dict()
    assert again.correctness is not None and again.correctness.discrepancies[0].triage == Triage(
        "pipeline", True, True, True, "in Kafka at sotw-sensor-0007[0]@812"
    )
    assert json.loads(path.read_text())["schema_version"] == SCHEMA_VERSION


def test_nan_is_written_as_null_and_read_back_as_nan() -> None:
    data = sample_results().to_dict()
    data["capacity"]["headroom"] = None
    assert math.isnan(Results.from_dict(data).capacity.headroom)  # type: ignore[union-attr]


def test_a_different_schema_version_is_rejected_with_both_versions_named() -> None:
    data = sample_results().to_dict()
    data["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(HarnessError, match=f"schema_version {SCHEMA_VERSION + 1}.*version {SCHEMA_VERSION}"):
        Results.from_dict(data)


def test_a_version_1_file_is_refused_naming_the_sotw_that_wrote_it_and_the_way_out() -> None:
    data = sample_results().to_dict()
    data["schema_version"] = 1
    data["run"]["versions"] = {"sotw": "0.0.9"}
    data["summary"] = {"lag_age_max_s": 3.7}  # version 1's flat map
    with pytest.raises(
        HarnessError, match=r"schema_version 1 \(written by sotw 0.0.9\).*read it with the sotw"
    ):
        Results.from_dict(data)


def test_a_figure_is_stated_once_per_phase_and_read_by_name_and_phase() -> None:
    result = sample_results(10.0)
    assert result.figure("end_to_end_p99") == 4100.0
    assert result.figure("drain_time", "drain") == 9.5
    assert math.isnan(result.figure("drain_time"))  # not a steady-phase figure
    twice = [*result.summary, Figure("end_to_end_p99", "steady", 1.0, "ms")]
    with pytest.raises(ValueError, match="'end_to_end_p99' \\(steady\\) twice"):
        replace(result, summary=twice)
    with pytest.raises(ValueError, match="scope must be one of"):
        Figure("lag_age_max", "warm-up", 1.0, "s")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["run"].pop("run_id"), "results.run.run_id is missing"),
        (lambda d: d["run"].update(load_factor="ten"), "results.run.load_factor must be a number"),
        (lambda d: d["verdict"].update(verdict="MAYBE"), "verdict must be one of"),
        (lambda d: d.update(surprise=1), "unknown fields"),
        (lambda d: d["throughput"][0].update(t=[1.0]), "t has 1 points"),
    ],
)
def test_invalid_results_are_rejected_naming_the_field(change, message: str) -> None:  # type: ignore[no-untyped-def]
    data = sample_results().to_dict()
    change(data)
    with pytest.raises(HarnessError, match=message):
        Results.from_dict(data)


def test_dataclasses_validate_on_construction() -> None:
    with pytest.raises(ValueError, match="verdict"):
        Verdict("OK")
    with pytest.raises(ValueError, match="layer"):
        Triage("network")
    with pytest.raises(ValueError, match="points"):
        Series("x", "ms", [1.0, 2.0], [1.0])

"""The verifier's policy models: one per policy the pipeline offers, each its own class."""

from __future__ import annotations

import pytest

from loadtest.correctness.policies import MODELS, NoIntegrity, Once, Policy, Window
from pipeline.policies import POLICIES


def test_the_verifier_models_every_policy_the_pipeline_offers_and_no_other() -> None:
    assert sorted(MODELS) == sorted(POLICIES)
    assert all(Policy(name, window_messages=3).model.name == name for name in POLICIES)


def test_a_window_without_a_bound_is_refused_and_once_alone_may_skip_snapshot_rows() -> None:
    with pytest.raises(ValueError, match="needs window_messages or window_ms"):
        Policy("window")
    assert isinstance(Policy("window", window_ms=500).model, Window)
    assert [name for name in POLICIES if not Policy(name, window_messages=3).applies_whole_snapshots] == [
        "once"
    ]


def test_once_fails_a_session_missing_a_seq_and_none_requires_no_report() -> None:
    # seq 0 is the snapshot, 1 is lost, 2 is the end
    arrivals = [(0, "snapshot", 0), (2, "end", 20)]
    once = Once(Policy("once"))
    assert [once.statuses_at_end(out, exact=False) for out in once.readings(arrivals, 2)] == [{"failed"}] * 2
    none = NoIntegrity(Policy("none"))
    [out] = none.readings(arrivals, 2)
    assert ("gap", 1) in out.optional_events and not out.events and not none.requires_reports

import json

import pytest

from pipeline.errors import PipelineError
from pipeline.sinks import OWNER_FILE, check_consistency, committed_batches


def _checkpoint(tmp_path, query_id, commits):
    ckpt = tmp_path / "checkpoint"
    (ckpt / "commits").mkdir(parents=True)
    (ckpt / "metadata").write_text(json.dumps({"id": query_id}))
    for n in commits:
        (ckpt / "commits" / str(n)).write_text("v1\n{}")
    return ckpt


def _output(tmp_path, query_id, commits):
    out = tmp_path / "output"
    (out / "_commits").mkdir(parents=True)
    (out / OWNER_FILE).write_text(json.dumps({"query_id": query_id}))
    for n in commits:
        (out / "_commits" / f"{n}.json").write_text("{}")
    return out


def test_a_fresh_start_and_a_matching_restart_are_accepted(tmp_path):
    check_consistency(tmp_path / "output", tmp_path / "checkpoint")
    ckpt = _checkpoint(tmp_path, "q1", [0, 1, 2])
    out = _output(
        tmp_path, "q1", [0, 1, 2, 3]
    )  # died after the output commit, before Spark's: replayed, skipped
    check_consistency(out, ckpt)
    assert committed_batches(out) == [0, 1, 2, 3]


def test_output_from_another_query_is_refused(tmp_path):
    ckpt = _checkpoint(tmp_path, "q1", [0])
    out = _output(tmp_path, "q2", [0])
    with pytest.raises(PipelineError, match="belongs to query q2.*checkpoint .* is query q1"):
        check_consistency(out, ckpt)


def test_a_checkpoint_older_than_the_output_is_refused(tmp_path):
    ckpt = _checkpoint(tmp_path, "q1", [0, 1])
    out = _output(tmp_path, "q1", [0, 1, 2, 3, 4])
    with pytest.raises(PipelineError, match="batches up to 4 but checkpoint .* only up to 1"):
        check_consistency(out, ckpt)


def test_lost_output_is_refused(tmp_path):
    ckpt = _checkpoint(tmp_path, "q1", [0, 1, 2])
    out = _output(tmp_path, "q1", [0])
    with pytest.raises(PipelineError, match="output was lost"):
        check_consistency(out, ckpt)


def test_output_without_its_checkpoint_is_refused(tmp_path):
    out = _output(tmp_path, "q1", [0, 1])
    with pytest.raises(PipelineError, match="checkpoint .* is empty"):
        check_consistency(out, tmp_path / "checkpoint")


def test_a_damaged_checkpoint_is_named(tmp_path):
    ckpt = tmp_path / "checkpoint"
    ckpt.mkdir()
    (ckpt / "metadata").write_text("garbage")
    out = _output(tmp_path, "q1", [0])
    with pytest.raises(PipelineError, match="damaged"):
        check_consistency(out, ckpt)

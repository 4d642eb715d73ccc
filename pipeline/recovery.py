"""The output and the checkpoint held together: the check before a query starts, and the way back.

``check_consistency`` refuses to start when the checkpoint and the output (``pipeline.sinks``) no longer
describe the same history, rather than silently skipping or repeating batches; ``rollback`` takes an output
back to an earlier batch, the way out when a restored checkpoint is refused.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from pipeline.checkpoint import checkpoint_batches, checkpoint_query_id
from pipeline.delta import DeltaTables, is_table
from pipeline.errors import PipelineError
from pipeline.sinks import (
    COMMITS,
    DATASETS,
    OWNER_FILE,
    PARTITIONS,
    PUBLISHING,
    ROLLBACK,
    STAGING,
    atomic_write_json,
    committed_batches,
)

log = logging.getLogger(__name__)


def check_consistency(output: Path, checkpoint: Path) -> None:
    """Refuse to start if the checkpoint and the output disagree about what has been written.

    The output may be at most one batch ahead of the checkpoint (the process died after the output's commit
    marker and before Spark's own commit; that batch is replayed and skipped). Anything else means batches
    would be silently skipped or repeated.
    """
    if (output / ROLLBACK).is_file():
        target = json.loads((output / ROLLBACK).read_text()).get("to_batch")
        raise PipelineError(
            f"output {output} is in the middle of a rollback to batch {target} that did not finish: run "
            f"`sotw pipeline rollback {output} --to-batch {target}` again to complete it"
        )
    ckpt_batches = checkpoint_batches(checkpoint)
    owner = output / OWNER_FILE
    query_id = checkpoint_query_id(checkpoint)
    delta = any(is_table(output / name) for name in DATASETS)
    out_batches = committed_batches(output)
    if delta:
        # A Delta table records the batches of the query that wrote them (its transaction identifier), and
        # only those that wrote to it: the last one is a lower bound of what the output holds.
        writer = json.loads(owner.read_text()).get("query_id") if owner.is_file() else query_id
        last = DeltaTables(output, str(writer), PARTITIONS).last_batch()
        out_batches = [last] if last >= 0 else []
    if owner.is_file():
        recorded = json.loads(owner.read_text()).get("query_id")
        if query_id is None and out_batches:
            raise PipelineError(
                f"output {output} holds {len(out_batches)} batches written by query {recorded}, but checkpoint "
                f"{checkpoint} is empty: restore the checkpoint or use a new output directory"
            )
        if query_id is not None and recorded != query_id:
            raise PipelineError(
                f"output {output} belongs to query {recorded}, but checkpoint {checkpoint} is query {query_id}: "
                "they come from different runs; use matching directories"
            )
    elif out_batches:
        raise PipelineError(f"output {output} has batches but no {OWNER_FILE}: it was not written by sotw")
    last_out = out_batches[-1] if out_batches else -1
    last_ckpt = ckpt_batches[-1] if ckpt_batches else -1
    if last_out > last_ckpt + 1:
        raise PipelineError(
            f"output {output} has batches up to {last_out} but checkpoint {checkpoint} only up to {last_ckpt}: "
            "the checkpoint is older than the output (restored or damaged); refusing to rewrite or skip batches"
        )
    if last_ckpt >= 0 and last_out < last_ckpt and not delta:
        raise PipelineError(
            f"checkpoint {checkpoint} has committed batches up to {last_ckpt} but output {output} only up to "
            f"{last_out}: output was lost or deleted; refusing to continue with a hole in the output"
        )


_BATCH_FILE = re.compile(r"^b(\d+)-")


@dataclass(frozen=True)
class RollbackResult:
    """What ``rollback`` removed."""

    batches: list[int]
    files: int


def rollback(output: Path, checkpoint: Path, to_batch: int) -> RollbackResult:
    """Take ``output`` back to batch ``to_batch``: every later batch's marker and files are removed.

    The way out when a restarted pipeline refuses to skip a batch the checkpoint now plans over other offsets
    (a checkpoint restored from an older backup): after the rollback the batches after ``to_batch`` are
    written again from the restored checkpoint. The pipeline must not be running. The target is written to
    ``_rollback.json`` first and removed last, so an interrupted rollback is finished by running it again,
    and the pipeline refuses to start on a half-rolled-back output.

    Raises
    ------
    PipelineError
        If the checkpoint has committed batches after ``to_batch`` (the output would have a hole).
    """
    if to_batch < -1:
        raise PipelineError(f"--to-batch must be -1 (nothing) or a batch id, got {to_batch}")
    last_ckpt = max(checkpoint_batches(checkpoint), default=-1)
    if last_ckpt > to_batch:
        raise PipelineError(
            f"checkpoint {checkpoint} has committed batches up to {last_ckpt}: rolling the output back to "
            f"{to_batch} would leave a hole; restore an older checkpoint first, or roll back to {last_ckpt}"
        )
    output.mkdir(parents=True, exist_ok=True)
    atomic_write_json(output / ROLLBACK, {"to_batch": to_batch})
    dropped = [b for b in committed_batches(output) if b > to_batch]
    for batch in sorted(dropped, reverse=True):
        (output / COMMITS / f"{batch}.json").unlink(missing_ok=True)
    files = 0
    for dataset in DATASETS:
        for folder, _, names in os.walk(output / dataset):
            for name in names:
                match = _BATCH_FILE.match(name)
                if match and int(match.group(1)) > to_batch:
                    os.unlink(os.path.join(folder, name))
                    files += 1
    for side in (STAGING, PUBLISHING):
        for entry in (output / side).glob("*") if (output / side).is_dir() else []:
            if entry.name.split(".")[0].isdigit() and int(entry.name.split(".")[0]) > to_batch:
                if entry.is_dir():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
    (output / ROLLBACK).unlink()
    log.info(
        "output %s rolled back to batch %d: %d batches, %d files removed",
        output,
        to_batch,
        len(dropped),
        files,
    )
    return RollbackResult(sorted(dropped), files)

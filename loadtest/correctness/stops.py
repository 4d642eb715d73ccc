"""Whether a job stopped when, and only as, its integrity policy says: the ``strict`` policy's stop, judged.

Under ``strict`` the first violation a session meets must stop the query. A job that exits for any other
reason (its own bug, an out-of-memory kill) at about that moment must not pass for one that stopped on
purpose, so the stop is judged by what the job wrote, not by its exit: its integrity output must name a
violation the policy stops at (``SessionExpectation.stop_events``: the first violation of a session, at or
after the first fault the job could have read). Then:

- the job stopped on its own, and the output names such a violation: the policy's stop;
- the output names one, but the job kept running: it did not stop (``did_not_stop``);
- the job exited, and the output names none: it died of something else, named with its exit code and the
  last error of its log (``no_policy_stop``);
- the job kept running, and the output names none: ``did_not_stop``.

The tables contract has no integrity output: there a strict job's stop is judged by its exit and its tables
(``loadtest.correctness.contracts``; docs/own-pipeline.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from loadtest.correctness.expect import Expectation
from loadtest.correctness.output import PipelineOutput
from loadtest.correctness.policies import Event
from loadtest.correctness.tally import opt_int
from loadtest.reports.results import Discrepancy, Triage


@dataclass(frozen=True)
class JobExit:
    """How the job under test ended, as the verifier needs it.

    Parameters
    ----------
    on_its_own
        The job exited before the harness stopped it.
    code
        Its exit code, if known.
    last_error
        The last error its log shows (``last_error``), or its last line.
    """

    on_its_own: bool
    code: int | None = None
    last_error: str = ""

    def describe(self) -> str:
        """``the job exited with code 1: <its last error>``, or that the harness stopped it."""
        if not self.on_its_own:
            return "the job kept running until the harness stopped it"
        code = "" if self.code is None else f" with code {self.code}"
        said = f": {self.last_error}" if self.last_error else ""
        return f"the job exited{code}{said}"


_ERROR = re.compile(r"(error|exception|fatal|killed|traceback|stopped)", re.IGNORECASE)
#: An exception's own line, as Python and Java print it: ``MemoryError: ...``, ``org.x.SparkException: ...``.
_RAISED = re.compile(r"^(Caused by: )?[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b:? ")


def last_error(log_path: Path, tail_bytes: int = 65536) -> str:
    """The last exception a job's log shows, else its last line that reads as an error, else its last line.

    An exception's own line (``MemoryError: ...``) names the cause; a job's closing words often only repeat
    that it failed. Empty if there is no log.
    """
    try:
        with log_path.open("rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - tail_bytes))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    raised = [line for line in lines if _RAISED.match(line) and not line.endswith("(most recent call last):")]
    errors = [line for line in lines if _ERROR.search(line)]
    chosen = raised[-1] if raised else errors[-1] if errors else lines[-1] if lines else ""
    return chosen if len(chosen) <= 300 else chosen[:297] + "..."


@dataclass(frozen=True)
class StopExpected:
    """Where the policy must stop the query: the first session (by name) whose violation stops it.

    ``after_loss``: the violation shows only in what the broker acknowledged after it lost data, so a job
    that stops on that loss first (``failOnDataLoss``) never meets it.
    """

    session: str
    sensor: str
    topic: str
    seq: int
    after_loss: bool = False


def stop_expected(exp: Expectation) -> StopExpected | None:
    """The first session that must stop the query under ``exp``'s policy, or None if none must.

    A session must stop it when every reading of it does (a copy of unknown outcome may spare it): the
    first of them by name, one whose violation comes before any data loss the broker had first.
    """
    found = []
    for name, readings in exp.sessions.items():
        if readings and all(want.stop_at is not None for want in readings):
            want = readings[0]
            assert want.stop_at is not None
            found.append(
                StopExpected(name, want.sensor, want.topic, want.stop_at, want.stop_at in want.after_reset)
            )
    return min(found, key=lambda m: (m.after_loss, m.session), default=None)


@dataclass(frozen=True)
class FoundStop:
    """The violation a job's integrity output names as the one that stopped it, and where it wrote it."""

    session: str
    text: str
    batch: int | None
    offset: int | None


def policy_stops(
    exp: Expectation, events: Mapping[str, set[Event]], integrity: pd.DataFrame
) -> list[FoundStop]:
    """Every session whose first violation the job's integrity output names as one that stops the query.

    Partitions are read side by side, so one strict batch may meet a stopping violation in several sessions
    (one a partition): each of them reads nothing past its own. Sorted by session name; ``batch`` and
    ``offset`` are each record's (None if not written).
    """
    found = []
    for name, readings in sorted(exp.sessions.items()):
        seen = events.get(name, set())
        for want in readings:
            hit = sorted(seen & want.stop_events)
            if want.stop_at is not None and hit:
                kind = hit[0][0]
                batch, offset = _written_at(integrity, name, kind)
                text = f"{kind.replace('_', ' ')} in session {name} at seq {want.stop_at}"
                found.append(FoundStop(name, text, batch, offset))
                break
    return found


def policy_stop(
    exp: Expectation, events: Mapping[str, set[Event]], integrity: pd.DataFrame
) -> FoundStop | None:
    """The violation that stopped the query, as the job's integrity output names it; None if it names none.

    It must be the first violation of a session that may stop the query (a reading's ``stop_events``). Of
    several (``policy_stops``), the first session by name.
    """
    return next(iter(policy_stops(exp, events, integrity)), None)


def _written_at(integrity: pd.DataFrame, session: str, kind: str) -> tuple[int | None, int | None]:
    """The batch and Kafka offset of the first integrity record of ``kind`` about ``session``."""
    if integrity.empty or not {"session", "violation"} <= set(integrity.columns):
        return None, None
    rows = integrity[(integrity["session"].astype(str) == session) & (integrity["violation"] == kind)]
    if rows.empty:
        return None, None
    first = rows.sort_values([c for c in ("batch_id", "offset") if c in rows.columns] or ["session"]).iloc[0]
    return opt_int(first.get("batch_id")), opt_int(first.get("offset"))


def last_batch(output: PipelineOutput) -> int | None:
    """The highest batch the job committed a row in, if its output says (``batch_id``)."""
    tops = [
        int(f["batch_id"].max())
        for f in (output.changes, output.sessions, output.integrity, output.dead_letters)
        if not f.empty and "batch_id" in f.columns and f["batch_id"].notna().any()
    ]
    return max(tops, default=None)


def judge_stop(
    must: StopExpected | None, stop: FoundStop | None, job_exit: JobExit | None, last: int | None = None
) -> list[Discrepancy]:
    """The discrepancies of a run whose policy must stop the query at ``must`` (None: it need not).

    ``stop`` is what the output names (``policy_stop``); ``job_exit`` how the job ended (None: not known,
    as when a job is attached to rather than started, or the verifier is given an output alone); ``last``
    the last batch the job committed (``last_batch``): a job that commits batches after the one that named
    its stop kept running, whatever it did later.
    """
    blame = Triage("pipeline", detail="the job's own stop")
    if stop is not None and stop.batch is not None and last is not None and last > stop.batch:
        anchor = must or StopExpected(stop.session, "", "", -1)
        detail = (
            f"its integrity output names {stop.text} in batch {stop.batch}, but it committed batches up to "
            f"{last} after it: strict stops the query at its first violation"
        )
        return [_at(anchor, "did_not_stop", detail, blame)]
    if must is None:
        return []
    if job_exit is not None and not job_exit.on_its_own:
        named = f"its integrity output names {stop.text}, " if stop is not None else ""
        detail = f"strict must stop the query at seq {must.seq} but {named}it kept running"
        return [_at(must, "did_not_stop", detail, blame)]
    if stop is not None or (must.after_loss and job_exit is not None):
        return []  # its own stop, or the broker's loss of data stopped it before the violation came
    how = job_exit.describe() if job_exit is not None else "the job's exit is not known"
    detail = (
        f"strict must stop the query at the first violation (seq {must.seq} of this session, or another "
        f"session's) and name it in its integrity output, which names none; {how}"
    )
    return [_at(must, "no_policy_stop", detail, blame)]


def _at(must: StopExpected, kind: str, detail: str, triage: Triage) -> Discrepancy:
    return Discrepancy(kind, must.session, detail, must.sensor, must.seq, must.topic, triage=triage)

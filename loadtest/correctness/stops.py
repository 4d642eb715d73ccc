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

from loadtest.correctness.expect import Expectation
from loadtest.correctness.policies import Event
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
    """Where the policy must stop the query: the first session (by name) whose violation stops it."""

    session: str
    sensor: str
    topic: str
    seq: int


def stop_expected(exp: Expectation) -> StopExpected | None:
    """The first session that must stop the query under ``exp``'s policy, or None if none must."""
    for name, readings in sorted(exp.sessions.items()):
        for want in readings:
            if want.stop_at is not None:
                return StopExpected(name, want.sensor, want.topic, want.stop_at)
    return None


def policy_stop(exp: Expectation, events: Mapping[str, set[Event]]) -> tuple[str, str] | None:
    """The violation that stopped the query, as the job's integrity output names it; None if it names none.

    It must be the first violation of a session that must stop the query (a reading's ``stop_events``).
    Returns the session and the violation in words; of several, the first session by name.
    """
    for name, readings in sorted(exp.sessions.items()):
        seen = events.get(name, set())
        for want in readings:
            hit = sorted(seen & want.stop_events)
            if want.stop_at is not None and hit:
                kind = hit[0][0].replace("_", " ")
                return name, f"{kind} in session {name} at seq {want.stop_at}"
    return None


def judge_stop(must: StopExpected | None, stop: str | None, job_exit: JobExit | None) -> list[Discrepancy]:
    """The discrepancies of a run whose policy must stop the query at ``must`` (None: it need not).

    ``stop`` is what the output names (``policy_stop``); ``job_exit`` how the job ended (None: not known,
    as when a job is attached to rather than started, or the verifier is given an output alone).
    """
    if must is None:
        return []
    blame = Triage("pipeline", detail="the job's own stop")
    if job_exit is not None and not job_exit.on_its_own:
        named = f"its integrity output names {stop}, " if stop is not None else ""
        detail = f"strict must stop the query at seq {must.seq} but {named}it kept running"
        return [_at(must, "did_not_stop", detail, blame)]
    if stop is not None:
        return []
    how = job_exit.describe() if job_exit is not None else "the job's exit is not known"
    detail = (
        f"strict must stop the query at the first violation (seq {must.seq} of this session, or another "
        f"session's) and name it in its integrity output, which names none; {how}"
    )
    return [_at(must, "no_policy_stop", detail, blame)]


def _at(must: StopExpected, kind: str, detail: str, triage: Triage) -> Discrepancy:
    return Discrepancy(kind, must.session, detail, must.sensor, must.seq, must.topic, triage=triage)

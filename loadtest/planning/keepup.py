"""Whether a job read what was sent while a load level was held: ``sotw capacity``'s keep-up rule.

Lag age alone cannot see a job that falls behind slowly: its backlog grows without end while its oldest unread
message stays younger than the bound for a whole level.
"""

from __future__ import annotations

import math
from typing import Any

#: A level is sustained only while the job reads at least this share of what was sent between its first and
#: last commit in the level's window. A job that falls behind slowly keeps its lag age inside the bound for a
#: whole hold (a job reading two thirds of 32,000 msg/s ends a 20 s level about 7 s further behind), yet its
#: backlog grows without end. Counted from commit to commit because a micro-batch job's committed offsets move
#: in steps: between two arbitrary samples one step more or less is a fifth of a 15 s window at 1x.
KEEP_UP = 0.85

#: The shortest span of commits ``KEEP_UP`` is judged over: across a second or two, one batch more or less
#: is most of the figure (a level held for less is judged on its lag alone).
KEEP_UP_SPAN_S = 5.0


def commit_to_commit(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """(messages read per second, share of what was sent) between the first and last commit in ``rows``.

    A commit is a sample whose ``consumed`` moved; NaN for both when the commits span less than
    ``KEEP_UP_SPAN_S`` (a level without them is judged on its lag alone).
    """
    commits, before = [], None
    for r in rows:
        consumed = r.get("consumed")
        if consumed is not None and before is not None and consumed != before and "sent" in r:
            commits.append((float(r["ts"]), float(consumed), float(r["sent"])))
        before = consumed
    if len(commits) < 2 or commits[-1][0] - commits[0][0] < KEEP_UP_SPAN_S:
        return math.nan, math.nan
    (t0, read0, sent0), (t1, read1, sent1) = commits[0], commits[-1]
    read = read1 - read0
    return read / (t1 - t0), (read / (sent1 - sent0) if sent1 > sent0 else math.nan)


def falls_behind(rows: list[dict[str, Any]]) -> bool:
    """Whether the job read less than ``KEEP_UP`` of what was sent over ``rows`` (False when unmeasured)."""
    return commit_to_commit(rows)[1] < KEEP_UP

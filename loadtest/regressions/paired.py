"""The candidate against its baseline measured side by side: a ratio per metric with a confidence bound.

The nightly job runs each benchmark on the baseline (A) and on the candidate (B) in turn, A B, B A, A B ...,
so both meet the same neighbours and the same drift of a shared machine. Each repetition gives a pair, and
each pair a ratio B / A. ``judge_pair`` judges a metric on the mean of the pairs' log ratios and a one-sided
Student-t bound on it, the way ``asv continuous`` and pytest-benchmark's compare mode judge a change:

- **regression**: the bound is narrow enough to tell (below), and even its end nearest "no change" is worse
  than the metric's smallest effect that counts (``MIN_EFFECT``, per kind);
- **improved**: the same, the other way;
- **ok**: the interval reaches "no change" or stays within the smallest effect;
- **unjudged**, with the reason: fewer than two pairs, a bound too wide to tell a regression of the smallest
  effect from none (``too_noisy``; this comes first: a wide bound beyond the smallest effect is as likely a
  few pairs that agree by chance as a finding, and its reason says which way it lies), or values a ratio
  cannot be taken of.

Lag, latency and recovery times can be near zero, where a ratio means little: their values are offset by a
small amount in their unit (``OFFSET``) before the ratio is taken, so 0.05 s against 0.10 s of lag is not
"twice as bad".
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats

#: The smallest change of a metric that counts, relative to the baseline, by kind of metric.
MIN_EFFECT = {
    "ratio": 0.10,
    "throughput": 0.10,
    "time": 0.10,
    "memory": 0.10,
    "latency": 0.15,
    "lag": 0.15,
    "recovery": 0.25,
}
#: Added to both sides before the ratio of these kinds is taken, in the metric's unit (s, or ms for latency).
OFFSET = {"lag": 0.2, "latency": 200.0, "recovery": 1.0}
#: The confidence of the one-sided bound.
CONFIDENCE = 0.95
#: A bound farther than this many smallest effects from the mean makes the metric too noisy to judge.
MAX_WIDTH = 2.0

STATUSES = ("regression", "improved", "ok", "unjudged")


@dataclass(frozen=True)
class PairedJudgement:
    """One metric of the candidate against the baseline, measured side by side.

    ``ratio`` is the geometric mean of the pairs' B / A (candidate over baseline); ``low`` and ``high`` the
    two-sided interval at twice the one-sided risk (so each end is a one-sided ``CONFIDENCE`` bound).
    ``baseline`` and ``candidate`` are the medians of each side's values; ``reason`` says why a metric was
    not judged.
    """

    name: str
    kind: str
    better: str
    unit: str
    status: str
    pairs: int
    baseline: float
    candidate: float
    ratio: float = math.nan
    low: float = math.nan
    high: float = math.nan
    min_effect: float = math.nan
    reason: str = ""

    def sentence(self) -> str:
        """One line: the metric, its ratio with its bound, both sides' values and the rule."""
        unit = f" {self.unit}" if self.unit else ""
        if self.status == "unjudged":
            return f"{self.name}: not judged ({self.reason})"
        worse = "lower" if self.better == "higher" else "higher"
        return (
            f"{self.name} x{self.ratio:.3f} (95% bound {self.low:.3f}-{self.high:.3f}, {self.pairs} pairs): "
            f"{self.candidate:.4g}{unit} against {self.baseline:.4g}{unit} on the baseline; a regression is "
            f"{worse} by more than {self.min_effect:.0%} with the whole bound beyond it"
        )


def judge_pair(
    name: str, kind: str, better: str, baseline: Sequence[float], candidate: Sequence[float], unit: str = ""
) -> PairedJudgement:
    """Judge one metric from its values on each side, paired by repetition (``baseline[i]`` with ``candidate[i]``).

    Pairs where either side did not measure the metric (NaN) are left out.
    """
    pairs = [
        (a, b) for a, b in zip(baseline, candidate, strict=False) if math.isfinite(a) and math.isfinite(b)
    ]
    a_med = statistics.median(a for a, _ in pairs) if pairs else math.nan
    b_med = statistics.median(b for _, b in pairs) if pairs else math.nan
    effect = MIN_EFFECT.get(kind, 0.10)
    common = dict(name=name, kind=kind, better=better, unit=unit, pairs=len(pairs), min_effect=effect)
    if len(pairs) < 2:
        why = "one pair: no bound" if pairs else "no pair measured it on both sides"
        return PairedJudgement(status="unjudged", baseline=a_med, candidate=b_med, reason=why, **common)  # type: ignore[arg-type]
    offset = OFFSET.get(kind, 0.0)
    if any(a + offset <= 0 or b + offset <= 0 for a, b in pairs):
        why = "a value at or below zero: no ratio"
        return PairedJudgement(status="unjudged", baseline=a_med, candidate=b_med, reason=why, **common)  # type: ignore[arg-type]
    logs = [math.log((b + offset) / (a + offset)) for a, b in pairs]
    mean = statistics.fmean(logs)
    sd = statistics.stdev(logs)
    half = float(stats.t.ppf(CONFIDENCE, len(logs) - 1)) * sd / math.sqrt(len(logs))
    low, high = mean - half, mean + half
    limit = math.log1p(effect)
    verdict = dict(
        baseline=a_med, candidate=b_med, ratio=math.exp(mean), low=math.exp(low), high=math.exp(high)
    )
    # Worse is down for a metric where higher is better: flip so that "worse" is always up.
    worse_low, worse_high = (-high, -low) if better == "higher" else (low, high)
    # Too wide a bound is judged neither way, even when it lies beyond the smallest effect: a few pairs that
    # agree by chance while the runs swing by a third make such a bound as readily as a real change does.
    if half > MAX_WIDTH * limit:
        lean = ""
        if worse_low > limit or worse_high < -limit:
            lean = f", though the whole bound is {'worse' if worse_low > limit else 'better'} than that"
        why = (
            f"too noisy: the 95% bound x{math.exp(low):.2f}-x{math.exp(high):.2f} is wider than "
            f"{MAX_WIDTH:g} times the smallest effect ({effect:.0%}) on either side{lean}; more repeats would tell"
        )
        return PairedJudgement(status="unjudged", reason=why, **verdict, **common)  # type: ignore[arg-type]
    if worse_low > limit:
        return PairedJudgement(status="regression", **verdict, **common)  # type: ignore[arg-type]
    if worse_high < -limit:
        return PairedJudgement(status="improved", **verdict, **common)  # type: ignore[arg-type]
    return PairedJudgement(status="ok", **verdict, **common)  # type: ignore[arg-type]


def judgement_lines(judgements: Sequence[PairedJudgement]) -> list[str]:
    """Lines for a log: each regression and improvement in a sentence, what was not judged and why."""
    lines = [f"REGRESSION {j.sentence()}" for j in judgements if j.status == "regression"]
    lines += [f"improved: {j.sentence()}" for j in judgements if j.status == "improved"]
    unjudged = [j for j in judgements if j.status == "unjudged"]
    if unjudged:
        lines.append(
            f"not judged ({len(unjudged)}): " + "; ".join(f"{j.name} ({j.reason})" for j in unjudged)
        )
    if not any(j.status == "regression" for j in judgements):
        lines.append("no regression")
    return lines


def judgement_rows(judgements: Sequence[PairedJudgement]) -> tuple[list[str], list[list[str]]]:
    """The judgements as a table, regressions first."""
    from loadtest.reports.display import fmt

    order = {status: i for i, status in enumerate(STATUSES)}
    rows = []
    for j in sorted(judgements, key=lambda j: (order.get(j.status, 9), j.name)):
        bound = "-" if not math.isfinite(j.low) else f"{j.low:.3f} - {j.high:.3f}"
        ratio = "-" if not math.isfinite(j.ratio) else f"x{j.ratio:.3f}"
        status = j.status.upper() if j.status == "regression" else j.status
        rows.append(
            [
                j.name,
                status,
                fmt(j.candidate, j.unit),
                fmt(j.baseline, j.unit),
                ratio,
                bound,
                str(j.pairs),
                j.reason,
            ]
        )
    head = ["metric", "status", "candidate", "baseline", "ratio", "95% bound", "pairs", "why not judged"]
    return head, rows

"""Thresholds a headless Locust run is judged by, for CI: the ``--check-*`` options and their exit code.

In the spirit of locust-plugins' ``--check-rps``/``--check-fail-ratio``: each option names a bound on one of
the run's figures (``results.json``, the same figures and verdict ``sotw run`` computes), and a run that
breaks any of them exits with ``EXIT_CODE`` so a pipeline step can gate on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from loadtest.results import Results

#: The process exit code of a run that broke a threshold (locust-plugins' checks use the same).
EXIT_CODE = 3


@dataclass(frozen=True)
class Gates:
    """The thresholds asked for; None (or False) leaves one out.

    Parameters
    ----------
    max_lag_age_s
        The age of the oldest unprocessed message stays below this during the steady phase (its maximum).
    max_end_to_end_p99_s
        The p99 end-to-end latency of the messages meant for the steady phase stays below this.
    correct
        The output matches the ledger (the verifier passed).
    verdict
        The run's whole verdict is PASS, as ``sotw run``'s exit code requires.
    """

    max_lag_age_s: float | None = None
    max_end_to_end_p99_s: float | None = None
    correct: bool = False
    verdict: bool = False

    @property
    def any(self) -> bool:
        """Whether any threshold is set."""
        return (
            self.max_lag_age_s is not None
            or self.max_end_to_end_p99_s is not None
            or self.correct
            or self.verdict
        )

    def failures(self, results: Results | None) -> list[str]:
        """Each threshold the run broke, in words; a run without results breaks every one asked for."""
        if results is None:
            return ["the run ended without results"] if self.any else []
        steady = {f.name: f.value for f in results.summary if f.scope == "steady"}
        out = []
        if self.max_lag_age_s is not None:
            lag = steady.get("lag_age_max", math.nan)
            if not lag <= self.max_lag_age_s:
                out.append(f"lag age max {lag:.1f} s is not below --check-lag-age {self.max_lag_age_s:g} s")
        if self.max_end_to_end_p99_s is not None:
            p99 = steady.get("end_to_end_p99", math.nan) / 1000.0
            if not p99 <= self.max_end_to_end_p99_s:
                out.append(
                    f"end-to-end p99 {p99:.2f} s is not below --check-e2e-p99 {self.max_end_to_end_p99_s:g} s"
                )
        correctness = results.correctness
        if self.correct and (correctness is None or not correctness.passed):
            reasons = "; ".join(correctness.reasons) if correctness else "no correctness verdict"
            out.append(f"--check-correct: {reasons or 'the verifier failed'}")
        if self.verdict and results.verdict.verdict != "PASS":
            out.append(f"--check-verdict: {results.verdict.verdict}: {'; '.join(results.verdict.reasons)}")
        return out

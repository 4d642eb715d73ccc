"""``sotw demo`` (what ``make demo`` runs): a short 1x run of the whole system with a few faults on.

About two minutes on a local Kafka broker: the ``demo`` profile (a tolerant ``ordered`` policy, a burst of
faults in the middle), then the summary on the terminal and the path of the HTML report.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from loadtest import cli


def main(argv: Sequence[str]) -> int:
    """Run the demo profile at 1x; extra flags are passed to ``sotw run``.

    The demo exits 0 whenever the run completed and its report was written, PASS or FAIL: a FAIL verdict is a
    finding to read in the report, not a broken demo.
    """
    run_dir = Path("runs") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    cli.main(["run", "--profile", "demo", "--load", "1x", "--run-dir", str(run_dir), *argv], prog="sotw demo")
    return 0

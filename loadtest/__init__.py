"""The load-test harness: runs at 1x and 10x, measurements, the correctness verdict and the report.

``loadtest.runner.execute(RunRequest(...))`` runs the whole system once; ``sotw run|bench|capacity`` are its
command line. The pieces have small interfaces so other drivers (a Locust web UI, the nightly benchmark job)
reuse them: ``samplers`` (once-a-second probes), ``verify`` (the independent verdict), ``figures`` (a run's
figures, each with the phase it covers, and its verdict), ``results`` (the versioned ``results.json``) and
``report``.
"""

from loadtest.errors import HarnessError
from loadtest.profile import Profile, load_profile, parse_load
from loadtest.results import SCHEMA_VERSION, Results

__all__ = ["SCHEMA_VERSION", "HarnessError", "Profile", "Results", "load_profile", "parse_load"]

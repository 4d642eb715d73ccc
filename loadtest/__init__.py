"""The load-test harness: runs at 1x and 10x, measurements, the correctness verdict and the report.

``loadtest.run.runner.execute(RunRequest(...))`` runs the whole system once; ``sotw run|bench|capacity`` are its
command line. The pieces have small interfaces so other drivers (a Locust web UI, the nightly benchmark job)
reuse them: ``samplers`` (once-a-second probes), ``verify`` (the independent verdict), ``figures`` (a run's
figures, each with the phase it covers, and its verdict), ``results`` (the versioned ``results.json``) and
``report``.

``sotw locust`` is Locust driving the same pieces (docs/locust.md): ``locustfile`` (Locust's entry point),
``conductor`` (the master's side of a run), ``driver`` and ``feeder`` (a Locust process's users and its
simulator), ``live`` (the harness process), ``liveverify`` (the verifier run while the load goes on),
``fleetplan`` and ``shapes`` (users to load and sensors, load over time), ``webui`` (tabs, panel, routes),
``headless`` (CSV, HTML, thresholds) and ``lines`` (how the Locust side and its helper processes talk).
"""

from loadtest.errors import HarnessError
from loadtest.reports.results import SCHEMA_VERSION, Results
from loadtest.run.profile import Profile, load_profile, parse_load

__all__ = ["SCHEMA_VERSION", "HarnessError", "Profile", "Results", "load_profile", "parse_load"]

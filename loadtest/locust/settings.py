"""The sotw options of a Locust run, typed: the locustfile builds them from Locust's parser."""

from __future__ import annotations

from dataclasses import dataclass, field

from loadtest.locust.fleetplan import LiveConfig
from loadtest.locust.headless import Gates


@dataclass(frozen=True)
class LocustSettings:
    """The sotw options of a Locust run, typed (``loadtest/locust/locustfile.py`` builds them from Locust's parser).

    Parameters
    ----------
    live
        The harness's configuration (profile, broker, pipeline, session directory).
    shape
        The load shape's name, or None for users set by hand in the UI (or with ``-u``/``-r``).
    load, stage_s
        The shape's level and stage length (``loadtest.locust.shapes.make_shape``).
    users_per_x
        Users that make the profile's 1x load.
    gates
        Thresholds for the exit code.
    headless
        Locust runs without its web UI: the end of a run waits for the verdict.
    csv_prefix, html_file
        Locust's ``--csv`` and ``--html``: sotw's figures are written beside Locust's.
    command
        The command line, for the report.
    """

    live: LiveConfig
    shape: str | None = None
    load: float | None = None
    stage_s: float | None = None
    users_per_x: float = 10.0
    gates: Gates = field(default_factory=Gates)
    headless: bool = False
    csv_prefix: str | None = None
    html_file: str | None = None
    command: str = ""

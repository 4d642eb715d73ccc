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


#: Where Locust's web UI and a master's socket for workers listen unless ``--web-host`` or
#: ``--master-bind-host`` say otherwise: this machine only (Locust's own default is every interface).
LOOPBACK_HOST = "127.0.0.1"


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` is reachable from this machine only (Locust's ``""`` and ``*`` mean every interface)."""
    text = (host or "").strip().strip("[]").lower()
    return text == "localhost" or text.startswith("127.") or text == "::1"


def exposure_warnings(
    web_host: str | None, web_login: bool, web_ui: bool, master_bind_host: str | None, master: bool
) -> list[str]:
    """Warnings for a web UI or a master socket that others on the network can reach.

    The web UI carries sotw's incident buttons (kill the pipeline, freeze the broker, ...): without
    ``--web-login`` anyone who reaches it can press them. A master's socket takes any process as a worker,
    and that worker is handed sensors to send (never the cluster's secrets: ``ProcessSide.settings_for``).
    """
    out: list[str] = []
    if web_ui and not is_loopback(web_host) and not web_login:
        where = "every interface" if web_host in (None, "", "*") else web_host
        out.append(
            f"the web UI listens on {where} without --web-login: anyone who can reach it can press sotw's incident "
            "buttons (kill the pipeline, freeze the broker, restart it with data loss) and stop the run; add "
            f"--web-login, or --web-host {LOOPBACK_HOST} (the default)"
        )
    if master and not is_loopback(master_bind_host):
        where = "every interface" if master_bind_host in (None, "", "*") else master_bind_host
        out.append(
            f"the master takes workers on {where}: any process that reaches it can join the run as a worker and "
            f"is given sensors to send; bind it to a private network, or --master-bind-host {LOOPBACK_HOST} "
            "(the default) when the workers run on this machine"
        )
    return out

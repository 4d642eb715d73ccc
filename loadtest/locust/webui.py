"""sotw in Locust's web UI: live tabs, the sotw panel (charts and controls), its routes and downloads.

Two extension points of Locust's UI (``locust/web.py``; the ``extend_web_ui`` example shows them):

- **Tabs**: ``template_args["extended_tabs"]`` and ``["extended_tables"]`` add tabs beside Statistics and
  Charts, and the rows come with each ``/stats/requests`` poll under ``extended_stats`` (added here in an
  ``after_request`` hook): Kafka lag per topic and in total, end-to-end latency by window, the pipeline's
  batches, injected versus detected faults, and the live correctness verdict.
- **Routes** on ``environment.web_ui.app``: ``/sotw/`` is the panel (lag, latency and batch charts over time,
  the correctness summary, fault-rate controls and incident buttons), which a button on Locust's own page
  opens beside it; ``/sotw/state`` is its data, ``/sotw/faults`` and ``/sotw/incident`` its controls, and
  ``/sotw/*.csv`` the downloads listed in Locust's Download Data tab. ``/sotw/correctness`` is the
  Correctness tab's rows now, with the verification after Stop and the verdict: Locust's UI stops polling
  its statistics (and so the tabs) once the runner is STOPPED, so a script on Locust's page
  (``webui/correctness.js``) shows these rows in the tab until a run starts again.

Every route goes through ``web_ui.auth_required_if_enabled``, so ``--web-login`` guards them as it guards the
rest of Locust's UI.

Two hooks on Locust's own routes keep Stop and Start honest:

- ``/stats/requests`` carries the runner's state as it is when the poll is answered, and a poll that comes
  while a stop goes on (CLEANUP, or STOPPING on a master) is answered once it is over. Locust's UI polls only
  while it reads SPAWNING or RUNNING: one poll that read CLEANUP left it showing CLEANUP, its Stop button
  loading, long after the runner had stopped (upstream: locustio/locust issues 2430 and 2400), and Locust
  caches that response for 2 s (longer after a slow one), so a poll could read CLEANUP after the stop.
- ``/swarm`` refuses a Start, with the reason in the start form, while the last run is still being verified
  (``Conductor.start_refusal``).
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
from flask import Blueprint, Response, jsonify, make_response, request
from locust.runners import STATE_CLEANUP, STATE_STOPPING

from loadtest.locust.conductor import Conductor
from loadtest.locust.headless import summary_rows
from sotw.errors import SotwError

ASSETS = Path(__file__).with_name("webui")
#: Runner states that last only while a stop goes on, and on which Locust's UI stops polling.
PASSING_STATES = (STATE_CLEANUP, STATE_STOPPING)
#: How long a poll of ``/stats/requests`` waits for the runner to leave them.
PASSING_WAIT_S = 10.0
_TYPES = {".js": "application/javascript", ".css": "text/css", ".html": "text/html"}

TABS = [
    (
        "sotw-lag",
        "Kafka lag",
        [("topic", "Topic"), ("offsets", "Offsets behind"), ("age", "Oldest unprocessed (s)")],
    ),
    (
        "sotw-latency",
        "End-to-end latency",
        [
            ("window", "Committed (5 s window)"),
            ("messages", "Rows"),
            ("p50", "p50 (ms)"),
            ("p90", "p90 (ms)"),
            ("p99", "p99 (ms)"),
            ("max", "max (ms)"),
        ],
    ),  # fmt: skip
    (
        "sotw-batches",
        "Pipeline batches",
        [
            ("time", "Time"),
            ("batches", "Batches committed"),
            ("duration", "Last batch (ms)"),
            ("consumed", "Consumed (msg/s)"),
            ("state", "State rows"),
        ],
    ),  # fmt: skip
    (
        "sotw-faults",
        "Faults",
        [
            ("fault", "Fault"),
            ("injected", "Injected"),
            ("reported", "Reported by the pipeline"),
            ("expected", "Expected (verified sessions)"),
            ("detected", "Detected"),
            ("hits", "True positives"),
        ],
    ),  # fmt: skip
    ("sotw-correctness", "Correctness", [("name", "Check"), ("value", "So far")]),
]


def template_args() -> dict[str, Any]:
    """The tabs, their tables' columns and the downloads, for Locust's page."""
    return {
        "extended_tabs": [{"key": key, "title": title} for key, title, _ in TABS],
        "extended_tables": [
            {"key": key, "structure": [{"key": k, "title": t} for k, t in columns]}
            for key, _, columns in TABS
        ],
        "extended_csv_files": [
            {"href": "./sotw/figures.csv", "title": "Download sotw figures and verdict CSV"},
            {"href": "./sotw/history.csv", "title": "Download sotw per-second history CSV"},
            {"href": "./sotw/latency.csv", "title": "Download sotw end-to-end latency CSV"},
        ],
    }


def _clock(ms: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ms / 1000.0))


def _round(value: Any, digits: int = 1) -> Any:
    return round(value, digits) if isinstance(value, float) else value


def tab_rows(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of every sotw tab, from ``Conductor.state()``."""
    run = state.get("run") or {}
    samples = run.get("samples") or []
    last = samples[-1] if samples else {}
    lag = [
        {"topic": t["topic"], "offsets": t["offsets"], "age": _round(t["age_s"])}
        for t in run.get("topics", [])
    ]
    lag.append(
        {"topic": "Total", "offsets": last.get("lag_offsets", 0), "age": _round(last.get("lag_age_s", 0.0))}
    )
    latency = [
        {
            "window": _clock(w["t_ms"]),
            "messages": w["count"],
            **{k: _round(w[k], 0) for k in ("p50", "p90", "p99", "max")},
        }
        for w in reversed(run.get("latency") or [])
    ]
    batches = []
    seen = None
    for row in samples:
        if row.get("batches") is not None and row.get("batches") != seen:
            seen = row.get("batches")
            batches.append(
                {
                    "time": _clock(row["ts"] * 1000),
                    "batches": row.get("batches"),
                    "duration": row.get("batch_duration_ms"),
                    "consumed": row.get("consumed"),
                    "state": row.get("state_rows"),
                }
            )
    faults = [
        {
            "fault": f["fault"],
            "injected": f["injected"],
            "reported": f["reported"],
            "expected": f["expected"],
            "detected": f["detected"],
            "hits": f["true_positives"],
        }
        for f in run.get("faults") or []
    ]
    return [
        {"key": "sotw-lag", "data": lag},
        {"key": "sotw-latency", "data": latency},
        {"key": "sotw-batches", "data": list(reversed(batches))[:120]},
        {"key": "sotw-faults", "data": faults},
        {"key": "sotw-correctness", "data": correctness_rows(state)},
    ]


def verification_text(verification: dict[str, Any]) -> str:
    """The verification after a stop in words: its step, what it does there, and how long since the stop."""
    if verification.get("state") == "failed":
        return f"failed: {verification.get('error')}"
    step, detail = verification.get("step") or "", verification.get("detail") or ""
    since = verification.get("since_stop_s")
    text = f"{step}: {detail}" if detail else step
    return f"{text} ({since:.0f} s since Stop)" if since is not None else text


def correctness_rows(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The correctness tab: the verdict so far, the verification's progress after Stop, the final verdict."""
    run = state.get("run") or {}
    c = run.get("correctness") or {}
    verdict = run.get("verdict") or {}
    verification = run.get("verification") or {}
    final = verdict.get("verdict")
    if not final:
        final = {"running": "being verified", "failed": "none: the verification failed"}.get(
            verification.get("state", ""), "after the run"
        )
    rows = [("phase", run.get("phase", "no run yet")), ("verdict (final)", final)]
    if verification.get("state") in ("running", "failed"):
        rows.append(("verification after Stop", verification_text(verification)))
    rows += [
        ("so far", "correct" if c.get("passed", True) else "NOT correct"),
        ("sessions closed by the simulators", c.get("sessions_closed", 0)),
        ("sessions verified", c.get("sessions_verified", 0)),
        (
            "sessions exact / required",
            f"{c.get('sessions_exact', 0)} / {c.get('sessions_exact_required', 0)}",
        ),
        ("rows expected", c.get("rows_expected", 0)),
        ("rows written", c.get("rows_written", 0)),
        ("rows lost", c.get("rows_lost", 0)),
        ("rows repeated", c.get("rows_repeated", 0)),
        ("rows unexpected", c.get("rows_unexpected", 0)),
        (
            "malformed quarantined / sent",
            f"{c.get('malformed_quarantined', 0)} / {c.get('malformed_sent', 0)}",
        ),
    ]
    rows += [
        (f"discrepancies: {k.replace('_', ' ')}", n)
        for k, n in sorted((c.get("discrepancy_counts") or {}).items())
    ]
    rows += [(f"blame: {layer}", n) for layer, n in sorted((c.get("blame") or {}).items())]
    final = verdict.get("correctness") or {}
    if final:
        rows += [
            ("final: correct", "yes" if final.get("passed") else "NO"),
            ("final: sessions verified", final.get("sessions_expected", 0)),
            (
                "final: rows lost / repeated / unexpected",
                " / ".join(str(final.get(k, 0)) for k in ("rows_lost", "rows_repeated", "rows_unexpected")),
            ),
        ]
    rows += [("reason", r) for r in verdict.get("reasons", [])]
    if verdict.get("report"):
        rows.append(("report", verdict["report"]))
    return [{"name": name, "value": value} for name, value in rows]


def settled_state(runner: Any, limit_s: float = PASSING_WAIT_S) -> str:
    """The runner's state once a stop going on is over (at most ``limit_s`` seconds from now).

    It waits as a greenlet, so the stop it waits for goes on meanwhile.
    """
    deadline = time.monotonic() + limit_s
    while runner.state in PASSING_STATES and time.monotonic() < deadline:
        gevent.sleep(0.05)
    return str(runner.state)


def _csv(rows: list[list[Any]], header: list[str], name: str) -> Response:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    writer.writerows(rows)
    response = make_response(out.getvalue())
    response.headers["Content-Type"] = "text/csv"
    response.headers["Content-Disposition"] = f"attachment;filename=sotw_{name}.csv"
    return response


def install(web_ui: Any, conductor: Conductor, base_path: str = "") -> None:
    """Add sotw's tabs, routes and panel button to Locust's web UI."""
    web_ui.template_args.update(template_args())
    auth: Callable[[Callable[..., Any]], Callable[..., Any]] = web_ui.auth_required_if_enabled
    bp = Blueprint("sotw", __name__, url_prefix=f"{base_path}/sotw")

    @bp.route("/")
    @auth
    def panel() -> Response:
        return _asset("panel.html")

    @bp.route("/static/<name>")
    @auth
    def static(name: str) -> Response:
        return _asset(name)

    @bp.route("/state")
    @auth
    def state() -> Response:
        return jsonify(conductor.state())

    @bp.route("/correctness")
    @auth
    def correctness() -> Response:
        now = conductor.state()
        run = now.get("run") or {}
        runner = conductor.env.runner
        return jsonify(
            {
                "runner_state": runner.state if runner is not None else None,
                "rows": correctness_rows(now),
                "verification": run.get("verification"),
                "verdict": run.get("verdict"),
            }
        )

    @bp.route("/faults", methods=["POST"])
    @auth
    def faults() -> tuple[Response, int]:
        body = request.get_json(silent=True) or {}
        try:
            applied = conductor.set_faults(body)
        except (SotwError, ValueError, TypeError) as exc:
            return jsonify({"ok": False, "message": str(exc)}), 400
        return jsonify({"ok": True, "faults": applied.__dict__}), 200

    @bp.route("/incident", methods=["POST"])
    @auth
    def incident() -> tuple[Response, int]:
        body = request.get_json(silent=True) or {}
        try:
            conductor.fire(body)
        except SotwError as exc:
            return jsonify({"ok": False, "message": str(exc)}), 400
        return jsonify({"ok": True}), 200

    @bp.route("/figures.csv")
    @auth
    def figures_csv() -> Response:
        if conductor.results is None:
            return make_response("no verdict yet: the figures come when a run has ended", 404)
        return _csv(summary_rows(conductor.results), ["name", "scope", "value", "unit"], "figures")

    @bp.route("/history.csv")
    @auth
    def history_csv() -> Response:
        samples = (conductor.state().get("run") or {}).get("samples") or []
        columns = sorted({k for row in samples for k in row})
        return _csv([[row.get(c, "") for c in columns] for row in samples], columns, "history")

    @bp.route("/latency.csv")
    @auth
    def latency_csv() -> Response:
        windows = (conductor.state().get("run") or {}).get("latency") or []
        keys = ["t_ms", "count", "p50", "p90", "p99", "max"]
        return _csv([[w[k] for k in keys] for w in windows], keys, "latency")

    web_ui.app.register_blueprint(bp)

    def refuse_a_start_while_verifying() -> Response | None:
        if request.endpoint != "locust.swarm" or request.method != "POST":
            return None
        refusal = conductor.start_refusal()
        if refusal is None:
            return None
        # Locust's start form shows a refused start's message (its own refusals have this shape).
        return jsonify({"success": False, "message": f"sotw: {refusal}", "host": conductor.env.host})

    web_ui.app.before_request(refuse_a_start_while_verifying)

    def extend(response: Response) -> Response:
        if request.path == f"{base_path}/stats/requests" and response.is_json:
            runner = conductor.env.runner
            state = settled_state(runner) if runner is not None else None
            data = response.get_json()
            data["extended_stats"] = tab_rows(conductor.state())
            if runner is not None:  # now, not when Locust cached the rest of the response
                data["state"], data["user_count"] = state, runner.user_count
            response.set_data(json.dumps(data))
        elif request.endpoint == "locust.index" and response.mimetype == "text/html":
            text = response.get_data(as_text=True)
            tag = "".join(
                f'<script src="{base_path}/sotw/static/{name}" defer></script>'
                for name in ("button.js", "correctness.js")
            )
            at = text.rfind("</body>")
            if at >= 0:
                response.set_data(text[:at] + tag + text[at:])
        return response

    web_ui.app.after_request(extend)


def _asset(name: str) -> Response:
    path = ASSETS / name
    if path.parent != ASSETS or not path.is_file():
        return make_response("not found", 404)
    response = make_response(path.read_bytes())
    response.headers["Content-Type"] = _TYPES.get(path.suffix, "application/octet-stream")
    response.headers["Cache-Control"] = "no-store"
    return response

#!/usr/bin/env python3
"""Container health checks for docker/compose.yaml, installed in the sotw image as ``sotw-healthcheck``.

The slim image has no curl, and a check written as a Python one-liner inside YAML is hard to read and to
test, so the checks live here:

``sotw-healthcheck http URL``
    healthy when URL answers 2xx (the Spark master and worker web UIs, the Locust web UI);
``sotw-healthcheck spark-app MASTER_JSON_URL NAME``
    healthy when the Spark master lists a running application called NAME (the pipeline driver has
    registered with the cluster and holds executors).

Exit status 0 is healthy, 1 unhealthy, 2 a usage error, as Docker's HEALTHCHECK expects.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Sequence

TIMEOUT_S = 5.0


def fetch(url: str) -> bytes:
    """Return the body of ``url``; any failure raises ``OSError`` so callers handle one error type."""
    if not url.startswith(("http://", "https://")):
        raise OSError(f"not an http(s) URL: {url}")
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:  # noqa: S310 (scheme checked above)
        return bytes(response.read())


def spark_app_running(master_json: bytes, name: str) -> bool:
    """Whether the Spark master's ``/json/`` status lists a running application called ``name``.

    Checking the master rather than the driver's own UI means the check also fails when the driver is up but
    could not get executors, which is the failure a user of the cluster cares about.
    """
    status = json.loads(master_json)
    apps = status.get("activeapps", [])
    return any(app.get("name") == name and app.get("state") in ("RUNNING", "WAITING") for app in apps)


def main(argv: Sequence[str]) -> int:
    """Run one check and return the exit status (0 healthy, 1 unhealthy, 2 usage)."""
    args = list(argv)
    try:
        if len(args) == 2 and args[0] == "http":
            fetch(args[1])
            return 0
        if len(args) == 3 and args[0] == "spark-app":
            if spark_app_running(fetch(args[1]), args[2]):
                return 0
            print(f"no running Spark application named {args[2]!r} at {args[1]}", file=sys.stderr)
            return 1
    except (OSError, ValueError) as exc:  # urllib.error.URLError is an OSError; bad JSON a ValueError
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    print("usage: sotw-healthcheck http URL | spark-app MASTER_JSON_URL NAME", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

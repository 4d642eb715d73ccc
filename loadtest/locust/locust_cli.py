"""``sotw locust``: Locust with sotw's locustfile, its web UI or ``--headless`` (see ``loadtest/locust/locustfile.py``).

Every option is Locust's or the locustfile's own; ``--profile NAME`` is sotw's profile, as for ``sotw run``,
and is passed on as ``--sotw-profile`` because Locust has a ``--profile`` of its own. Locust runs in place of
this process, so signals reach it directly.

``sotw locust --help`` lists both kinds of options. (Locust's own ``--help`` prints before it imports any
locustfile, so ``locust -f loadtest/locust/locustfile.py --help`` shows only Locust's: upstream issue 2917.)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

LOCUSTFILE = Path(__file__).with_name("locustfile.py")


def locust_argv(argv: Sequence[str]) -> list[str]:
    """The ``locust`` command line for ``sotw locust ARGS``."""
    out: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--profile" and i + 1 < len(args):
            out += ["--sotw-profile", args[i + 1]]
            i += 2
            continue
        out.append("--sotw-profile=" + word.split("=", 1)[1] if word.startswith("--profile=") else word)
        i += 1
    if not any(w in ("-f", "--locustfile") or w.startswith("--locustfile=") for w in out):
        out = ["-f", str(LOCUSTFILE), *out]
    return [sys.executable, "-m", "locust", *out]


def print_help(locustfile: Path = LOCUSTFILE) -> None:
    """Locust's help with the locustfile's options in it (Locust loads the file, then builds its parser)."""
    from locust.argument_parser import get_parser
    from locust.util.load_locustfile import load_locustfile

    load_locustfile(str(locustfile))
    parser = get_parser()
    # `sotw locust --profile NAME` is sotw's profile (locust_argv passes it on as --sotw-profile), not Locust's.
    for action in parser._actions:
        if "--profile" in action.option_strings:
            action.help = "sotw: the load-test profile in the scenario file, as for sotw run (baseline)"
    parser.print_help()


def main(argv: Sequence[str]) -> int:
    """Replace this process with Locust (or print the help with sotw's options)."""
    if any(word in ("-h", "--help") for word in argv):
        print_help()
        return 0
    command = locust_argv(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(command[0], command)  # noqa: S606 - Locust takes this process's place, with its signals
    return 0  # pragma: no cover - execv does not return

"""``python -m pipeline`` is ``sotw pipeline`` (same error handling and exit codes)."""

import sys

from sotw.cli import main

raise SystemExit(main(["pipeline", *sys.argv[1:]]))

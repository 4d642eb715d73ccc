"""``python -m loadtest run|bench|capacity`` is ``sotw run|bench|capacity``."""

import sys

from sotw.cli import main

raise SystemExit(main(sys.argv[1:] or ["run"]))

"""``python -m pipeline`` is ``sotw pipeline``."""

import sys

from pipeline.cli import main

raise SystemExit(main(sys.argv[1:]))

"""``python -m sotw`` is the ``sotw`` console script."""

from sotw.cli import main

raise SystemExit(main())

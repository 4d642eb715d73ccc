"""``python -m simulator`` runs ``sotw simulate``."""

import sys

from sotw.cli import main

if __name__ == "__main__":
    sys.exit(main(["simulate", *sys.argv[1:]]))

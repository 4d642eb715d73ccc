"""Import PySpark from its installed package, not from the zips Spark puts first on its Python processes' path.

For a pip-installed PySpark, Spark starts every Python process it needs (the worker daemon, the data source
planners, and one streaming source runner per query) with ``pyspark/python/lib/pyspark.zip`` and py4j's zip
first on ``PYTHONPATH``. Python cannot cache compiled bytecode for a zip, so each of those processes compiles
pyspark's modules from source: importing the streaming source runner and sotw's source took 0.82-0.87 s that
way against 0.28-0.30 s from the installed package, and every query's first trigger waits for it.

``install`` writes a one-line ``.pth`` file into this environment's site-packages. Python runs it when any
process of the environment starts, and it drops those zips from ``sys.path`` when the same packages are
installed beside them (``installed_beside``), before anything can import pyspark. ``make setup`` and the
Docker image run ``python -m sotw.pysparkpath``; without it everything works the same, only slower to start.
``pipeline.pydaemon`` drops the zips in the worker daemon either way.

The ``.pth`` line holds a copy of this module's two functions, not an import of it (``pth_line``).
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

PTH_NAME = "sotw-pyspark-site.pth"


def installed_beside(entry: str, path: list[str] | None = None) -> bool:
    """True if ``entry`` is a zip inside an installed package whose own directory Python can import instead.

    A pip-installed PySpark keeps ``.../site-packages/pyspark/python/lib/pyspark.zip`` and
    ``.../py4j-<version>-src.zip``; the packages themselves are ``.../site-packages/pyspark`` and
    ``.../site-packages/py4j``. ``path`` is the import path to check against (default ``sys.path``).
    """
    path = sys.path if path is None else path
    if not entry.endswith(".zip"):
        return False
    name = os.path.basename(entry)
    package = "pyspark" if name == "pyspark.zip" else "py4j" if name.startswith("py4j-") else None
    if package is None:
        return False
    lib = os.path.dirname(entry)
    site = os.path.dirname(os.path.dirname(os.path.dirname(lib)))  # .../site-packages
    # The zip must sit in an installed pyspark, and that installation must be the one this interpreter
    # imports once the zip is gone (a PYSPARK_PYTHON from another environment keeps its zips).
    on_path = {os.path.realpath(p) for p in path if p and not p.endswith(".zip")}
    return (
        os.path.basename(os.path.dirname(os.path.dirname(lib))) == "pyspark"
        and os.path.isfile(os.path.join(site, package, "__init__.py"))
        and os.path.realpath(site) in on_path
    )


def drop_bundled_zips() -> None:
    """Remove from ``sys.path`` the zips of a pyspark (and its py4j) that is installed on the path itself."""
    if any(p.endswith(".zip") for p in sys.path):
        sys.path[:] = [p for p in sys.path if not installed_beside(p)]


def pth_line() -> str:
    """The ``.pth`` line: ``installed_beside`` and ``drop_bundled_zips``'s own source, run at start-up.

    ``site`` executes a ``.pth`` line that starts with ``import``. The line carries a copy of the two
    functions instead of importing this module, so that starting Python never imports the ``sotw`` package
    (which would pin every process to this installation's copy, whatever else is on its path). It runs in
    a namespace of its own; ``make setup`` writes it again after an upgrade.
    """
    import inspect

    code = "import os, sys\n" + inspect.getsource(installed_beside) + inspect.getsource(drop_bundled_zips)
    return f"import sys; exec({code + 'drop_bundled_zips()' + chr(10)!r}, {{}})\n"


def install(site_packages: Path | None = None) -> Path:
    """Write the ``.pth`` file into ``site_packages`` (default: this environment's); return its path."""
    target = Path(site_packages or sysconfig.get_paths()["purelib"]) / PTH_NAME
    target.write_text(pth_line())
    return target


if __name__ == "__main__":
    print(f"wrote {install()}: Spark's Python processes import pyspark from the installed package")

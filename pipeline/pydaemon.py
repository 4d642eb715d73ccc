"""Spark's Python worker daemon, with the workers' modules loaded once, before it forks them.

Spark starts one daemon per executor (``python -m pyspark.daemon``) and forks a worker from it for every task
that needs Python and finds no idle worker. Each fresh worker then imports ``pyspark.worker``, pandas,
pyarrow and sotw's modules on its own, and for a pip-installed PySpark it imports pyspark from
``pyspark/python/lib/pyspark.zip``, which Spark puts first on the workers' ``PYTHONPATH``: Python cannot
cache bytecode for a zip, so every fresh worker compiles pyspark's modules from source (about 0.9 CPU s
against 0.3 s from the installed package). A query's first micro-batch starts several workers at once on
two cores, so this is most of the extra Python time of a first batch (docs/benchmarks.md, stop 11).

``build_session`` sets ``spark.python.daemon.module`` to this module. It drops the zips from ``sys.path`` when
the same pyspark (and py4j) is installed beside them (a pip install ships the zip inside the package, so
both are one version), imports what the workers import, freezes those objects out of the garbage
collector's view (``gc.freeze``, so collections in the workers do not walk them and their pages stay
shared), and then runs PySpark's own daemon unchanged. Preloading is best effort: a module that fails to
import is reported on stderr and left to the worker, as before.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import sys

#: What a sotw worker imports: PySpark's worker and its pandas/Arrow paths, and sotw's task-side modules.
PRELOAD = (
    "pyspark.worker",
    "pyspark.sql.pandas.serializers",
    "pyspark.sql.pandas.types",
    "pyspark.sql.conversion",
    "pyspark.sql.worker.plan_data_source_read",
    "pandas",
    "pyarrow",
    "pyarrow.parquet",
    "pyarrow.compute",
    "pipeline.source",
    "pipeline.reconstruct",
    "pipeline.sinks",
)


def installed_beside(entry: str) -> bool:
    """True if ``entry`` is a zip inside an installed package whose own directory Python can import instead.

    A pip-installed PySpark keeps ``.../site-packages/pyspark/python/lib/pyspark.zip`` and
    ``.../py4j-<version>-src.zip``; the packages themselves are ``.../site-packages/pyspark`` and
    ``.../site-packages/py4j``.
    """
    if not entry.endswith(".zip"):
        return False
    name = os.path.basename(entry)
    package = "pyspark" if name == "pyspark.zip" else "py4j" if name.startswith("py4j-") else None
    if package is None:
        return False
    lib = os.path.dirname(entry)
    site = os.path.dirname(os.path.dirname(os.path.dirname(lib)))  # .../site-packages
    return os.path.basename(os.path.dirname(os.path.dirname(lib))) == "pyspark" and os.path.isfile(
        os.path.join(site, package, "__init__.py")
    )


def prepare() -> None:
    """Import pyspark from the installed package and preload the workers' modules (see the module doc)."""
    sys.path[:] = [p for p in sys.path if not installed_beside(p)]
    # The daemon tells the JVM its port on stdout: nothing an import prints may go there first.
    with contextlib.redirect_stdout(sys.stderr):
        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except Exception as exc:  # noqa: BLE001 - the worker imports it itself and reports a real error
                print(f"sotw: not preloading {name} in the Python daemon: {exc!r}", file=sys.stderr)
    gc.collect()
    gc.freeze()


def main() -> None:
    """Prepare, then hand over to PySpark's daemon (it reads the worker module from ``sys.argv``)."""
    prepare()
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()

"""Spark's Python worker daemon, with the workers' modules loaded once, before it forks them.

Spark starts one daemon per executor (``python -m pyspark.daemon``) and forks a worker from it for every task
that needs Python and finds no idle worker. Each fresh worker then imports ``pyspark.worker``, pandas,
pyarrow and sotw's modules on its own, and for a pip-installed PySpark it imports pyspark from
``pyspark/python/lib/pyspark.zip``, which Spark puts first on the workers' ``PYTHONPATH``: Python cannot
cache bytecode for a zip, so every fresh worker compiles pyspark's modules from source (importing
``pyspark.worker`` and PySpark's pandas modules took 1.0-1.1 CPU s from the zip against 0.2-0.3 s from the
installed package). A query's first micro-batch starts several workers at once on two cores, so this was
most of the extra Python time of a first batch.

``build_session`` sets ``spark.python.daemon.module`` to this module (``--conf
spark.python.daemon.module=pyspark.daemon`` turns it off). It drops the zips from ``sys.path`` when this
interpreter has the packages themselves installed beside them on its path (a pip install ships the zips
inside the pyspark package), imports what the workers import, freezes those objects out of the garbage
collector's view (``gc.freeze``: collections in the workers do not walk them) and then runs PySpark's own
daemon unchanged. Where ``sotw.pysparkpath``'s ``.pth`` file is installed, the zips are already gone.
Preloading is best effort: a module that fails to import is reported on stderr and left to the worker, as
before. It runs on Linux only: after it the daemon has threads (OpenBLAS's, from numpy,
and jemalloc's, from pyarrow) when it forks, which both libraries handle with fork handlers on Linux; other
systems keep PySpark's import-after-fork.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys

from sotw.pysparkpath import drop_bundled_zips

#: What a sotw worker imports: PySpark's worker and its pandas/Arrow paths, and sotw's task-side modules.
PRELOAD = (
    "pyspark.worker",
    "pyspark.sql.pandas.serializers",
    "pyspark.sql.pandas.types",
    "pyspark.sql.conversion",
    "pyspark.sql.worker.plan_data_source_read",  # its reader function runs the source's read tasks here
    "pandas",
    "pyarrow",
    "pyarrow.parquet",
    "pyarrow.compute",
    "pipeline.source",
    "pipeline.reconstruct",
    "pipeline.sinks",
)


def prepare() -> None:
    """Import pyspark from the installed package and preload the workers' modules (see the module doc)."""
    drop_bundled_zips()
    if sys.platform != "linux":
        return
    # The daemon tells the JVM its port on stdout: nothing an import prints, from Python or from C, may
    # go there first.
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except Exception as exc:  # noqa: BLE001 - the worker imports it itself and reports it
                print(f"sotw: not preloading {name} in the Python daemon: {exc!r}", file=sys.stderr)
    finally:
        sys.stdout.flush()  # what Python buffered meanwhile still goes to stderr
        os.dup2(saved, 1)
        os.close(saved)
    gc.collect()
    gc.freeze()


def main() -> None:
    """Prepare, then hand over to PySpark's daemon (it reads the worker module from ``sys.argv``)."""
    prepare()
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()

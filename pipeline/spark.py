"""One SparkSession, built with the settings every sotw job and test needs.

Starting Spark costs seconds, so the CLI, the harness and the test suite each build one session and reuse it.
``spark.sql.shuffle.partitions`` must be small *before* the first stateful query starts: it is fixed into the
checkpoint, and the default 200 makes every micro-batch on two cores take seconds.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

from sotw.sparkjars import BUNDLES, spark_jars

CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


@dataclass(frozen=True)
class SparkConfig:
    """How to start Spark.

    Parameters
    ----------
    master
        Spark master URL; ``local[2]`` uses this machine's two cores.
    driver_memory
        JVM heap of the driver (``spark.driver.memory``).
    shuffle_partitions
        ``spark.sql.shuffle.partitions``: the number of state-store partitions of the stateful step.
    ui
        Start the Spark web UI.
    jar_bundles
        The bundles of jars given to Spark as local jars (``spark.jars``, after any of ``extra``'s): Spark's
        Kafka connector (``format("kafka")``, ``--source spark-kafka``) and Delta Lake's Spark jars, fetched
        by ``make setup`` and checked against the installed PySpark (``sotw.sparkjars.spark_jars``).
    driver_java_options
        JVM options of the driver (with ``local[...]``, the JVM that runs the tasks too), placed before any
        ``spark.driver.extraJavaOptions`` in ``extra``, so those win where they overlap. The default stops
        the JIT at its first tier (C1). A micro-batch runs Spark's planner and task set-up once, so thousands
        of driver methods stay lukewarm for hundreds of batches and the optimizing compiler (C2) never
        settles: over 150 s of small triggers it took 20-65 % of a core throughout, half the JVM's CPU on
        two cores. C1 alone halved the JVM's CPU per message on small triggers and cost nothing on large
        batches. It only applies to a JVM that this call starts.
    extra
        Any other Spark settings, passed through unchanged.
    """

    master: str = "local[2]"
    driver_memory: str = "2g"
    shuffle_partitions: int = 2
    ui: bool = False
    driver_java_options: str = "-XX:TieredStopAtLevel=1"
    jar_bundles: tuple[str, ...] = BUNDLES
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.shuffle_partitions < 1:
            raise ValueError(f"shuffle_partitions must be at least 1, got {self.shuffle_partitions}")
        if not self.master:
            raise ValueError("master must not be empty")


def driver_java_options(cfg: SparkConfig) -> str:
    """``cfg.driver_java_options`` followed by any ``spark.driver.extraJavaOptions`` of ``cfg.extra``.

    The JVM takes the last of repeated options, so a user's ``--conf spark.driver.extraJavaOptions=...``
    adds to the default or overrides it (``-XX:TieredStopAtLevel=4`` restores the full JIT).
    """
    user = cfg.extra.get("spark.driver.extraJavaOptions", "")
    return " ".join(opts for opts in (cfg.driver_java_options, user) if opts)


def jars_setting(cfg: SparkConfig) -> str:
    """``spark.jars``: the user's (``extra``), then every jar of ``cfg.jar_bundles``, comma-separated.

    Raises
    ------
    sotw.errors.SetupError
        Naming ``make setup`` when a bundle is missing or built for another Spark than the installed PySpark.
    """
    ours = [str(p) for p in spark_jars(cfg.jar_bundles)] if cfg.jar_bundles else []
    user = [j for j in cfg.extra.get("spark.jars", "").split(",") if j]
    return ",".join(user + [j for j in ours if j not in user])


def build_session(config: SparkConfig | None = None, app_name: str = "sotw") -> Any:
    """Create (or return) the SparkSession configured for sotw, with the Kafka data source registered.

    Spark's Kafka connector and Delta Lake's jars are given as local jars (``jars_setting``): nothing is
    resolved at run time, and a missing or mismatched bundle fails here, naming ``make setup``.
    """
    from pyspark.sql import SparkSession

    cfg = config or SparkConfig()
    jars = jars_setting(cfg)
    # Python UDFs and data sources run ``PYSPARK_PYTHON`` (default: ``python3`` on PATH), not
    # ``spark.pyspark.python``; without this, workers start an interpreter that lacks sotw's dependencies.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(cfg.master)
        .appName(app_name)
        .config("spark.driver.memory", cfg.driver_memory)
        .config("spark.sql.shuffle.partitions", str(cfg.shuffle_partitions))
        .config("spark.ui.enabled", str(cfg.ui).lower())
        .config("spark.ui.showConsoleProgress", "false")
        # Python workers must run the interpreter that has sotw installed.
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        # Workers forked with pyspark, pandas, pyarrow and sotw already imported (pipeline/pydaemon.py).
        .config("spark.python.daemon.module", "pipeline.pydaemon")
        # sotw's checkpoints are local paths (``--checkpoint``). There, Hadoop's FileSystem API writes and
        # renames a checkpoint file (offsets, commits, state store deltas) in a quarter of the time of the
        # default FileContext one, with the same rename-or-fail semantics: 7 against 27-31 ms for each of the two
        # log entries of every trigger (docs/benchmarks.md, "The fixed cost of a trigger").
        .config("spark.sql.streaming.checkpointFileManagerClass", CHECKPOINT_FILE_MANAGER)
    )
    settings = dict(cfg.extra)
    if jars:
        settings["spark.jars"] = jars
    java_options = driver_java_options(cfg)
    if java_options:
        settings["spark.driver.extraJavaOptions"] = java_options
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from pipeline.source import KafkaDataSource

    spark.dataSource.register(KafkaDataSource)
    return spark

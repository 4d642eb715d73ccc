"""Spark's Kafka connector and Delta Lake's Spark jars, as local jars every SparkSession of this environment gets.

``make setup`` fetches two bundles with Maven (``sotw.jars``): ``spark-kafka`` (``format("kafka")``: the
connector, its token provider, kafka-clients, commons-pool2) and ``delta`` (``format("delta")``,
``DeltaTable``). ``spark_jars`` returns their paths after checking that they are built for the installed
PySpark: the connector must be exactly its version and Delta's artifact names its Spark minor version, and a
mismatch would otherwise surface inside the JVM as a ``NoSuchMethodError`` in the middle of a query.

``install`` (``make setup``: ``python -m sotw.sparkjars``) writes them as ``spark.jars`` into
PySpark's own ``conf/spark-defaults.conf``, the file ``spark-submit`` reads for a pip-installed PySpark. So
every Spark started from this environment finds both formats with nothing resolved at run time: sotw's
pipeline, the test suite, and a team's job run as ``{python} job.py`` or ``.venv/bin/spark-submit job.py`` by the
load-test harness, as on a Spark installation whose administrators put the connectors on its classpath. A
job that sets ``spark.jars`` itself replaces the default and must list these jars too (``{jars}``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sotw.errors import SetupError, SotwError
from sotw.jars import bundle_dir, classpath

#: The bundles given to Spark (jars/<bundle>/pom.xml), in ``spark.jars`` order.
BUNDLES = ("spark-kafka", "delta")
MARKER = "# sotw.sparkjars"
"""The first line of a ``spark-defaults.conf`` sotw wrote, so it replaces only its own file."""


@dataclass(frozen=True)
class BuiltFor:
    """Which Spark a bundle's main jar is built for, read from the jar's Maven name.

    Parameters
    ----------
    jar
        The jar that tells (``spark-sql-kafka-0-10_2.13-4.2.0.jar``, ``delta-spark_4.2_2.13-4.4.0.jar``).
    spark
        The Spark version it needs: a full version (the connector) or a minor one (Delta).
    what
        What the bundle is, for messages.
    """

    jar: str
    spark: str
    what: str

    def matches(self, installed: str) -> bool:
        """Whether PySpark ``installed`` is that Spark (a minor version matches each of its releases)."""
        minor = self.spark.count(".") == 1
        return installed == self.spark or (minor and installed.startswith(self.spark + "."))


_BUILT_FOR = {
    "spark-kafka": (
        re.compile(r"^spark-sql-kafka-0-10_2\.13-(\d+\.\d+\.\d+)\.jar$"),
        "Spark's Kafka connector",
    ),
    "delta": (re.compile(r"^delta-spark_(\d+\.\d+)_2\.13-[\d.]+\.jar$"), "Delta Lake's Spark jars"),
}


def built_for(bundle: str, jars: Sequence[Path]) -> BuiltFor:
    """The Spark version ``bundle``'s jars are built for.

    Raises
    ------
    SetupError
        If the bundle lacks its main jar (a POM that no longer names it).
    """
    pattern, what = _BUILT_FOR[bundle]
    for jar in jars:
        match = pattern.match(jar.name)
        if match:
            return BuiltFor(jar.name, match.group(1), what)
    raise SetupError(
        f"the {bundle} jars in {bundle_dir(bundle)} have no {pattern.pattern} jar: run `make setup`"
    )


def pyspark_version() -> str:
    """The installed PySpark's version, without importing it."""
    try:
        return importlib.metadata.version("pyspark")
    except importlib.metadata.PackageNotFoundError:
        raise SetupError("PySpark is not installed in this environment: run `make setup`") from None


def spark_jars(bundles: Sequence[str] = BUNDLES, prefix: Path | None = None) -> list[Path]:
    """The jars of ``bundles``, checked: all installed (``sotw.jars.classpath``) and built for this PySpark.

    Raises
    ------
    SetupError
        Naming ``make setup`` when a bundle is missing or damaged, and the pin to move together when a bundle
        is built for another Spark than the installed PySpark.
    """
    installed = pyspark_version()
    jars: list[Path] = []
    for bundle in bundles:
        paths = classpath(bundle, prefix)
        target = built_for(bundle, paths)
        if not target.matches(installed):
            raise SetupError(
                f"{target.what} in {bundle_dir(bundle, prefix)} ({target.jar}) are built for Spark {target.spark}, "
                f"but PySpark {installed} is installed: run `make setup` to install the PySpark that "
                f"pyproject.toml pins; to move to another Spark, change that pin and jars/{bundle}/pom.xml together "
                "(Maven Central must serve the jars for it)"
            )
        jars.extend(paths)
    return jars


def defaults_file() -> Path:
    """PySpark's ``conf/spark-defaults.conf``: what ``spark-submit`` reads when ``SPARK_CONF_DIR`` is unset."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise SetupError("PySpark is not installed in this environment: run `make setup`")
    return Path(next(iter(spec.submodule_search_locations))) / "conf" / "spark-defaults.conf"


def install(target: Path | None = None) -> Path:
    """Write ``spark.jars`` (every bundle's jars, checked) into ``target`` (PySpark's defaults file).

    Raises
    ------
    SetupError
        If a bundle is missing or built for another Spark, or ``target`` exists and was not written here
        (someone's own Spark defaults: sotw does not overwrite them).
    """
    target = target or defaults_file()
    if target.exists() and not target.read_text().startswith(MARKER):
        raise SetupError(
            f"{target} exists and was not written by sotw: add `spark.jars {','.join(map(str, spark_jars()))}` "
            "to it yourself, or move it away and run `make setup` again"
        )
    jars = ",".join(str(p) for p in spark_jars())
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(
        f"{MARKER}: written by `make setup` (python -m sotw.sparkjars); it is rewritten there.\n"
        "# Spark's Kafka connector and Delta Lake's Spark jars as local jars, so that every Spark started from\n"
        '# this environment reads format("kafka") and writes format("delta") with nothing resolved at run time.\n'
        f"spark.jars {jars}\n"
    )
    return target


def main() -> int:
    """``python -m sotw.sparkjars`` (make setup): write the jars into PySpark's ``spark-defaults.conf``."""
    try:
        print(f"wrote {install()}: every Spark of this environment gets the Kafka connector and Delta")
    except SotwError as exc:
        print(f"sotw sparkjars: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

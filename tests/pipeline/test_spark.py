"""The SparkSession sotw builds: its JVM settings reach the JVM, and a user's own options add to them."""

from __future__ import annotations

from typing import Any

from pipeline.spark import SparkConfig, driver_java_options


def test_the_spark_jvm_runs_with_the_driver_java_options(spark: Any) -> None:
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    arguments = list(runtime.getInputArguments())
    assert SparkConfig().driver_java_options == "-XX:TieredStopAtLevel=1"
    assert "-XX:TieredStopAtLevel=1" in arguments


def test_a_users_extra_java_options_come_after_the_default_so_they_win() -> None:
    user = SparkConfig(extra={"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=4 -Dsite=lab"})
    assert driver_java_options(user) == "-XX:TieredStopAtLevel=1 -XX:TieredStopAtLevel=4 -Dsite=lab"
    assert driver_java_options(SparkConfig(driver_java_options="")) == ""
    assert driver_java_options(SparkConfig(driver_java_options="", extra=user.extra)) == (
        "-XX:TieredStopAtLevel=4 -Dsite=lab"
    )

"""Client settings for a process sotw starts: private files in the run's directory, never command-line words.

``ps`` shows every process's arguments to every user of the machine, so the settings of a cluster (SASL
passwords among them) reach sotw's own children (``sotw pipeline``, the Locust harness and feeders) and a
team's job (``--pipeline-cmd``'s ``{kafka_config}``, ``{java_config}``, ``{spark_options}``) in files
written with mode 0600 from the moment they exist, and deleted when the process they were written for ends
(``SettingsFiles.remove``).

The three dialects of the same settings:

- ``kafka.properties``: librdkafka's names, one ``key=value`` a line, as ``--kafka-config`` reads them
  (``sotw.kafka.read_settings``); without ``bootstrap.servers``, which travels as ``--bootstrap``.
- ``java.properties``: the Java client's names (``sotw.javaconfig``) with ``bootstrap.servers``, a
  ``.properties`` file a Java job (Kafka Streams, Flink, a plain consumer) loads as its client config.
- ``spark-options.json``: Spark's Kafka connector options (``kafka.``-prefixed Java names,
  ``kafka.bootstrap.servers`` included) as one JSON object, for ``readStream.format("kafka").options(**...)``.
  JSON rather than ``key=value`` lines because a PEM given as text spans lines.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path

from sotw.javaconfig import java_settings, options_json, properties_text
from sotw.kafka import KafkaConfig, is_secret, read_settings, settings_text
from sotw.tls import write_private

KAFKA_CONFIG = "kafka.properties"
JAVA_CONFIG = "java.properties"
SPARK_OPTIONS = "spark-options.json"

#: What each file is, by the placeholder a ``--pipeline-cmd`` names it with.
FILES = {"kafka_config": KAFKA_CONFIG, "java_config": JAVA_CONFIG, "spark_options": SPARK_OPTIONS}


def kafka_properties(kafka: KafkaConfig) -> str:
    """``kafka.properties``' text: the librdkafka settings (``--kafka-config`` reads it back)."""
    return settings_text(
        kafka.settings, "librdkafka settings written by sotw for one run; deleted when it ends"
    )


def java_properties(kafka: KafkaConfig) -> str:
    """``java.properties``' text: ``bootstrap.servers`` and the settings in the Java client's names."""
    settings = {"bootstrap.servers": kafka.bootstrap, **java_settings(kafka.settings)}
    return properties_text(settings, "Java client settings written by sotw for one run; deleted when it ends")


def spark_options_json(kafka: KafkaConfig) -> str:
    """``spark-options.json``' text: Spark's Kafka connector options, ``kafka.bootstrap.servers`` first."""
    options = {"kafka.bootstrap.servers": kafka.bootstrap}
    options.update({f"kafka.{k}": v for k, v in java_settings(kafka.settings).items()})
    return options_json(options)


_TEXTS = {
    "kafka_config": kafka_properties,
    "java_config": java_properties,
    "spark_options": spark_options_json,
}


class SettingsFiles:
    """The settings files written into one directory for a process, removed together.

    Parameters
    ----------
    directory
        Where the files go (the run's or the job's directory); created if missing.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.written: list[Path] = []

    def path(self, kind: str) -> Path:
        """Where the file of ``kind`` (a key of ``FILES``) is written."""
        return self.directory / FILES[kind]

    def write(self, kind: str, kafka: KafkaConfig) -> Path:
        """Write the file of ``kind`` for ``kafka`` (mode 0600); returns its path.

        Raises
        ------
        sotw.javaconfig.JavaConfigError
            For ``java_config`` and ``spark_options``, a setting with no Java equivalent (named).
        """
        text = _TEXTS[kind](kafka)
        self.directory.mkdir(parents=True, exist_ok=True)
        path = write_private(self.path(kind), text)
        if path not in self.written:
            self.written.append(path)
        return path

    def remove(self) -> None:
        """Delete every file written (a file already gone is fine)."""
        for path in self.written:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self.written = []


def hand_over(settings: Mapping[str, str], path: Path) -> tuple[dict[str, str], str | None]:
    """Split settings for a process that reads them from a JSON config: the public ones, and a secrets file.

    The secrets (``sotw.kafka.is_secret``) go to ``path`` (mode 0600) and only its name goes into the JSON;
    the process reads and deletes the file (``take_over``). Returns the public settings and the file's path
    (None when there is no secret).
    """
    secrets = {k: v for k, v in settings.items() if is_secret(k)}
    public = {k: v for k, v in settings.items() if not is_secret(k)}
    if not secrets:
        return public, None
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, settings_text(secrets, "secret client settings; deleted once read"))
    return public, str(path)


def take_over(public: Mapping[str, str], secrets_file: str | None) -> dict[str, str]:
    """The settings ``hand_over`` split: the public ones with the file's secrets, the file deleted once read.

    Raises
    ------
    ValueError
        If the file cannot be read (it was read already, or never written).
    """
    settings = dict(public)
    if secrets_file:
        path = Path(secrets_file)
        settings.update(read_settings(path))
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return settings

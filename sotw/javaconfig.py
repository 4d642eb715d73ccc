"""The same client settings in the Java client's names: for Spark's Kafka connector and a team's Java jobs.

sotw's settings are librdkafka's (``--kafka-config``); Spark's connector (its ``kafka.``-prefixed options),
Kafka Streams and Flink take the Java client's. ``java_settings`` maps one to the other:

==========================================  ========================================================
librdkafka                                  Java client
==========================================  ========================================================
``security.protocol``                       ``security.protocol`` (upper case)
``sasl.mechanism`` / ``sasl.mechanisms``    ``sasl.mechanism``
``sasl.username`` + ``sasl.password``       ``sasl.jaas.config``: ``ScramLoginModule`` (SCRAM-SHA-256/512)
                                            or ``PlainLoginModule`` (PLAIN) ``required username=".."
                                            password="..";``
``ssl.ca.location``                         ``ssl.truststore.type=PEM``, ``ssl.truststore.location``
``ssl.ca.pem``                              ``ssl.truststore.type=PEM``, ``ssl.truststore.certificates``
``ssl.certificate.location`` +              ``ssl.keystore.type=PEM``; one file holding both:
``ssl.key.location``                        ``ssl.keystore.location``; two files: their PEM text as
                                            ``ssl.keystore.certificate.chain`` and ``ssl.keystore.key``
``ssl.certificate.pem`` + ``ssl.key.pem``   ``ssl.keystore.type=PEM``, ``ssl.keystore.certificate.chain``,
                                            ``ssl.keystore.key``
``ssl.keystore.location`` (PKCS#12)         ``ssl.keystore.type=PKCS12``, ``ssl.keystore.location``
``ssl.keystore.password``                   ``ssl.keystore.password``
``ssl.key.password``                        ``ssl.key.password``
``ssl.endpoint.identification.algorithm``   the same; ``none`` becomes the empty string
``client.id``, ``isolation.level``, ...     the same name (``PASS_THROUGH``)
==========================================  ========================================================

Kafka's PEM keystore takes PKCS#8 keys (KIP-651). Producer-only tuning (``linger.ms``, ``acks``, ...) has
no meaning for a consumer and is left out (``PRODUCER_ONLY``); any other setting has no Java equivalent here
and is refused by name (``JavaConfigError``), rather than dropped where it might matter.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

from sotw.errors import SotwError

#: Settings with the same name and meaning in both clients (consumer and common settings).
PASS_THROUGH = frozenset(
    {
        "client.id",
        "client.rack",
        "isolation.level",
        "request.timeout.ms",
        "session.timeout.ms",
        "heartbeat.interval.ms",
        "max.poll.interval.ms",
        "metadata.max.age.ms",
        "reconnect.backoff.ms",
        "reconnect.backoff.max.ms",
        "retry.backoff.ms",
        "fetch.min.bytes",
        "fetch.max.bytes",
        "max.partition.fetch.bytes",
        "socket.connection.setup.timeout.ms",
        "connections.max.idle.ms",
        "sasl.kerberos.service.name",
    }
)
#: librdkafka names whose Java name differs, with nothing else to it.
RENAMED = {"fetch.wait.max.ms": "fetch.max.wait.ms", "fetch.message.max.bytes": "max.partition.fetch.bytes"}
#: Producer-only tuning: a consumer (Spark's source, a job's reader) has no use for it.
PRODUCER_ONLY = frozenset(
    {
        "acks",
        "request.required.acks",
        "linger.ms",
        "queue.buffering.max.ms",
        "queue.buffering.max.messages",
        "queue.buffering.max.kbytes",
        "batch.num.messages",
        "batch.size",
        "compression.type",
        "compression.codec",
        "enable.idempotence",
        "message.send.max.retries",
        "retries",
        "delivery.timeout.ms",
        "message.timeout.ms",
        "sticky.partitioning.linger.ms",
        "partitioner",
    }
)
_LOGIN_MODULES = {
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
}
#: librdkafka settings the mapping reads itself (the rest are ``PASS_THROUGH``, ``RENAMED`` or refused).
_MAPPED = frozenset(
    {
        "security.protocol",
        "sasl.mechanism",
        "sasl.mechanisms",
        "sasl.username",
        "sasl.password",
        "ssl.ca.location",
        "ssl.ca.pem",
        "ssl.certificate.location",
        "ssl.key.location",
        "ssl.certificate.pem",
        "ssl.key.pem",
        "ssl.keystore.location",
        "ssl.keystore.password",
        "ssl.key.password",
        "ssl.endpoint.identification.algorithm",
    }
)


class JavaConfigError(SotwError):
    """A librdkafka setting with no Java client equivalent, or settings that do not make a Java login."""


def _jaas_quote(value: str) -> str:
    # A JAAS option value is a double-quoted string: a quote or backslash in it is escaped with a backslash.
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def java_settings(
    settings: Mapping[str, str], read: Callable[[Path], str] = Path.read_text
) -> dict[str, str]:
    """The Java client's settings for the librdkafka ``settings`` (the table in the module docstring).

    Parameters
    ----------
    settings
        librdkafka settings, as ``KafkaConfig.settings`` holds them (without ``bootstrap.servers``).
    read
        Reads a PEM file, for a certificate and key in two files (the Java client takes them as text then).

    Raises
    ------
    JavaConfigError
        Naming the first setting that has no Java equivalent, or what is missing for a login or a keystore.
    """
    given = {k.strip(): str(v).strip() for k, v in settings.items()}
    unknown = sorted(k for k in given if k not in _MAPPED | PASS_THROUGH | PRODUCER_ONLY and k not in RENAMED)
    if unknown:
        raise JavaConfigError(
            f"librdkafka setting {unknown[0]} has no Java client equivalent sotw knows (Spark's connector and "
            "Java jobs use the Java client): drop it, or give the job its Java settings itself "
            "(docs/own-pipeline.md lists the mapping)"
        )
    out: dict[str, str] = {}
    for key, value in given.items():
        if key in PASS_THROUGH:
            out[key] = value
        elif key in RENAMED:
            out[RENAMED[key]] = value
    if "security.protocol" in given:
        out["security.protocol"] = given["security.protocol"].upper()
    mechanism = (given.get("sasl.mechanism") or given.get("sasl.mechanisms") or "").upper()
    if mechanism:
        out["sasl.mechanism"] = mechanism
    out.update(_login(given, mechanism))
    out.update(_trust(given))
    out.update(_keystore(given, read))
    algorithm = given.get("ssl.endpoint.identification.algorithm")
    if algorithm is not None:
        out["ssl.endpoint.identification.algorithm"] = "" if algorithm.lower() == "none" else algorithm
    return out


def _login(given: Mapping[str, str], mechanism: str) -> dict[str, str]:
    user, password = given.get("sasl.username"), given.get("sasl.password")
    if user is None and password is None:
        return {}
    if user is None or password is None:
        missing = "sasl.username" if user is None else "sasl.password"
        raise JavaConfigError(
            f"sasl.username and sasl.password go together for a Java login: {missing} is missing"
        )
    module = _LOGIN_MODULES.get(mechanism or "GSSAPI")
    if module is None:
        raise JavaConfigError(
            f"sasl.mechanism {mechanism or 'GSSAPI (the default)'} has no username/password login in the Java "
            f"client sotw can write: use one of {', '.join(_LOGIN_MODULES)}"
        )
    return {
        "sasl.jaas.config": f"{module} required username={_jaas_quote(user)} password={_jaas_quote(password)};"
    }


def _trust(given: Mapping[str, str]) -> dict[str, str]:
    if "ssl.ca.location" in given and "ssl.ca.pem" in given:
        raise JavaConfigError("give ssl.ca.location or ssl.ca.pem, not both")
    if "ssl.ca.location" in given:
        return {"ssl.truststore.type": "PEM", "ssl.truststore.location": given["ssl.ca.location"]}
    if "ssl.ca.pem" in given:
        return {"ssl.truststore.type": "PEM", "ssl.truststore.certificates": given["ssl.ca.pem"]}
    return {}


def _keystore(given: Mapping[str, str], read: Callable[[Path], str]) -> dict[str, str]:
    out: dict[str, str] = {}
    if "ssl.key.password" in given:
        out["ssl.key.password"] = given["ssl.key.password"]
    if "ssl.keystore.location" in given:  # librdkafka's keystore is PKCS#12
        out["ssl.keystore.type"] = "PKCS12"
        out["ssl.keystore.location"] = given["ssl.keystore.location"]
        if "ssl.keystore.password" in given:
            out["ssl.keystore.password"] = given["ssl.keystore.password"]
        return out
    if "ssl.keystore.password" in given:
        raise JavaConfigError(
            "ssl.keystore.password without ssl.keystore.location: there is no keystore to open"
        )
    cert_file, key_file = given.get("ssl.certificate.location"), given.get("ssl.key.location")
    if cert_file and key_file and Path(cert_file) == Path(key_file):
        # One PEM file with the key and its chain is what the Java client's PEM keystore location reads.
        return {**out, "ssl.keystore.type": "PEM", "ssl.keystore.location": cert_file}
    cert = given.get("ssl.certificate.pem") or _pem(read, "ssl.certificate.location", cert_file)
    key = given.get("ssl.key.pem") or _pem(read, "ssl.key.location", key_file)
    if cert is None and key is None:
        return out
    if cert is None or key is None:
        raise JavaConfigError(
            "a client certificate and its key go together: give ssl.certificate.location and ssl.key.location "
            "(or their .pem forms)"
        )
    return {
        **out,
        "ssl.keystore.type": "PEM",
        "ssl.keystore.certificate.chain": cert,
        "ssl.keystore.key": key,
    }


def _pem(read: Callable[[Path], str], setting: str, location: str | None) -> str | None:
    if not location:
        return None
    try:
        return read(Path(location))
    except OSError as exc:
        raise JavaConfigError(f"{setting} {location}: cannot read it ({exc.strerror})") from None


def spark_options(
    settings: Mapping[str, str], read: Callable[[Path], str] = Path.read_text
) -> dict[str, str]:
    """Spark's Kafka connector options for the librdkafka ``settings``: the Java names, prefixed ``kafka.``."""
    return {f"kafka.{k}": v for k, v in java_settings(settings, read).items()}


def properties_text(settings: Mapping[str, str], heading: str = "") -> str:
    r"""``settings`` as a Java ``.properties`` file (``java.util.Properties.load`` reads it back).

    Backslashes and line breaks in a value (a PEM's text) are escaped, so every setting stays one line, and
    characters beyond ASCII are written as ``\\uXXXX`` (``Properties.load`` reads a stream as ISO 8859-1).
    """
    lines = [f"# {heading}"] if heading else []
    for key, value in settings.items():
        escaped = value.replace("\\", "\\\\").replace("\r", "\\r").replace("\n", "\\n")
        escaped = "".join(c if ord(c) < 0x7F else f"\\u{ord(c):04x}" for c in escaped)
        lines.append(f"{key}={escaped}")
    return "\n".join(lines) + "\n"


def options_json(options: Mapping[str, str]) -> str:
    """Spark options as a JSON object (``{spark_options}``): multi-line values (a PEM's text) stay whole."""
    return json.dumps(dict(options), indent=1, sort_keys=True) + "\n"

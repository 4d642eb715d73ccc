"""The producer paths: confluent-kafka's ``Producer`` behind ``DirectProducer``'s interface, and the choice of one.

The simulator's fast path (``simulator.rdkafka.DirectProducer``) drives confluent-kafka's librdkafka through
ctypes and numba. Where that cannot load, ``ClientProducer`` does the same job through confluent-kafka's
public API: every message is a Python call with a delivery callback of its own (a few times the CPU per
message), and the ledger is filled the same way: each report gives back the ledger row the message was
produced with, its offset and its error code.

``open_producer`` picks the path for ``SimulatorConfig.producer_path``: ``direct``, ``client``, or ``auto``
(direct where it loads, else the client with one warning saying why).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
from confluent_kafka import KafkaException, Producer

from simulator import rdkafka
from simulator.config import SimulatorError
from sotw.kafka import setting_text

log = logging.getLogger(__name__)

#: librdkafka's offset of a report that carries none (``RD_KAFKA_OFFSET_INVALID``).
NO_OFFSET = -1001
#: librdkafka's default of the settings ``rdkafka.check_ledger_settings`` reads.
_DEFAULTS = {"acks": "all", "delivery.report.only.error": "false"}
#: Other names librdkafka takes for them.
_ALIASES = {"acks": ("request.required.acks",)}


class MessageProducer(Protocol):
    """What the sender needs of a producer: topic handles, producing with a ledger row, reports as arrays."""

    def topic(self, name: str) -> int:
        """The handle of a topic, for ``produce`` and ``produce_run``."""

    def produce(self, topic: int, partition: int, value: bytes, key: bytes, row: int) -> int:
        """Queue one message; return 0, or librdkafka's error code (``QUEUE_FULL``: poll and try again)."""

    def produce_run(
        self, arrays: Sequence[np.ndarray], start: int, stop: int, stamp: float = 0.0
    ) -> tuple[int, int]:
        """Queue messages ``start:stop`` of a run; return where it stopped and the error there (0: none)."""

    def poll(self, timeout_s: float = 0.0) -> None:
        """Serve delivery reports; wait up to ``timeout_s`` for some."""

    def flush(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for every queued message to be reported; return how many are left."""

    def purge(self) -> None:
        """Drop what is queued and in flight: each such message gets a report with a purge error."""

    def __len__(self) -> int:
        """Messages queued or in flight, and reports not yet served."""

    def take(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The reports served since the last ``take``: ledger rows, offsets, error codes (0: delivered)."""

    def close(self) -> None:
        """Destroy the client; safe to call twice."""


class ClientProducer:
    """confluent-kafka's ``Producer`` with ``DirectProducer``'s interface (see the module docstring).

    Parameters
    ----------
    settings
        librdkafka settings, as confluent-kafka takes them.

    Raises
    ------
    SimulatorError
        If a setting is unknown or invalid, conflicts with another, or leaves the ledger without what it
        records (``acks=0``, ``delivery.report.only.error``); the message says which.
    """

    def __init__(self, settings: Mapping[str, Any]) -> None:
        conf = {key: setting_text(value) for key, value in settings.items()}

        def get(name: str) -> str:
            for key in (name, *_ALIASES.get(name, ())):
                if key in conf:
                    return conf[key]
            return _DEFAULTS[name]

        rdkafka.check_ledger_settings(get)
        try:
            self._producer: Producer | None = Producer(conf)
        except (KafkaException, ValueError, TypeError) as exc:
            reason = exc.args[0].str() if isinstance(exc, KafkaException) else str(exc)
            raise SimulatorError(f"bad producer settings: {reason}") from None
        self._names: list[str] = []
        self._handles: dict[str, int] = {}
        # One (row, offset, code) per report, appended whole: a Ctrl-C between three separate appends would
        # leave the lists out of step, and every later report acknowledging the wrong row.
        self._reports: list[tuple[int, int, int]] = []

    def _client(self) -> Producer:
        if self._producer is None:
            raise SimulatorError("the producer is closed")
        return self._producer

    def topic(self, name: str) -> int:
        """The handle of a topic: its index in the producer's list of topic names."""
        handle = self._handles.get(name)
        if handle is None:
            handle = self._handles[name] = len(self._names)
            self._names.append(name)
        return handle

    def _on_delivery(self, row: int, err: Any, msg: Any) -> None:
        if err is None:
            offset = msg.offset()
            report = (row, NO_OFFSET if offset is None or offset < 0 else offset, 0)
        else:
            report = (row, NO_OFFSET, int(err.code()))
        self._reports.append(report)

    def produce(self, topic: int, partition: int, value: bytes, key: bytes, row: int) -> int:
        """Queue one message; return 0, or librdkafka's error code (``QUEUE_FULL``: poll and try again)."""
        try:
            self._client().produce(
                self._names[topic],
                value,
                key,
                partition,
                on_delivery=functools.partial(self._on_delivery, row),
            )
        except BufferError:
            return rdkafka.QUEUE_FULL
        except KafkaException as exc:
            return int(exc.args[0].code())
        return 0

    def produce_run(
        self, arrays: Sequence[np.ndarray], start: int, stop: int, stamp: float = 0.0
    ) -> tuple[int, int]:
        """Queue messages ``start:stop`` of a run (``DirectProducer.produce_run``'s arrays, one Python call each).

        Each message's stamp is set before it is produced and put back to -1 if the client refuses it: a
        Ctrl-C landing between the two then leaves a row recorded as sent that never was (reported as not
        acknowledged), never a message on a topic without its row.
        """
        topics, partitions, text, bounds, keys, key_at, kidx, rows, stamps = arrays
        produce = self._client().produce
        deliver, names = self._on_delivery, self._names
        for i in range(start, stop):
            k = int(kidx[i])
            stamps[i] = stamp
            try:
                produce(
                    names[int(topics[i])],
                    text[bounds[i] : bounds[i + 1] - 1].tobytes(),
                    keys[key_at[k] : key_at[k + 1]].tobytes(),
                    int(partitions[i]),
                    on_delivery=functools.partial(deliver, int(rows[i])),
                )
            except BufferError:
                stamps[i] = -1.0
                return i, rdkafka.QUEUE_FULL
            except KafkaException as exc:
                stamps[i] = -1.0
                return i, int(exc.args[0].code())
        return stop, 0

    def poll(self, timeout_s: float = 0.0) -> None:
        """Serve delivery reports and client errors; wait up to ``timeout_s`` for some.

        A fatal error is not raised here: every later ``produce`` returns it, and the simulator makes a new
        producer (the direct path's librdkafka only logs it).
        """
        try:
            self._client().poll(timeout_s)
        except SystemError as exc:
            raise _interrupted(exc) from None
        except KafkaException as exc:
            if not exc.args[0].fatal():
                raise

    def flush(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for every queued message to be reported; return how many are left."""
        try:
            return int(self._client().flush(timeout_s))
        except SystemError as exc:
            raise _interrupted(exc) from None

    def purge(self) -> None:
        """Drop what is queued and in flight: each such message gets a report with a purge error."""
        self._client().purge(in_queue=True, in_flight=True)

    def __len__(self) -> int:
        """Messages queued or in flight, and reports not yet served."""
        return len(self._client())

    def take(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The reports served since the last ``take``: ledger rows, offsets, error codes (0: delivered)."""
        reports, self._reports = self._reports, []
        table = np.array(reports, dtype=np.int64).reshape(-1, 3)
        return table[:, 0].copy(), table[:, 1].copy(), table[:, 2].copy()

    def close(self) -> None:
        """Destroy the client (what is still queued is dropped: flush first). Safe to call twice."""
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.close()


def _interrupted(exc: SystemError) -> BaseException:
    """What a ``SystemError`` out of confluent-kafka's poll or flush was: an interrupted delivery callback.

    A Ctrl-C that lands as a Python delivery callback starts is raised there, before any code of the
    callback can catch it; confluent-kafka then drops the exception and its ``poll`` returns NULL with none
    set, which Python reports as ``SystemError``. The report that callback carried is lost, so its ledger row
    stays unacknowledged (the message itself was sent and has its row): the price of the client path, whose
    reports are Python calls; the direct path's are not.
    """
    if "without setting an exception" in str(exc):
        return KeyboardInterrupt()
    return exc


def open_producer(path: str, settings: Mapping[str, Any]) -> tuple[MessageProducer, str]:
    """A producer for ``path`` (``auto``, ``direct`` or ``client``) and the path it is: ``direct`` or ``client``.

    ``auto`` takes the direct path where it loads, and otherwise the client with one warning saying why.

    Raises
    ------
    SimulatorError
        If ``direct`` is asked for where it cannot load, or a setting is refused.
    """
    if path == "client":
        return ClientProducer(settings), "client"
    reason = rdkafka.unavailable()
    if reason is None:
        return rdkafka.DirectProducer(settings), "direct"
    if path == "direct":
        raise SimulatorError(
            f"the direct producer path cannot load here: {reason}; use --producer-path client or auto"
        )
    log.warning(
        "producing through confluent-kafka's Producer, at a higher CPU cost per message: the direct path "
        "cannot load here (%s); --producer-path client chooses it without this warning",
        reason,
    )
    return ClientProducer(settings), "client"

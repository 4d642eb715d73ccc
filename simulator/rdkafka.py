"""The simulator's fast producer path: the librdkafka that confluent-kafka loads, without its per-message objects.

Through confluent-kafka's ``Producer``, a message costs the calling thread about 1 us before the simulator
has done anything of its own: argument parsing, a look-up of the topic by name, and, for its delivery report,
a ``Message`` object (key and value copied) passed to a Python callback. At the simulator's full speed that
is more than half of its loop thread. ``DirectProducer`` configures the same library (confluent-kafka's own
copy, found through its ``cimpl`` module, so settings, versions and behaviour are the same) with the same
settings, and:

- produces a run's messages in one compiled call (``produce_run``) straight from the buffer the encoder
  wrote them into, with topic handles made once per topic;
- takes every delivery report in a compiled callback that writes three integers (the ledger row given when
  the message was produced, the offset and the error code) into a log the simulator reads after each
  ``poll`` (``take``): no Python runs per report.

The log holds as many reports as the producer can have messages queued (``queue.buffering.max.messages``,
24 bytes each: librdkafka itself keeps a few hundred bytes per queued message), and it is emptied before
every call that serves reports, so no report can miss its place. Errors of the client (a broker down, say)
are logged by librdkafka itself, on stderr: no Python runs inside librdkafka's calls.

Where this path cannot load (``unavailable`` says why: another platform, a confluent-kafka build without
librdkafka's symbols), ``simulator.client.ClientProducer`` does the same job through confluent-kafka's
``Producer``, at a higher cost per message.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from confluent_kafka import KafkaError
from llvmlite import binding
from numba import carray, cfunc, types

from simulator.config import SimulatorError
from simulator.native import addr, jit, ptr
from sotw.kafka import setting_text

#: librdkafka's error code for a full local queue (``RD_KAFKA_RESP_ERR__QUEUE_FULL``).
QUEUE_FULL = -184
#: ... for a message larger than ``message.max.bytes`` (``RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE``).
MSG_SIZE_TOO_LARGE = 10
#: ... for a topic, or a partition, the cluster says does not exist (``RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC``,
#: ``RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION``): deleted, or gone with a broker's data.
UNKNOWN_TOPIC, UNKNOWN_PARTITION = -188, -190
#: ... once the idempotent producer met an error it cannot recover from (``RD_KAFKA_RESP_ERR__FATAL``): its
#: sequence numbers out of step with a partition's new leader after an unclean leader election, say. Every
#: later message is refused with it; librdkafka's documentation says to make a new producer.
FATAL = -150
_PRODUCER = 0  # RD_KAFKA_PRODUCER
_MSG_F_COPY = 2  # RD_KAFKA_MSG_F_COPY: librdkafka copies the payload, the buffer may be reused at once
_PURGE_QUEUE, _PURGE_INFLIGHT = 1, 2

_P = ctypes.c_void_p


@functools.cache
def _library() -> ctypes.CDLL:
    """confluent-kafka's librdkafka, with the prototypes this module calls through ctypes."""
    import confluent_kafka.cimpl

    # dlsym on cimpl's handle also searches the libraries it was linked with: its librdkafka.
    lib = ctypes.CDLL(confluent_kafka.cimpl.__file__)
    signatures: dict[str, tuple[Any, list[Any]]] = {
        "rd_kafka_conf_new": (_P, []),
        "rd_kafka_conf_destroy": (None, [_P]),
        "rd_kafka_conf_set": (
            ctypes.c_int,
            [_P, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t],
        ),
        "rd_kafka_conf_get": (
            ctypes.c_int,
            [_P, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)],
        ),
        "rd_kafka_conf_set_dr_msg_cb": (None, [_P, _P]),
        "rd_kafka_conf_set_opaque": (None, [_P, _P]),
        "rd_kafka_new": (_P, [ctypes.c_int, _P, ctypes.c_char_p, ctypes.c_size_t]),
        "rd_kafka_destroy": (None, [_P]),
        "rd_kafka_topic_new": (_P, [_P, ctypes.c_char_p, _P]),
        "rd_kafka_topic_destroy": (None, [_P]),
        "rd_kafka_produce": (
            ctypes.c_int,
            [
                _P,
                ctypes.c_int32,
                ctypes.c_int,
                ctypes.c_char_p,
                ctypes.c_size_t,
                ctypes.c_char_p,
                ctypes.c_size_t,
                _P,
            ],
        ),
        "rd_kafka_last_error": (ctypes.c_int, []),
        "rd_kafka_poll": (ctypes.c_int, [_P, ctypes.c_int]),
        "rd_kafka_flush": (ctypes.c_int, [_P, ctypes.c_int]),
        "rd_kafka_purge": (ctypes.c_int, [_P, ctypes.c_int]),
        "rd_kafka_outq_len": (ctypes.c_int, [_P]),
    }
    try:
        for name, (restype, argtypes) in signatures.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
    except AttributeError as exc:  # a build that hides librdkafka's symbols
        raise SimulatorError(
            f"confluent-kafka {confluent_kafka.cimpl.version()[0]} does not expose librdkafka's C API ({exc})"
        ) from None
    for name in ("rd_kafka_produce", "rd_kafka_last_error"):
        binding.add_symbol(name, ctypes.cast(getattr(lib, name), ctypes.c_void_p).value)
    return lib


@functools.cache
def error_text(code: int) -> str:
    """The text librdkafka gives an error code (``rd_kafka_err2str``, through confluent-kafka's ``KafkaError``)."""
    return str(KafkaError(code).str())


_produce = types.ExternalFunction(
    "rd_kafka_produce",
    types.int32(
        types.voidptr,
        types.int32,
        types.int32,
        types.voidptr,
        types.uintp,
        types.voidptr,
        types.uintp,
        types.voidptr,
    ),
)
_last_error = types.ExternalFunction("rd_kafka_last_error", types.int32())

# The report log's header: reports written, capacity, reports that found no room (never expected), and the
# address of the (3, capacity) int64 log of row, offset and error code.
_COUNT, _CAP, _LOST, _LOG = range(4)


def _on_report(rk: Any, message: Any, opaque: Any) -> None:
    """The delivery report callback: append (row, offset, error) to the log ``opaque`` points to.

    ``rd_kafka_message_t``: ``err`` (int32) at byte 0, ``offset`` (int64) at 56, ``_private`` (the opaque
    given to ``rd_kafka_produce``: the ledger row) at 64.
    """
    head = carray(opaque, 4, dtype=np.int64)
    n, cap = head[_COUNT], head[_CAP]
    if n >= cap:
        head[_LOST] += 1
        return
    fields = carray(message, 9, dtype=np.int64)
    entries = carray(ptr(head[_LOG]), 3 * cap, dtype=np.int64)
    entries[n] = fields[8]
    entries[cap + n] = fields[7]
    entries[2 * cap + n] = carray(message, 1, dtype=np.int32)[0]
    head[_COUNT] = n + 1


@functools.cache
def _report_callback() -> Any:
    """The compiled delivery report callback (compiled, or loaded from numba's cache, once per process).

    Cached, so the ``CFunc`` (and the code its address points to) lives as long as the process.
    """
    signature = types.void(types.voidptr, types.voidptr, types.voidptr)
    try:
        return cfunc(signature, cache=True, nopython=True)(_on_report)
    except RuntimeError:  # nowhere to cache (see simulator.native)
        return cfunc(signature, nopython=True)(_on_report)


@jit
def _produce_run(
    topics: Any,
    partitions: Any,
    text: Any,
    bounds: Any,
    keys: Any,
    key_at: Any,
    kidx: Any,
    rows: Any,
    stamps: Any,
    start: int,
    stop: int,
    stamp: float,
) -> tuple[int, int]:
    """Produce messages ``start:stop``; return where it stopped and librdkafka's error there (0: all went).

    Message ``i`` is ``text[bounds[i]:bounds[i + 1] - 1]`` (a newline ends each), for the topic handle
    ``topics[i]`` and partition ``partitions[i]``, keyed by key ``kidx[i]`` of ``keys`` (``key_at`` bounds
    them), with ledger row ``rows[i]`` as its opaque. Each message queued gets ``stamps[i] = stamp`` here,
    in compiled code, so that what was produced is known even if a Ctrl-C lands as this returns.
    """
    for i in range(start, stop):
        k = kidx[i]
        r = _produce(
            ptr(topics[i]),
            partitions[i],
            _MSG_F_COPY,
            addr(text, bounds[i]),
            bounds[i + 1] - 1 - bounds[i],
            addr(keys, key_at[k]),
            key_at[k + 1] - key_at[k],
            ptr(rows[i]),
        )
        if r != 0:
            return i, _last_error()
        stamps[i] = stamp
    return stop, 0


def _compile_kernel() -> None:
    """Compile ``_produce_run`` (or load it from numba's cache) by running it on nothing."""
    _library()  # first: the kernel links against the librdkafka symbols it registers
    ints, buf = np.zeros(1, np.int64), np.zeros(1, np.uint8)
    _produce_run(ints, ints.astype(np.int32), buf, ints, buf, ints, ints, ints, np.zeros(1), 0, 0, 0.0)


@functools.cache
def unavailable() -> str | None:
    """Why ``DirectProducer`` cannot work in this process, or None when it can.

    It needs librdkafka's C API from confluent-kafka's own copy (a build that links it as a shared library
    and exports its symbols) and numba to compile the produce kernel and the report callback against it.
    """
    try:
        _library()
        _report_callback()
        _compile_kernel()
    except Exception as exc:  # whatever stops this path, confluent-kafka's Producer may still work
        return str(exc) or type(exc).__name__
    return None


def check_ledger_settings(get: Callable[[str], str]) -> None:
    """Refuse settings librdkafka takes but the ledger cannot work with; ``get`` gives a setting's value.

    ``acks=0`` gives no offsets, and ``delivery.report.only.error`` reports no deliveries.
    """
    if get("acks") == "0":
        raise SimulatorError("bad producer setting: acks=0 gives no offsets for the ledger; use 1 or all")
    if get("delivery.report.only.error") == "true":
        raise SimulatorError(
            "bad producer setting: delivery.report.only.error=true reports no deliveries to the ledger"
        )


_NO_REPORTS = np.zeros((3, 0), dtype=np.int64)
_NO_REPORTS.flags.writeable = False

#: The most messages the producer may queue (``queue.buffering.max.messages``): the report log is sized
#: from it, 24 bytes a message, so 10,000,000 is 240 MB.
MAX_QUEUED = 10_000_000


class DirectProducer:
    """A librdkafka producer whose delivery reports are read in bulk (``take``), with the ledger row as key.

    Parameters
    ----------
    settings
        librdkafka settings, as confluent-kafka takes them (``sotw.kafka.setting_text`` makes them text).

    Raises
    ------
    SimulatorError
        If a setting is unknown or invalid, conflicts with another, or leaves the ledger without what it
        records (``acks=0``: no offsets; ``delivery.report.only.error``: no reports of deliveries; no bound
        on the queue: no bound on the report log); the message says which.
    """

    def __init__(self, settings: Mapping[str, Any]) -> None:
        lib = self._lib = _library()
        self._rk = 0
        self._topics: dict[str, int] = {}
        self._taken: list[np.ndarray] = []
        self._errstr = ctypes.create_string_buffer(512)  # librdkafka's error text, when a call fails
        # The report log and its header (``_configure`` sizes them from the queue's limit).
        self._log = np.zeros((3, 0), dtype=np.int64)
        self._head = np.zeros(4, dtype=np.int64)
        # Compile the kernel (or load it from numba's cache) now, not in the run's first slice, and before
        # there is a client to leak if that fails.
        _compile_kernel()
        conf = lib.rd_kafka_conf_new()
        try:
            self._configure(conf, settings)
        except BaseException:
            lib.rd_kafka_conf_destroy(conf)
            raise
        # Outside the ``try``: once ``rd_kafka_new`` has run, the conf may be librdkafka's (freed by it), and a
        # Ctrl-C landing as it returns must not free it again.
        rk = lib.rd_kafka_new(_PRODUCER, conf, self._errstr, len(self._errstr))
        if not rk:  # the conf is still ours: librdkafka takes it only when it succeeds
            lib.rd_kafka_conf_destroy(conf)
            raise SimulatorError(f"bad producer settings: {self._errstr.value.decode(errors='replace')}")
        self._rk = rk

    def _configure(self, conf: int, settings: Mapping[str, Any]) -> None:
        lib, errstr = self._lib, self._errstr
        for key, value in settings.items():
            if lib.rd_kafka_conf_set(conf, key.encode(), setting_text(value).encode(), errstr, len(errstr)):
                raise SimulatorError(f"bad producer setting: {errstr.value.decode(errors='replace')}")

        def get(name: str) -> str:
            size = ctypes.c_size_t(64)
            found = ctypes.create_string_buffer(64)
            lib.rd_kafka_conf_get(conf, name.encode(), found, ctypes.byref(size))
            return found.value.decode()

        limit = int(get("queue.buffering.max.messages"))
        if not 0 < limit <= MAX_QUEUED:
            raise SimulatorError(
                f"bad producer setting: queue.buffering.max.messages must be 1 to {MAX_QUEUED:,} for the "
                f"simulator (its delivery report log is sized from it), not {limit}"
            )
        check_ledger_settings(get)
        cap = limit + 1024
        self._log = np.zeros((3, cap), dtype=np.int64)
        self._head = np.array([0, cap, 0, self._log.ctypes.data], dtype=np.int64)
        lib.rd_kafka_conf_set_dr_msg_cb(conf, _report_callback().address)
        lib.rd_kafka_conf_set_opaque(conf, self._head.ctypes.data)
        # No error callback: librdkafka then logs client errors itself (``%3|...|ERROR|...`` on stderr). A
        # Python callback would run inside ``rd_kafka_poll``, and a Ctrl-C arriving meanwhile is raised as it
        # starts, where ctypes prints it and drops it: 14 of 20 Ctrl-C were lost so with the broker down.

    def _handle(self) -> int:
        if not self._rk:
            raise SimulatorError("the producer is closed")
        return self._rk

    def topic(self, name: str) -> int:
        """The handle of a topic (made on first use), for ``produce`` and ``produce_run``."""
        handle = self._topics.get(name)
        if handle is None:
            handle = self._lib.rd_kafka_topic_new(self._handle(), name.encode(), None)
            if not handle:
                raise SimulatorError(
                    f"cannot produce to topic {name!r}: {error_text(self._lib.rd_kafka_last_error())}"
                )
            self._topics[name] = handle
        return handle

    def produce(self, topic: int, partition: int, value: bytes, key: bytes, row: int) -> int:
        """Queue one message; return 0, or librdkafka's error code (``QUEUE_FULL``: poll and try again)."""
        self._handle()
        lib = self._lib
        if lib.rd_kafka_produce(topic, partition, _MSG_F_COPY, value, len(value), key, len(key), row) == 0:
            return 0
        return int(lib.rd_kafka_last_error())

    def produce_run(
        self, arrays: Sequence[np.ndarray], start: int, stop: int, stamp: float = 0.0
    ) -> tuple[int, int]:
        """Queue messages ``start:stop`` of a run; return where it stopped and librdkafka's error there (0: none).

        ``arrays`` are ``_produce_run``'s, per message: topic handles, partitions, text, bounds, keys, key
        bounds, key index, ledger row, and the stamps it sets to ``stamp`` for each message queued.
        """
        self._handle()
        done, err = _produce_run(*arrays, start, stop, stamp)
        return int(done), int(err)

    def poll(self, timeout_s: float = 0.0) -> None:
        """Serve delivery reports (into the log) and client errors; wait up to ``timeout_s`` for some."""
        rk = self._handle()
        self._stash()
        self._lib.rd_kafka_poll(rk, int(timeout_s * 1000))

    def flush(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for every queued message to be reported; return how many are left."""
        rk = self._handle()
        self._stash()
        self._lib.rd_kafka_flush(rk, int(timeout_s * 1000))
        return len(self)

    def purge(self) -> None:
        """Drop what is queued and in flight: each such message gets a report with a purge error."""
        self._lib.rd_kafka_purge(self._handle(), _PURGE_QUEUE | _PURGE_INFLIGHT)

    def __len__(self) -> int:
        """Messages queued or in flight, and reports not yet served."""
        return int(self._lib.rd_kafka_outq_len(self._handle()))

    def take(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The reports served since the last ``take``: ledger rows, offsets, error codes (0: delivered)."""
        self._stash()
        taken = self._taken
        if not taken:
            out = _NO_REPORTS
        elif len(taken) == 1:
            out = taken[0]
        else:
            out = np.concatenate(taken, axis=1)
        taken.clear()
        return out[0], out[1], out[2]

    def _stash(self) -> None:
        """Empty the log before librdkafka may write to it: it has room for every queued message's report."""
        head = self._head
        if head[_LOST]:  # cannot happen while the queue's limit sizes the log; said loudly if it ever does
            raise SimulatorError(f"{head[_LOST]} delivery reports found the report log full")
        n = int(head[_COUNT])
        if n:
            self._taken.append(self._log[:, :n].copy())
            head[_COUNT] = 0

    def close(self) -> None:
        """Destroy the client (what is still queued is dropped: flush first). Safe to call twice."""
        rk, self._rk = self._rk, 0
        topics, self._topics = self._topics, {}
        if not rk:
            return
        for handle in topics.values():
            self._lib.rd_kafka_topic_destroy(handle)
        self._lib.rd_kafka_destroy(rk)

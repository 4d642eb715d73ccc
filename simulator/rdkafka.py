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
  the message was produced, the offset and the error code) into a log the simulator reads when it likes
  (``take``): no Python runs per report;
- has librdkafka's own background thread serve the reports (the client's main queue is forwarded to its
  background queue), so the callback, and freeing each delivered message, run beside the simulator's loop
  rather than in it: at full speed that was about a quarter of the loop thread's time per message, and a
  loop that shares two cores with the broker publishes at the pace of its own thread.

The callback and ``take`` share the log under a mutex. The log holds as many reports as the producer can
have messages queued (``queue.buffering.max.messages``, 24 bytes each: librdkafka itself keeps a few hundred
bytes per queued message) plus what may be produced between two readings (``produce_run`` reads it every
``STASH_EVERY`` messages), so no report can miss its place. Errors of the client (a broker down, say) are
logged by librdkafka itself, on stderr: no Python runs inside librdkafka's calls, on any thread.

Where this path cannot load (``unavailable`` says why: another platform, a confluent-kafka build without
librdkafka's symbols), ``simulator.client.ClientProducer`` does the same job through confluent-kafka's
``Producer``, at a higher cost per message.
"""

from __future__ import annotations

import ctypes
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from confluent_kafka import KafkaError
from llvmlite import binding
from numba import carray, cfunc, types

from simulator.config import SimulatorError
from simulator.interrupts import held_interrupts
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
        "rd_kafka_queue_get_main": (_P, [_P]),
        "rd_kafka_queue_get_background": (_P, [_P]),
        "rd_kafka_queue_forward": (None, [_P, _P]),
        "rd_kafka_queue_destroy": (None, [_P]),
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
    threads = _threads()
    for name in ("pthread_mutex_lock", "pthread_mutex_unlock"):
        binding.add_symbol(name, ctypes.cast(getattr(threads, name), ctypes.c_void_p).value)
    return lib


@functools.cache
def _threads() -> ctypes.CDLL:
    """The C library's POSIX mutex, which the report callback and ``take`` share the report log under."""
    threads = ctypes.CDLL(None)  # the process's own symbols: libc (libpthread before glibc 2.34)
    for name in ("pthread_mutex_init", "pthread_mutex_destroy", "pthread_mutex_lock", "pthread_mutex_unlock"):
        getattr(threads, name).restype = ctypes.c_int
    threads.pthread_mutex_init.argtypes = [_P, _P]
    for name in ("pthread_mutex_destroy", "pthread_mutex_lock", "pthread_mutex_unlock"):
        getattr(threads, name).argtypes = [_P]
    return threads


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
_lock = types.ExternalFunction("pthread_mutex_lock", types.int32(types.voidptr))
_unlock = types.ExternalFunction("pthread_mutex_unlock", types.int32(types.voidptr))

# The report log's header: reports written, capacity, reports that found no room (never expected), the
# address of the (3, capacity) int64 log of row, offset and error code, and the address of its mutex.
_COUNT, _CAP, _LOST, _LOG, _MUTEX = range(5)
#: Room for a ``pthread_mutex_t`` (40 bytes with glibc, 64 on macOS).
_MUTEX_BYTES = 128
#: ``DirectProducer`` reads the report log at least every this many messages it produces, so that the log has
#: room for every report however seldom its caller takes them (see ``DirectProducer._stash``).
STASH_EVERY = 4096


def _on_report(rk: Any, message: Any, opaque: Any) -> None:
    """The delivery report callback: append (row, offset, error) to the log ``opaque`` points to.

    ``rd_kafka_message_t``: ``err`` (int32) at byte 0, ``offset`` (int64) at 56, ``_private`` (the opaque
    given to ``rd_kafka_produce``: the ledger row) at 64. It runs on librdkafka's background thread (or in
    ``flush``, on the caller's), while the loop may be taking the log: both hold the log's mutex.
    """
    head = carray(opaque, 5, dtype=np.int64)
    mutex = ptr(head[_MUTEX])
    _lock(mutex)
    n, cap = head[_COUNT], head[_CAP]
    if n < cap:
        fields = carray(message, 9, dtype=np.int64)
        entries = carray(ptr(head[_LOG]), 3 * cap, dtype=np.int64)
        entries[n] = fields[8]
        entries[cap + n] = fields[7]
        entries[2 * cap + n] = carray(message, 1, dtype=np.int32)[0]
        head[_COUNT] = n + 1
    else:
        head[_LOST] += 1
    _unlock(mutex)


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


@jit
def _take_log(head: Any, log: Any) -> Any:
    """The reports in the log, as a (3, n) array of rows, offsets and error codes; the log is left empty.

    Under the log's mutex, which the report callback holds while it appends.
    """
    mutex = ptr(head[_MUTEX])
    _lock(mutex)
    n = head[_COUNT]
    out = np.empty((3, n), dtype=np.int64)
    for k in range(3):
        out[k, :] = log[k, :n]
    head[_COUNT] = 0
    _unlock(mutex)
    return out


def _compile_kernel() -> None:
    """Compile ``_produce_run`` and ``_take_log`` (or load them from numba's cache) by running them on nothing."""
    _library()  # first: the kernels link against the librdkafka and mutex symbols it registers
    ints, buf = np.zeros(1, np.int64), np.zeros(1, np.uint8)
    _produce_run(ints, ints.astype(np.int32), buf, ints, buf, ints, ints, ints, np.zeros(1), 0, 0, 0.0)
    mutex = np.zeros(_MUTEX_BYTES, dtype=np.uint8)
    _threads().pthread_mutex_init(mutex.ctypes.data, None)
    head = np.array([0, 1, 0, 0, mutex.ctypes.data], dtype=np.int64)
    _take_log(head, np.zeros((3, 1), dtype=np.int64))
    _threads().pthread_mutex_destroy(mutex.ctypes.data)


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
        # The report log, its mutex and its header (``_configure`` sizes the log from the queue's limit).
        self._log = np.zeros((3, 0), dtype=np.int64)
        self._mutex = np.zeros(_MUTEX_BYTES, dtype=np.uint8)
        self._head = np.zeros(5, dtype=np.int64)
        self._produced = 0  # messages produced since the log was last read
        # The client's main queue and its background queue, forwarded to it (0: the caller's ``poll`` serves).
        self._main_queue = self._background_queue = 0
        # Compile the kernels (or load them from numba's cache) now, not in the run's first slice, and before
        # there is a client to leak if that fails.
        _compile_kernel()
        _threads().pthread_mutex_init(self._mutex.ctypes.data, None)
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
        self._serve_in_background()

    def _serve_in_background(self) -> None:
        """Have librdkafka's background thread serve the reports: forward the main queue to its queue.

        That thread then calls the report callback and frees each delivered message, as ``rd_kafka_poll``
        would on the caller's thread; ops that are not reports are served as ``poll`` serves them. Where the
        thread cannot be started, ``poll`` serves the main queue on the caller's thread, as before.
        """
        lib = self._lib
        self._main_queue = lib.rd_kafka_queue_get_main(self._rk) or 0
        self._background_queue = lib.rd_kafka_queue_get_background(self._rk) or 0
        if self._main_queue and self._background_queue:
            lib.rd_kafka_queue_forward(self._main_queue, self._background_queue)

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
        # Every queued message's report, and those of the messages produced before the log is next read.
        cap = limit + 2 * STASH_EVERY + 1024
        self._log = np.zeros((3, cap), dtype=np.int64)
        self._head = np.array([0, cap, 0, self._log.ctypes.data, self._mutex.ctypes.data], dtype=np.int64)
        lib.rd_kafka_conf_set_dr_msg_cb(conf, _report_callback().address)
        lib.rd_kafka_conf_set_opaque(conf, self._head.ctypes.data)
        # No error callback: librdkafka then logs client errors itself (``%3|...|ERROR|...`` on stderr). A
        # Python callback would run inside ``rd_kafka_poll``, and a Ctrl-C arriving meanwhile is raised as it
        # starts, where ctypes prints it and drops it: 14 of 20 Ctrl-C were lost so with the broker down.

    def _handle(self) -> int:
        if not self._rk:
            raise SimulatorError("the producer is closed")
        return self._rk

    @property
    def serves_in_background(self) -> bool:
        """Whether librdkafka's background thread serves the reports (else ``poll`` does)."""
        return bool(self._background_queue)

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
        if self._produced >= STASH_EVERY:
            self._stash()
        lib = self._lib
        if lib.rd_kafka_produce(topic, partition, _MSG_F_COPY, value, len(value), key, len(key), row) == 0:
            self._produced += 1
            return 0
        return int(lib.rd_kafka_last_error())

    def produce_run(
        self, arrays: Sequence[np.ndarray], start: int, stop: int, stamp: float = 0.0
    ) -> tuple[int, int]:
        """Queue messages ``start:stop`` of a run; return where it stopped and librdkafka's error there (0: none).

        ``arrays`` are ``_produce_run``'s, per message: topic handles, partitions, text, bounds, keys, key
        bounds, key index, ledger row, and the stamps it sets to ``stamp`` for each message queued. It may
        stop early without an error (at most ``STASH_EVERY`` messages a call): call it again from there.
        """
        self._handle()
        if self._produced >= STASH_EVERY:
            self._stash()
        done, err = _produce_run(*arrays, start, min(stop, start + STASH_EVERY), stamp)
        self._produced += done - start
        return int(done), int(err)

    def poll(self, timeout_s: float = 0.0) -> None:
        """Serve delivery reports (into the log) and client errors; wait up to ``timeout_s`` for some.

        With the background thread serving, reports arrive by themselves: this only waits, until some are
        in the log or the time is up.
        """
        rk = self._handle()
        if not self._background_queue:
            self._stash()
            self._lib.rd_kafka_poll(rk, int(timeout_s * 1000))
            return
        deadline = time.monotonic() + timeout_s
        while not self._head[_COUNT] and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.001))

    def flush(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for every queued message to be reported; return how many are left."""
        rk = self._handle()
        self._stash()
        # Expedites the last batches (linger.ms no longer waited for) and serves reports on this thread too.
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
        """Move the log's reports aside, leaving it empty: it has room for every report up to the next read.

        The log holds what the queue may hold plus ``2 * STASH_EVERY``: after a read, the reports to come are
        those of the messages queued then and of those produced since, and produce calls read it again once
        ``STASH_EVERY`` were produced.
        """
        head = self._head
        if head[_LOST]:  # cannot happen while the queue's limit sizes the log; said loudly if it ever does
            raise SimulatorError(f"{head[_LOST]} delivery reports found the report log full")
        self._produced = 0
        if head[_COUNT]:  # a hint read without the mutex: ``_take_log`` reads it again under it
            with held_interrupts():  # taken out of the log, the reports must reach ``_taken``
                taken = _take_log(head, self._log)
                if taken.shape[1]:
                    self._taken.append(taken)

    def close(self) -> None:
        """Destroy the client (what is still queued is dropped: flush first). Safe to call twice."""
        rk, self._rk = self._rk, 0
        topics, self._topics = self._topics, {}
        if not rk:
            return
        lib = self._lib
        main, background, self._main_queue, self._background_queue = (
            self._main_queue,
            self._background_queue,
            0,
            0,
        )
        if main and background:
            lib.rd_kafka_queue_forward(main, None)
        for queue in (main, background):
            if queue:  # librdkafka asks that no queue handle outlives the client
                lib.rd_kafka_queue_destroy(queue)
        for handle in topics.values():
            lib.rd_kafka_topic_destroy(handle)
        # Joins the background thread: no callback writes to the log after this.
        lib.rd_kafka_destroy(rk)
        _threads().pthread_mutex_destroy(self._mutex.ctypes.data)

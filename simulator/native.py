"""Compiled table updates, encoding and hashing: the part of the hot path Python cannot make cheap.

At full speed the simulator's loop thread is what limits it. Per message it used to spend about 0.4 us on
``bytes %`` formatting and numpy glue, 0.25 us on the tables' numpy updates and 0.5 us on
``hashlib.sha256``, most of which is the call itself, not the hashing. Here, compiled with numba:

- ``update_run`` applies a block's updates to the tables, one message after the other;
- ``RunEncoder`` writes every message of a run into one buffer, the same bytes as
  ``sotw.wire.encode_update``;
- ``Values`` hashes a run's values with libcrypto's SHA-256 when the ledger's writer thread asks, letting go
  of the GIL meanwhile. The libcrypto is the one this Python's ``hashlib`` uses, found through its
  ``_hashlib`` module, so the digests are the ones ``hashlib`` gives.

The encoder writes a float only when it can prove the text is the one ``orjson`` (and so ``encode_row``)
writes: a value that is exactly the nearest double to a number of thousandths below 1e9 in magnitude, which
is what ``simulator.model.milli`` makes. Anything else (a row that walked past 1e9) makes it decline, and
the caller encodes that run in Python; so does a Python whose libcrypto cannot be found (``AVAILABLE``).

numba caches the compiled code beside this module (``__pycache__``) or, when that is not writable, in the
user's cache folder; with neither, each process compiles it (1-2 s). ``RunEncoder.warm_up`` and
``TableStore.warm_up`` do that before a run's schedule starts.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from llvmlite import binding
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from sotw import wire

log = logging.getLogger(__name__)

# Instructions of a row template program: (opcode, a, b).
_LIT = 0  # copy lit[a:a + b]
_ID = 1  # the row's id
_NUM = 2  # numeric column a of the row's values
_STATUS = 3  # the row's status, as JSON


def _link() -> bool:
    """Make libc's memcpy and libcrypto's SHA256_* callable from compiled code; False if one is missing."""
    try:
        import _hashlib

        # dlsym on _hashlib's handle also searches the libraries it was linked with: its libcrypto.
        crypto = ctypes.CDLL(_hashlib.__file__)
        found = [(ctypes.CDLL(None), "memcpy")]
        found += [(crypto, name) for name in ("SHA256_Init", "SHA256_Update", "SHA256_Final")]
        for lib, name in found:
            binding.add_symbol(name, ctypes.cast(getattr(lib, name), ctypes.c_void_p).value)
    except (ImportError, AttributeError, OSError, TypeError) as exc:  # no OpenSSL, a built-in _hashlib...
        log.info("libcrypto's SHA-256 not found (%s): the simulator encodes and hashes in Python", exc)
        return False
    return True


def jit(fn: Any) -> Any:
    """``numba.njit(nogil=True)``, cached on disk when numba finds somewhere to write (see above)."""
    try:
        return njit(cache=True, nogil=True)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available": a read-only install, no home
        return njit(nogil=True)(fn)


AVAILABLE = _link()

_memcpy = types.ExternalFunction("memcpy", types.voidptr(types.voidptr, types.voidptr, types.uintp))
_sha_init = types.ExternalFunction("SHA256_Init", types.int32(types.voidptr))
_sha_update = types.ExternalFunction("SHA256_Update", types.int32(types.voidptr, types.voidptr, types.uintp))
_sha_final = types.ExternalFunction("SHA256_Final", types.int32(types.voidptr, types.voidptr))


@intrinsic
def addr(typingctx: Any, arr: Any, off: Any) -> Any:
    """Pointer to item ``off`` of a 1-D contiguous array."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        a = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.bitcast(builder.gep(a.data, [args[1]]), cgutils.voidptr_t)

    return types.voidptr(arr, off), codegen


@intrinsic
def ptr(typingctx: Any, value: Any) -> Any:
    """An integer address as a ``void *``."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(value), codegen


@jit
def _put(out: Any, pos: int, src: Any, start: int, n: int) -> int:
    # memcpy, not a loop over the bytes: the loop made the kernel's formatting cost 0.41 us a message, not 0.15.
    _memcpy(addr(out, pos), addr(src, start), n)
    return pos + n


@jit
def _put_int(out: Any, pos: int, v: int) -> int:
    if v < 0:
        out[pos] = 45  # '-'
        pos += 1
        v = -v
    n = 1
    t = v
    while t >= 10:
        t //= 10
        n += 1
    for i in range(n - 1, -1, -1):
        out[pos + i] = 48 + v % 10
        v //= 10
    return pos + n


@jit
def _put_milli(out: Any, pos: int, x: float) -> int:
    """Write ``x`` as orjson does, or return -1 if it is not a whole number of thousandths below 1e9."""
    if not (-1e9 < x < 1e9):
        return -1
    k = int(np.rint(x * 1000.0))
    if k / 1000.0 != x:
        return -1
    if math.copysign(1.0, x) < 0.0:
        out[pos] = 45
        pos += 1
        k = -k
    pos = _put_int(out, pos, k // 1000)
    out[pos] = 46  # '.'
    pos += 1
    f = k % 1000
    if f == 0:
        out[pos] = 48
        return pos + 1
    d = 100
    while f:
        out[pos] = 48 + f // d
        pos += 1
        f %= d
        d //= 10
    return pos


@jit
def _encode_run(
    heads: Any,
    head_at: Any,
    session_index: Any,
    seqs: Any,
    due_ms: Any,
    delete: Any,
    rid: Any,
    values: Any,
    status: Any,
    prog: Any,
    prog_at: Any,
    stat: Any,
    lit: Any,
    consts: Any,
    out: Any,
    bounds: Any,
    longest: int,
) -> int:
    """Write each message's JSON and a newline into ``out``, where each starts into ``bounds``; return the length.

    ``consts`` holds (start, length) in ``lit`` of the fixed pieces: after seq, after ts (upsert, then
    delete), a delete's row head and the closing brace. ``longest`` bounds a message's length, newline
    included. Returns -1 if a value cannot be written exactly, -2 if ``out`` could overflow.
    """
    pos = 0
    kinds = len(prog_at) - 1
    for i in range(len(session_index)):
        if pos + longest > len(out):  # nothing checks indices in compiled code: never write past the end
            return -2
        bounds[i] = pos
        s = session_index[i]
        pos = _put(out, pos, heads, head_at[s], head_at[s + 1] - head_at[s])
        pos = _put_int(out, pos, seqs[i])
        pos = _put(out, pos, lit, consts[0], consts[1])
        pos = _put_int(out, pos, due_ms[i])
        if delete[i]:
            pos = _put(out, pos, lit, consts[4], consts[5])
            pos = _put(out, pos, lit, consts[6], consts[7])
            pos = _put_int(out, pos, rid[i])
            pos = _put(out, pos, lit, consts[8], consts[9])
        else:
            pos = _put(out, pos, lit, consts[2], consts[3])
            kind = rid[i] % kinds
            for j in range(prog_at[kind], prog_at[kind + 1]):
                op, a, b = prog[j, 0], prog[j, 1], prog[j, 2]
                if op == 0:
                    pos = _put(out, pos, lit, a, b)
                elif op == 1:
                    pos = _put_int(out, pos, rid[i])
                elif op == 2:
                    pos = _put_milli(out, pos, values[i, a])
                    if pos < 0:
                        return -1
                else:
                    st = status[i]
                    pos = _put(out, pos, lit, stat[st, 0], stat[st, 1])
        pos = _put(out, pos, lit, consts[8], consts[9])
        out[pos] = 10  # '\n'
        pos += 1
    bounds[len(session_index)] = pos
    return pos


@jit
def _hash_values(text: Any, bounds: Any, digests: Any, ctx: Any) -> None:
    """SHA-256 of each value in ``text``: value ``i`` is ``text[bounds[i]:bounds[i + 1] - 1]`` (a newline ends it)."""
    c = addr(ctx, 0)
    for i in range(len(bounds) - 1):
        _sha_init(c)
        _sha_update(c, addr(text, bounds[i]), bounds[i + 1] - 1 - bounds[i])
        _sha_final(addr(digests, 32 * i), c)


@jit
def search_right(cdf: Any, u: Any) -> Any:
    """``cdf.searchsorted(u, side="right")`` for a short nondecreasing ``cdf``: where each ``u`` falls.

    numpy's searchsorted takes about 25 ns a key when the keys are not sorted (200 us for a block of 8,192
    sensor picks over 24 sensors); this binary search gives the same index, the first ``i`` with
    ``cdf[i] > u``, in a few.
    """
    out = np.empty(len(u), dtype=np.int64)
    n = len(cdf)
    for j in range(len(u)):
        x = u[j]
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) >> 1
            if cdf[mid] <= x:
                lo = mid + 1
            else:
                hi = mid
        out[j] = lo
    return out


@jit
def update_run(
    table: Any,
    u_op: Any,
    u_row: Any,
    z: Any,
    cap: int,
    p_delete: float,
    value_col: int,
    status_from: float,
    n_status: int,
    live: Any,
    ids: Any,
    level: Any,
    values: Any,
    step: Any,
    status: Any,
    next_id: Any,
    kind_level: Any,
    kind_spread: Any,
    kind_step: Any,
    out_delete: Any,
    out_rid: Any,
    out_values: Any,
    out_status: Any,
) -> None:
    """Apply updates to a ``simulator.model.TableStore``'s arrays in order, and say what each message carries.

    Update ``i`` picks slot ``min(u_row * cap, cap - 1)`` of table ``table[i]``. A live slot's row is deleted
    when ``u_op < p_delete``; otherwise one of its measurements (picked by ``u_row``) takes a random-walk step
    of ``step * z``, and when ``u_op >= status_from`` its status changes to one picked by ``u_row``. An empty
    slot gets a new row: the table's next id, measurements started from ``z`` (the ``value`` column at its
    kind's level and spread, a row's kind being its id modulo ``len(kind_level)``) and status 0. Values are
    the levels rounded to thousandths (``simulator.model.milli``). A delete carries the row as it was.
    """
    k = level.shape[1]
    kinds = len(kind_level)
    for i in range(len(table)):
        t = table[i]
        ur = u_row[i]
        slot = t * cap + min(int(ur * cap), cap - 1)
        if live[slot]:
            rid = ids[slot]
            if u_op[i] < p_delete:
                live[slot] = False
                ids[slot] = -1
                out_delete[i] = True
                out_rid[i] = rid
                for j in range(k):
                    out_values[i, j] = values[slot, j]
                out_status[i] = status[slot]
                continue
            if k:
                col = int(ur * cap * 7919.0) % k if k > 1 else 0
                level[slot, col] = level[slot, col] + step[slot, col] * z[i]
            if u_op[i] >= status_from:
                status[slot] = int(ur * cap * 997.0) % n_status
        else:
            rid = next_id[t]
            next_id[t] = rid + 1
            kind = rid % kinds
            for j in range(k):
                level[slot, j] = 10.0 * z[i]
                step[slot, j] = 0.1
            if value_col >= 0:
                level[slot, value_col] = kind_level[kind] + kind_spread[kind] * z[i]
                step[slot, value_col] = kind_step[kind]
            live[slot] = True
            ids[slot] = rid
            status[slot] = 0
        for j in range(k):
            v = np.floor(level[slot, j] * 1000.0 + 0.5) / 1000.0
            values[slot, j] = v
            out_values[i, j] = v
        out_delete[i] = False
        out_rid[i] = rid
        out_status[i] = status[slot]


class RunEncoder:
    """Encodes runs of updates of one ``TableStore``'s tables with the compiled kernel.

    Parameters
    ----------
    kinds
        Each row kind's template pieces (``TableStore.row_pieces``): the template cut where the row's id goes,
        with ``%b`` holes and doubled ``%``, as ``sotw.wire.row_template`` writes it.
    holes
        The hole columns, in template order (``TableStore.holes``).
    numeric
        The numeric columns (``TableStore.numeric``): a hole's values column is its index here.
    statuses
        Each status's text, by the index ``BlockUpdate.status`` holds.
    """

    def __init__(
        self,
        kinds: Sequence[Sequence[bytes]],
        holes: Sequence[str],
        numeric: Sequence[str],
        statuses: Sequence[str],
    ) -> None:
        lit = bytearray()

        def place(text: bytes) -> tuple[int, int]:
            at = len(lit)
            lit.extend(text)
            return at, len(text)

        after_ts = [place(wire.update_after_ts(op)) for op in wire.OPS]
        consts = [
            *place(wire.UPDATE_AFTER_SEQ),
            *after_ts[0],
            *after_ts[1],
            *place(b'{"id":'),
            *place(b"}"),
        ]
        prog: list[tuple[int, int, int]] = []
        prog_at = [0]
        for pieces in kinds:
            hole = 0
            for n, piece in enumerate(pieces):
                if n:
                    prog.append((_ID, 0, 0))
                for token in re.split(rb"(%b|%%)", piece):
                    if token == b"%b":
                        col = holes[hole]
                        prog.append((_STATUS, 0, 0) if col == "status" else (_NUM, numeric.index(col), 0))
                        hole += 1
                    elif token:
                        prog.append((_LIT, *place(token.replace(b"%%", b"%"))))
            prog_at.append(len(prog))
        self._stat = np.array([place(wire.encode_row(s)) for s in statuses], dtype=np.int64).reshape(-1, 2)
        self._prog = np.array(prog, dtype=np.int64).reshape(-1, 3)
        self._prog_at = np.array(prog_at, dtype=np.int64)
        self._lit = np.frombuffer(bytes(lit), dtype=np.uint8)
        self._consts = np.array(consts, dtype=np.int64)
        # The longest message without its session prefix: the longest row template with its two ids and its
        # holes at their widest (a float is at most 14 characters here, a status its JSON), the fixed pieces,
        # seq and ts at 20 digits each, the closing brace and the newline.
        widest = max([24, *(len(wire.encode_row(s)) for s in statuses)])
        row = max(sum(len(p) for p in pieces) + 20 * (len(pieces) - 1) for pieces in kinds) + widest * len(
            holes
        )
        self._longest = row + 2 * 20 + sum(length for length in consts[1::2]) + 2
        self._columns = len(numeric)
        self._out = np.empty(0, dtype=np.uint8)

    def encode(
        self,
        prefixes: Sequence[bytes],
        session_index: np.ndarray,
        seqs: np.ndarray,
        due_ms: np.ndarray,
        delete: np.ndarray,
        rid: np.ndarray,
        values: np.ndarray,
        status: np.ndarray,
    ) -> Values | None:
        """The run's values, or None if Python must encode this run.

        ``prefixes`` are the run's sessions' ``sotw.wire.update_prefix``; ``session_index`` indexes them per message.
        """
        if not AVAILABLE:
            return None
        m = len(session_index)
        head_at = np.zeros(len(prefixes) + 1, dtype=np.int64)
        head_at[1:] = np.cumsum([len(p) for p in prefixes])
        heads = np.frombuffer(b"".join(prefixes) or b"\0", dtype=np.uint8)
        # The buffer is kept from run to run: a fresh 3 MB one a run costs its page faults every time.
        longest = int(np.diff(head_at).max(initial=0)) + self._longest
        size = m * longest
        if len(self._out) < size:
            self._out = np.empty(size, dtype=np.uint8)
        bounds = np.empty(m + 1, dtype=np.int64)
        n = _encode_run(
            heads,
            head_at,
            session_index,
            seqs,
            due_ms,
            delete,
            rid,
            np.ascontiguousarray(values),
            status,
            self._prog,
            self._prog_at,
            self._stat,
            self._lit,
            self._consts,
            self._out,
            bounds,
            longest,
        )
        if n == -2:  # the bound above is wrong: say so, and let Python encode the run
            log.warning("compiled encoder: %d messages may not fit %d bytes; encoding in Python", m, size)
            return None
        if n < 0:
            return None
        return Values(self._out[:n].copy(), bounds)

    def warm_up(self) -> bool:
        """Compile the kernels, or load them from numba's cache, now rather than in a run; True if they work."""
        one = np.zeros(1, dtype=np.int64)
        values = np.zeros((1, self._columns))
        done = self.encode([b"{"], one, one, one, np.ones(1, dtype=bool), one, values, one)
        return done is not None and len(done.digests()) == 32


class Values:
    """A run's encoded values in one buffer, each followed by a newline; their SHA-256 digests when asked.

    The producer sends the values straight from the buffer (``simulator.rdkafka``), and the loop hands
    these to the ledger instead of digests: the hashing (about 0.2 us a message) then happens on the
    ledger's writer thread, in compiled code that lets go of the GIL, while the loop goes on producing.

    Parameters
    ----------
    text
        The values, each followed by a newline (a uint8 array, or bytes).
    bounds
        Where each value starts in ``text``, and where the last one's newline ends it: ``len(values) + 1``
        offsets.
    """

    __slots__ = ("bounds", "text")

    def __init__(self, text: np.ndarray | bytes, bounds: np.ndarray) -> None:
        # A writable array: the compiled code is then compiled (and cached) for one array type only.
        self.text = text if isinstance(text, np.ndarray) else np.frombuffer(text, dtype=np.uint8).copy()
        self.bounds = bounds

    @classmethod
    def of(cls, values: Sequence[bytes]) -> Values:
        """These values, in one buffer."""
        bounds = np.zeros(len(values) + 1, dtype=np.int64)
        bounds[1:] = np.cumsum([len(v) + 1 for v in values])
        return cls(b"".join(v + b"\n" for v in values), bounds)

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, part: slice) -> Values:
        """Values ``part.start`` to ``part.stop`` (a slice without a step), sharing the buffer."""
        i, j, _ = part.indices(len(self))
        return Values(self.text, self.bounds[i : max(i, j) + 1])

    def value(self, i: int) -> bytes:
        """Value ``i``, without its newline."""
        return self.text[self.bounds[i] : self.bounds[i + 1] - 1].tobytes()

    def digests(self) -> bytes:
        """The raw SHA-256 digests of the values, 32 bytes each, in order."""
        digests = np.empty(32 * len(self), dtype=np.uint8)
        if AVAILABLE:
            _hash_values(self.text, self.bounds, digests, np.zeros(256, np.uint8))
            return digests.tobytes()
        text, bounds = self.text.tobytes(), self.bounds.tolist()
        sha256 = hashlib.sha256
        return b"".join([sha256(text[a : b - 1]).digest() for a, b in zip(bounds, bounds[1:], strict=False)])

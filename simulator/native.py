"""Compiled encoding and hashing of a run of updates: the part of the hot path Python cannot make cheap.

At full speed the simulator's loop thread is what limits it. Per message it used to spend about 0.4 us on
``bytes %`` formatting and numpy glue, and 0.4 us on ``hashlib.sha256``, most of which is the call itself,
not the hashing: OpenSSL 3 looks up the algorithm on every new hash object. ``encode_run`` does both in one
numba-compiled call per run: it writes every message's JSON into one buffer, the same bytes as
``sotw.wire.encode_update``, and hashes each with libcrypto's SHA-256. The libcrypto is the one this
Python's own ``hashlib`` uses, found through its ``_hashlib`` module, so the digests are the ones ``hashlib``
gives.

The kernel writes a float only when it can prove the text is the one ``orjson`` (and so ``encode_row``)
writes: a value that is exactly the nearest double to a number of thousandths below 1e9 in magnitude, which
is what ``simulator.model.milli`` makes. Anything else (a row that walked past 1e9) makes it decline, and
the caller encodes that run in Python.

Compiled code is cached beside this module (``__pycache__``) by numba, so only the first run on a machine
pays the compilation (about 2 s); ``warm_up`` does it before a run's schedule starts.
"""

from __future__ import annotations

import _hashlib
import ctypes
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

_FLOAT_LIMIT = 10**12  # thousandths: |value| < 1e9, far inside orjson's plain notation (below 1e16)


def _link() -> bool:
    """Make libc's memcpy and libcrypto's SHA256_* callable from compiled code; False if one is missing."""
    # dlsym on _hashlib's handle also searches the libraries it was linked with: its libcrypto.
    found = [(ctypes.CDLL(None), "memcpy")] + [
        (ctypes.CDLL(_hashlib.__file__), name) for name in ("SHA256_Init", "SHA256_Update", "SHA256_Final")
    ]
    try:
        for lib, name in found:
            binding.add_symbol(name, ctypes.cast(getattr(lib, name), ctypes.c_void_p).value)
    except AttributeError as exc:  # pragma: no cover - OpenSSL 1.1 and 3.x export them
        log.info("%s not found: the simulator encodes in Python", exc)
        return False
    return True


AVAILABLE = _link()

_memcpy = types.ExternalFunction("memcpy", types.voidptr(types.voidptr, types.voidptr, types.uintp))
_sha_init = types.ExternalFunction("SHA256_Init", types.int32(types.voidptr))
_sha_update = types.ExternalFunction("SHA256_Update", types.int32(types.voidptr, types.voidptr, types.uintp))
_sha_final = types.ExternalFunction("SHA256_Final", types.int32(types.voidptr, types.voidptr))


@intrinsic
def _addr(typingctx: Any, arr: Any, off: Any) -> Any:
    """Pointer to item ``off`` of a 1-D contiguous array."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        a = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.bitcast(builder.gep(a.data, [args[1]]), cgutils.voidptr_t)

    return types.voidptr(arr, off), codegen


@njit(cache=True, nogil=True)
def _put(out: Any, pos: int, src: Any, start: int, n: int) -> int:
    # memcpy, not a loop over the bytes: the loop made the kernel's formatting cost 0.41 us a message, not 0.15.
    _memcpy(_addr(out, pos), _addr(src, start), n)
    return pos + n


@njit(cache=True, nogil=True)
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


@njit(cache=True, nogil=True)
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


@njit(cache=True, nogil=True)
def _encode_run(
    heads: Any,
    head_at: Any,
    sidx: Any,
    seqs: Any,
    tsm: Any,
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
    digests: Any,
    ctx: Any,
) -> int:
    """Write each message's JSON and a newline into ``out`` and its SHA-256 into ``digests``; return the length.

    ``consts`` holds (start, length) in ``lit`` of the fixed pieces: after seq, after ts (upsert, then
    delete), a delete's row head and the closing brace. Returns -1 if a value cannot be written exactly.
    """
    pos = 0
    c = _addr(ctx, 0)
    kinds = len(prog_at) - 1
    for i in range(len(sidx)):
        start = pos
        s = sidx[i]
        pos = _put(out, pos, heads, head_at[s], head_at[s + 1] - head_at[s])
        pos = _put_int(out, pos, seqs[i])
        pos = _put(out, pos, lit, consts[0], consts[1])
        pos = _put_int(out, pos, tsm[i])
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
        _sha_init(c)
        _sha_update(c, _addr(out, start), pos - start)
        _sha_final(_addr(digests, 32 * i), c)
        out[pos] = 10  # '\n'
        pos += 1
    return pos


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
        self._longest = max(sum(len(p) for p in pieces) for pieces in kinds) + 24 * len(holes) + 128
        self._columns = len(numeric)
        self._out = np.empty(0, dtype=np.uint8)
        self._digests = np.empty(0, dtype=np.uint8)
        self._ctx = np.zeros(256, dtype=np.uint8)  # a SHA256_CTX is 112 bytes

    def encode(
        self,
        prefixes: Sequence[bytes],
        sidx: np.ndarray,
        seqs: np.ndarray,
        tsm: np.ndarray,
        delete: np.ndarray,
        rid: np.ndarray,
        values: np.ndarray,
        status: np.ndarray,
    ) -> tuple[list[bytes], bytes] | None:
        """Each message's value and the run's raw SHA-256 digests, or None if Python must encode this run.

        ``prefixes`` are the run's sessions' ``sotw.wire.update_prefix``; ``sidx`` indexes them per message.
        """
        if not AVAILABLE:
            return None
        m = len(sidx)
        head_at = np.zeros(len(prefixes) + 1, dtype=np.int64)
        head_at[1:] = np.cumsum([len(p) for p in prefixes])
        heads = np.frombuffer(b"".join(prefixes) or b"\0", dtype=np.uint8)
        # The buffers are kept from run to run: a fresh 3 MB one a run costs its page faults every time.
        size = m * (int(np.diff(head_at).max(initial=0)) + self._longest)
        if len(self._out) < size:
            self._out = np.empty(size, dtype=np.uint8)
        if len(self._digests) < 32 * m:
            self._digests = np.empty(32 * m, dtype=np.uint8)
        out, digests = self._out, self._digests
        n = _encode_run(
            heads,
            head_at,
            sidx,
            seqs,
            tsm,
            delete,
            rid,
            np.ascontiguousarray(values),
            status,
            self._prog,
            self._prog_at,
            self._stat,
            self._lit,
            self._consts,
            out,
            digests,
            self._ctx,
        )
        if n < 0:
            return None
        texts = out[:n].tobytes().split(b"\n")
        texts.pop()
        return texts, digests[: 32 * m].tobytes()

    def warm_up(self) -> bool:
        """Compile the kernel, or load it from numba's cache, now rather than in a run; True if it works."""
        one = np.zeros(1, dtype=np.int64)
        values = np.zeros((1, self._columns))
        done = self.encode([b"{"], one, one, one, np.ones(1, dtype=bool), one, values, one)
        return done is not None

import hashlib

import numpy as np
import pytest

from simulator import native
from simulator.model import TableStore, milli
from simulator.native import RunEncoder, Values
from sotw import wire

SESSIONS = [("0007", "0007-run%1-00001"), ('s"é\\', "sé-00002"), ("x" * 40, "x-00003")]


def _encoder(store: TableStore) -> RunEncoder:
    return store.encoder()


@pytest.mark.parametrize("columns", [1, 4, 7])
def test_the_compiled_encoder_writes_each_update_and_its_sha256_as_the_wire_format_says(columns):
    store = TableStore(30, columns, 0.2, 0.2)
    rng = np.random.default_rng(columns)
    for _ in SESSIONS:
        store.add_table(rng)
    encoder = _encoder(store)
    assert encoder.warm_up()
    prefixes = [wire.update_prefix(sensor, session) for sensor, session in SESSIONS]
    for m in (1, 7, 2000):
        table = rng.integers(0, len(SESSIONS), m)
        b = store.update_block(table, rng.random(m), rng.random(m), 40.0 * rng.standard_normal(m))
        seqs = rng.integers(0, 2**40, m)
        tsm = rng.integers(1_700_000_000_000, 1_900_000_000_000, m)
        encoded = encoder.encode(prefixes, table, seqs, tsm, b.delete, b.rid, b.values, b.status)
        assert encoded is not None
        values = [encoded.value(i) for i in range(m)]
        digests = encoded.digests()
        assert len(encoded) == m and encoded[1:m].digests() == digests[32:]
        assert b.delete.any() or m < 100
        for i in range(m):
            sensor, session = SESSIONS[table[i]]
            rid = int(b.rid[i])
            row = {"id": rid} if b.delete[i] else store.row(rid, b.values[i], int(b.status[i]))
            op = "delete" if b.delete[i] else "upsert"
            assert values[i] == wire.encode_update(sensor, session, int(seqs[i]), int(tsm[i]), op, row)
            assert digests[32 * i : 32 * i + 32] == hashlib.sha256(values[i]).digest()


def test_floats_come_out_as_orjson_writes_them_and_others_are_left_to_python():
    store = TableStore(6, 1, 0.0, 0.0)  # one numeric column: "value"
    store.add_table(np.random.default_rng(0))
    encoder = _encoder(store)
    rng = np.random.default_rng(1)
    written = [0.0, -0.0, 0.001, -0.001, 0.5, 100.0, 999_999_999.999, -999_999_999.999]
    written += [milli(x) for x in rng.normal(0, 1e4, 3000).tolist()]
    refused = [1e9, -1e9, 0.0001, 1.0 / 3.0, float("nan"), float("inf"), 1e16]

    def encode(x: float) -> list[bytes] | None:
        one = np.zeros(1, dtype=np.int64)
        values = np.array([[x]])
        prefix = wire.update_prefix("s", "s-1")
        encoded = encoder.encode([prefix], one, one, one, np.zeros(1, dtype=bool), one, values, one)
        return None if encoded is None else [encoded.value(0)]

    for x in written:
        value = encode(x)
        assert value == [wire.encode_update("s", "s-1", 0, 0, "upsert", {"id": 0, "value": x})], x
    for x in refused:
        assert encode(x) is None, x


@pytest.mark.parametrize("compiled", [True, False])
def test_a_runs_values_give_back_each_value_and_its_sha256_compiled_or_not(monkeypatch, compiled):
    values = [b"", b"{}", "é%\\".encode(), b"x" * 1000]
    monkeypatch.setattr(native, "AVAILABLE", compiled)
    run = Values.of(values)
    assert len(run) == 4 and len(run[2:]) == 2 and len(run[3:1]) == 0
    assert [run.value(i) for i in range(4)] == values and run[1:3].value(1) == values[2]
    assert run.digests() == b"".join(hashlib.sha256(v).digest() for v in values)
    assert run[1:3].digests() == b"".join(hashlib.sha256(v).digest() for v in values[1:3])


def test_a_kernel_numba_cannot_cache_is_compiled_in_the_process_instead():
    # A function without a source file has nowhere to be cached, as in a read-only install without a home.
    scope: dict[str, object] = {}
    exec("def double(x):\n    return 2 * x\n", scope)
    assert native.jit(scope["double"])(21) == 42


def test_table_updates_refuse_inputs_that_would_leave_the_store():
    store = TableStore(10, 2, 0.1, 0.1)
    store.add_table(np.random.default_rng(0))
    ok = np.array([0.5])
    with pytest.raises(ValueError, match="table index"):
        store.update_block(np.array([1]), ok, ok, ok)
    with pytest.raises(ValueError, match="u_row"):
        store.update_block(np.array([0]), ok, np.array([1.0]), ok)
    with pytest.raises(ValueError, match="u_row"):
        store.update_block(np.array([0]), ok, np.array([float("nan")]), ok)

"""Micro benchmarks of the simulator's per-message work, without a broker.

Run with ``.venv/bin/pytest benchmarks/test_simulator_generation.py --benchmark-only``. The hot path is
measured as the simulator's loop runs it, a block of 8,192 updates at a time: the tables' update
(``TableStore.update_block``), the compiled encoding (``simulator.native.RunEncoder``) and, on the ledger's
writer thread, the SHA-256 of every value (``Values.digests``). The reference encoder
(``sotw.wire.encode_update``, one call per message) is measured beside it. The figure per message is the
round time divided by the messages of a round.
"""

import hashlib

import numpy as np

from simulator.faults import decide
from simulator.model import SensorTable, TableStore
from sotw import wire

N = 10_000
BLOCK = 8192
SENSORS = 24


def make_inputs(seed=0):
    rng = np.random.default_rng(seed)
    table = SensorTable(200, 4, rng, 0.05, 0.05)
    u = rng.random((2, N)).tolist()
    z = rng.standard_normal(N).tolist()
    return table, u, z


def make_block(seed=0):
    """A fleet's store of 24 tables, the encoder the simulator builds for it, and a block's inputs."""
    rng = np.random.default_rng(seed)
    store = TableStore(200, 4, 0.05, 0.05)
    for _ in range(SENSORS):
        store.add_table(rng)
    encoder = store.encoder()
    encoder.warm_up()
    prefixes = [wire.update_prefix(f"{k:04d}", f"{k:04d}-0123456789ab-00001") for k in range(SENSORS)]
    table = rng.integers(0, SENSORS, BLOCK)
    inputs = (table, rng.random(BLOCK), rng.random(BLOCK), rng.standard_normal(BLOCK))
    return store, encoder, prefixes, inputs


def test_reference_encoder_10k_updates(benchmark):
    table, u, z = make_inputs()
    rows = [table.update(u[0][j], u[1][j], z[j]) for j in range(N)]
    encode = wire.encode_update

    def work():
        for j, (op, row) in enumerate(rows):
            encode("0007", "0007-0123456789ab-00001", j, 1_795_000_000_000 + j, op, row)

    benchmark(work)


def test_reference_encoder_and_hashlib_sha256_10k_updates(benchmark):
    table, u, z = make_inputs()
    rows = [table.update(u[0][j], u[1][j], z[j]) for j in range(N)]
    encode = wire.encode_update
    sha256 = hashlib.sha256

    def work():
        for j, (op, row) in enumerate(rows):
            sha256(encode("0007", "0007-0123456789ab-00001", j, 1_795_000_000_000 + j, op, row)).digest()

    benchmark(work)


def test_table_updates_for_a_block_of_8192_messages(benchmark):
    store, _, _, (table, u_op, u_row, z) = make_block()
    benchmark(lambda: store.update_block(table, u_op, u_row, z))


def test_update_and_encode_a_block_of_8192_messages_as_the_loop_does(benchmark):
    store, encoder, prefixes, (table, u_op, u_row, z) = make_block()
    seqs = np.arange(BLOCK, dtype=np.int64)
    tsm = 1_795_000_000_000 + seqs

    def work():
        b = store.update_block(table, u_op, u_row, z)
        assert encoder.encode(prefixes, table, seqs, tsm, b.delete, b.rid, b.values, b.status) is not None

    benchmark(work)


def test_sha256_of_a_block_of_8192_values_as_the_ledger_writer_does(benchmark):
    store, encoder, prefixes, (table, u_op, u_row, z) = make_block()
    seqs = np.arange(BLOCK, dtype=np.int64)
    b = store.update_block(table, u_op, u_row, z)
    encoded = encoder.encode(
        prefixes, table, seqs, 1_795_000_000_000 + seqs, b.delete, b.rid, b.values, b.status
    )
    assert encoded is not None
    benchmark(encoded.digests)


def test_one_update_on_the_per_message_path(benchmark):
    table, u, z = make_inputs()
    benchmark(lambda: table.update(u[0][0], u[1][0], z[0]))


def test_block_of_random_inputs_and_fault_decisions_for_8192_messages(benchmark):
    rng = np.random.default_rng(0)
    edges = np.tile(np.cumsum([0.01, 0.01, 0.01, 0.01]), (24, 1))
    weights = np.full(24, 1 / 24)

    def work():
        sidx = rng.choice(24, size=8192, p=weights)
        u = rng.random((4, 8192))
        rng.standard_normal(8192)
        return decide(u[0], edges[sidx]).tolist()

    benchmark(work)


def test_snapshot_of_200_rows(benchmark):
    table, _, _ = make_inputs()
    benchmark(lambda: wire.encode_snapshot("0007", "0007-0123456789ab-00001", 0, 1, table.rows.values()))

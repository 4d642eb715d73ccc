"""Micro benchmarks of the simulator's per-message work, without a broker.

Run with ``.venv/bin/pytest benchmarks/test_simulator_generation.py --benchmark-only``. Each round applies
10,000 random updates to a 200-row table and encodes them, with ``sotw.wire.encode_update`` (the reference
encoder) or with ``update_templates`` + ``encode_row`` as the producer loop does; the figure per message is
the round time divided by 10,000.
"""

import hashlib

import numpy as np

from simulator.faults import decide
from simulator.model import SensorTable
from sotw import wire

N = 10_000


def make_inputs(seed=0):
    rng = np.random.default_rng(seed)
    table = SensorTable(200, 4, rng, 0.05, 0.05)
    u = rng.random((2, N)).tolist()
    z = rng.standard_normal(N).tolist()
    return table, u, z


def test_update_and_encode_10k_messages(benchmark):
    table, u, z = make_inputs()
    encode = wire.encode_update

    def work():
        for j in range(N):
            op, row = table.update(u[0][j], u[1][j], z[j])
            encode("0007", "0007-0123456789ab-00001", j, 1_795_000_000_000 + j, op, row)

    benchmark(work)


def test_update_encode_and_hash_10k_messages(benchmark):
    table, u, z = make_inputs()
    encode = wire.encode_update
    sha256 = hashlib.sha256

    def work():
        for j in range(N):
            op, row = table.update(u[0][j], u[1][j], z[j])
            sha256(encode("0007", "0007-0123456789ab-00001", j, 1_795_000_000_000 + j, op, row)).digest()

    benchmark(work)


def test_update_template_encode_and_hash_10k_messages_as_the_producer_loop_does(benchmark):
    table, u, z = make_inputs()
    templates = wire.update_templates("0007", "0007-0123456789ab-00001")
    encode_row = wire.encode_row
    sha256 = hashlib.sha256

    def work():
        for j in range(N):
            op, row = table.update(u[0][j], u[1][j], z[j])
            sha256(templates[op] % (j, 1_795_000_000_000 + j, encode_row(row))).digest()

    benchmark(work)


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

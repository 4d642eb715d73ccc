import numpy as np
import pytest

from simulator.model import STATUSES, SensorTable, TableStore, stable_order
from sotw import wire


@pytest.mark.parametrize("columns", [1, 4, 7])
@pytest.mark.parametrize(("insert_ratio", "delete_ratio"), [(0.05, 0.05), (0.3, 0.4), (0.0, 0.0)])
def test_a_block_of_updates_to_several_tables_gives_what_the_same_updates_one_at_a_time_give(
    columns, insert_ratio, delete_ratio
):
    store = TableStore(20, columns, insert_ratio, delete_ratio)
    blocked = [
        SensorTable(20, columns, np.random.default_rng(k), insert_ratio, delete_ratio, store=store)
        for k in range(3)
    ]
    single = [
        SensorTable(20, columns, np.random.default_rng(k), insert_ratio, delete_ratio) for k in range(3)
    ]
    draws = np.random.default_rng(5)
    for _ in range(25):
        n = int(draws.integers(1, 400))
        table, u_op, u_row, z = (
            draws.integers(0, 3, n),
            draws.random(n),
            draws.random(n),
            draws.standard_normal(n),
        )
        block = store.update_block(table, u_op, u_row, z)
        for j in range(n):
            op, row = single[table[j]].update(u_op[j], u_row[j], z[j])
            assert block.delete[j] == (op == "delete") and block.rid[j] == row["id"]
            # The block's row template, filled, is the row as the wire encodes it.
            holes = [wire.encode_row(row.get(h, 0.0)) for h in store.holes]
            assert block.template[j] % tuple(holes) == wire.encode_row(row)
        assert [t.rows for t in blocked] == [t.rows for t in single]


def test_inserts_and_deletes_keep_the_table_near_its_size_with_fresh_ids_and_valid_rows():
    table = SensorTable(200, 4, np.random.default_rng(1), 0.05, 0.05)
    draws = np.random.default_rng(2)
    sizes, ops = [], {"upsert": 0, "delete": 0}
    for _ in range(20):
        n = 5000
        block = table.update_block(draws.random(n), draws.random(n), draws.standard_normal(n))
        ops["delete"] += int(block.delete.sum())
        ops["upsert"] += int((~block.delete).sum())
        sizes.append(len(table))
    assert 180 <= np.mean(sizes) <= 220
    assert 0.03 <= ops["delete"] / 100_000 <= 0.07
    rows = table.rows
    assert len(rows) == len(table) and max(rows) > 200  # new rows got new ids
    for rid, row in rows.items():
        assert row["id"] == rid and row["status"] in STATUSES and row["name"].endswith(f"-{rid}")
        assert row["value"] == round(row["value"], 3)
    assert table.snapshot_rows() == [rows[i] for i in sorted(rows)]


@pytest.mark.parametrize("high", [1, 24, 65_535, 65_536, 10**9])
def test_stable_order_is_numpys_stable_argsort_for_small_and_large_values(high: int) -> None:
    rng = np.random.default_rng(high)
    for size in (0, 1, 7, 8192):
        a = rng.integers(0, high + 1, size)
        assert np.array_equal(stable_order(a), np.argsort(a, kind="stable"))

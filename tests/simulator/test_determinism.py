from simulator import FaultConfig
from tests.simulator.conftest import fixed_clock, read_ledger

FAULTS = FaultConfig(gap=0.02, duplicate=0.02, delayed=0.02, malformed=0.02, abandon=0.3)


def planned(run_dir):
    """What was meant to be sent, independent of wall-clock timing: one entry per ledger row."""
    rows = read_ledger(run_dir)
    return sorted(
        (r["session"], r["seq"], r["kind"], r["fault"], r["intended_ts"], r["value_sha256"] or "")
        for r in rows
    )


def test_same_seed_and_config_give_the_same_messages_and_fault_decisions(simulate, unique_prefix):
    # The same config, topics included: the session ids mix in the topic prefix.
    same = {"topic_prefix": unique_prefix(), "faults": FAULTS, "max_messages": 2500, "duration_s": None}
    first, _ = simulate(name="same-id", clock=fixed_clock(), **same)
    second, _ = simulate(name="same-id", clock=fixed_clock(), **same)
    a, b = planned(first.run_dir), planned(second.run_dir)
    assert len(a) > 2500
    assert a == b


def test_another_seed_or_another_run_gives_other_messages_and_session_ids(simulate):
    base, _ = simulate(name="r1", clock=fixed_clock(), max_messages=500, duration_s=None)
    reseeded, _ = simulate(name="r1", clock=fixed_clock(), max_messages=500, duration_s=None, seed=8)
    other_run, _ = simulate(name="r2", clock=fixed_clock(), max_messages=500, duration_s=None)
    sessions = [{r[0] for r in planned(s.run_dir)} for s in (base, reseeded, other_run)]
    assert not sessions[0] & sessions[1] and not sessions[0] & sessions[2]
    hashes = [[r[5] for r in planned(s.run_dir)] for s in (base, reseeded)]
    assert hashes[0] != hashes[1]

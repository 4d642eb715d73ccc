"""The workers' garbage-collector pause: off inside, restored after, even on error or when nested."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from pipeline import gcpause
from pipeline.gcpause import gc_paused


@pytest.fixture(autouse=True)
def _restore_gc() -> Iterator[None]:
    was_on = gc.isenabled()
    yield
    gc.unfreeze()
    if was_on:
        gc.enable()


def test_the_collector_is_off_inside_and_back_on_after_even_on_error() -> None:
    gc.enable()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_pause_that_found_the_collector_off_leaves_it_off() -> None:
    gc.enable()
    with gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    with gc_paused():
        pass
    assert not gc.isenabled()


def test_interleaved_generators_never_leave_the_collector_off() -> None:
    def rows(n: int) -> Iterator[int]:
        with gc_paused():
            yield from range(n)

    gc.enable()
    a, b = rows(2), rows(3)
    next(a), next(b)  # a turned it off, b found it off
    assert list(a) == [1] and list(b) == [1, 2]
    assert gc.isenabled()


def test_a_fresh_worker_freezes_what_it_imported_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gcpause, "_frozen_at", None)  # as in a newly forked worker
    gc.unfreeze()
    with gc_paused():
        pass
    frozen = gc.get_freeze_count()
    assert frozen > 10_000  # pytest, pyspark, pandas... are out of the collector's walks
    with gc_paused():
        pass
    # Nothing new imported, so no second collection and freeze: the count does not grow (it may shrink, as
    # other threads free frozen objects).
    assert gc.get_freeze_count() <= frozen

"""Python workers keep CPython's cyclic garbage collector out of the way of Spark's batches.

Two costs, both measured with ``benchmarks/pipeline_vs_bare.py``:

* **Per batch.** A micro-batch makes hundreds of thousands of small objects in a worker (Kafka messages,
  envelopes, change tuples, row dicts) and keeps many of them alive until the batch's Arrow block is built.
  CPython runs its collector every 700 net allocations and, as survivors pile up, rescans them again and again
  in the older generations: about a third of the stateful worker's CPU time on a backlog. None of it is
  needed: these objects form no reference cycles, and reference counting frees them when the batch is done.
  So the hot functions run with the collector off and turn it back on when they return; whatever cycles they
  did make (an exception's traceback, say) are collected afterwards as usual.
* **Per task.** PySpark's daemon runs ``gc.collect()`` in a reused worker after every task, and a full
  collection walks everything the worker ever imported (pandas, pyarrow, pyspark: about 80,000 objects,
  some 55 ms), up to four times per stateful task. The first use in a worker process (and any use after it imported more)
  therefore collects once and *freezes* what is there (``gc.freeze``): modules and their objects live as long as the process anyway,
  and the collections after each task then only walk what the task left behind.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

# (process id, number of modules) at the last freeze: workers are forked, and one worker may serve the source
# first and the stateful step later, importing more.
_frozen_at: tuple[int, int] | None = None


def _freeze_what_was_imported() -> None:
    """Move every object alive now out of the collector's sight, when this process imported something new."""
    global _frozen_at
    now = (os.getpid(), len(sys.modules))
    if _frozen_at != now:
        gc.collect()
        gc.freeze()
        _frozen_at = now


@contextmanager
def gc_paused() -> Iterator[None]:
    """Run the block with the cyclic collector off; restore it as it was, even on error.

    Nested or interleaved uses (generators) are safe: a use that found the collector off leaves it off,
    the one that turned it off turns it back on.
    """
    _freeze_what_was_imported()
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()

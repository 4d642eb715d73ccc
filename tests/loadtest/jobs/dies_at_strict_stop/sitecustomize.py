"""A bug planted in sotw's own pipeline, from outside it: the strict policy's stop dies of an unrelated error.

On ``PYTHONPATH``, Python imports this module at start-up in every process of the job (Spark's driver and
its Python workers inherit the variable), and it replaces ``Strict._stop`` with one that raises a
``MemoryError``, as an out-of-memory kill at the moment the policy should stop the query would end it:
the job exits non-zero, and its integrity output names no violation.
"""

from __future__ import annotations

from typing import Any, NoReturn

from pipeline.policies.strict import Strict


def _dies(self: Strict, *args: Any, **kwargs: Any) -> NoReturn:
    raise MemoryError("planted: the worker ran out of memory")


Strict._stop = _dies  # type: ignore[method-assign]

"""``sotw compare-engines``: the same runs and drills for each engine's job, one table (``catalog``: the engines file; ``steps``: the runs each engine gets; ``table``: their results side by side; ``compare``: the command)."""

from loadtest.engines.catalog import Engine, load_engines

__all__ = ["Engine", "load_engines"]

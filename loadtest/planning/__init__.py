"""Capacity: the search for the highest sustained load (``capacity``) and the capacity plan built from measured ceilings (``plan``)."""

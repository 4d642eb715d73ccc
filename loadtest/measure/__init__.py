"""Measurements while a run goes (``samplers``) and the figures made of them afterwards (``figures``)."""

"""Shared pieces of sotw: the wire format, the local brokers, Kafka settings and the CLI front door."""

from sotw.errors import SotwError

__all__ = ["SotwError", "__version__"]

__version__ = "0.1.0"

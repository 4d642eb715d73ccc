"""Shared pieces of sotw: the wire format, the embedded broker, Kafka settings and the CLI front door."""

from sotw.errors import SotwError

__all__ = ["SotwError", "__version__"]

__version__ = "0.1.0"

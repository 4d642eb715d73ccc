"""The root of sotw's expected failures.

Each package raises its own subclass (``SimulatorError``, ``PipelineError``, ...); the CLI catches this root,
prints the message on one line and exits non-zero, so users never see a traceback for something they can fix.
"""


class SotwError(Exception):
    """An expected failure with a message a user can act on."""


class BrokerError(SotwError):
    """The Kafka broker could not be started, reached or kept."""


class SetupError(SotwError):
    """Something ``make setup`` provides is missing or broken: a Java runtime, Maven, a bundle of jars."""


class NetworkError(SotwError):
    """A network of namespaces (``sotw.network``) could not be made, changed or removed."""

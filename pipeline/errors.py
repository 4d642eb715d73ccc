"""The pipeline's expected failures: one root type, plus the integrity violation that stops a strict run."""

from __future__ import annotations

from sotw.errors import SotwError


class PipelineError(SotwError):
    """An expected failure of the pipeline, with a message a user can act on."""


class ConfigError(PipelineError, ValueError):
    """A pipeline setting has a bad value; the message names the field and the value.

    It is also a ``ValueError`` so that code validating arguments generically still catches it.
    """


class IntegrityViolation(PipelineError):
    """The ``strict`` policy met a message that breaks the session's integrity, so the query must stop.

    The message is a single line (the driver extracts it from the worker's traceback) that names everything a
    user needs to find the bad message in Kafka: sensor, session, topic, partition, offset, the seq the policy
    expected and the seq that came, plus the offset of the last message that was applied.

    Parameters
    ----------
    violation
        Which rule was broken: ``gap``, ``duplicate``, ``missing_snapshot``, ``digest_mismatch`` or
        ``late_after_close``.
    sensor, session
        Whose stream broke.
    topic, partition, offset
        Where the offending message sits.
    expected_seq, got_seq
        The seq the policy expected next and the one that came.
    last_offset
        Offset of the last message applied to the session (None if none was).
    detail
        Anything else worth saying (for a digest mismatch: the expected and rebuilt row count and digest).
    """

    def __init__(
        self,
        violation: str,
        *,
        sensor: str | None,
        session: str | None,
        topic: str,
        partition: int,
        offset: int,
        expected_seq: int | None,
        got_seq: int | None,
        last_offset: int | None = None,
        detail: str = "",
    ) -> None:
        self.violation = violation
        self.sensor = sensor
        self.session = session
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.expected_seq = expected_seq
        self.got_seq = got_seq
        self.last_offset = last_offset
        self.detail = detail
        last = "none" if last_offset is None else str(last_offset)
        message = (
            f"strict policy: {violation} in session {session!r} of sensor {sensor!r} at topic {topic!r} "
            f"partition {partition} offset {offset}: expected seq {expected_seq}, got seq {got_seq} "
            f"(last applied offset: {last})"
        )
        if detail:
            message += f"; {detail}"
        super().__init__(message.replace("\n", " "))

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only arguments are not restored by the default exception pickling.
        return (_rebuild_violation, (self.__dict__.copy(),))


def _rebuild_violation(fields: dict[str, object]) -> IntegrityViolation:
    violation = str(fields.pop("violation"))
    return IntegrityViolation(violation, **fields)  # type: ignore[arg-type]


class IntegrityStopped(PipelineError):
    """The driver's view of an ``IntegrityViolation``: the query stopped, and the message is the worker's line."""


class StorageUnavailable(PipelineError):
    """The checkpoint or the output could not be written (not permitted, read-only, full).

    No input is skipped: the failed batch is not committed, so the query resumes from the checkpoint once
    the storage takes writes again. ``path`` is the file that could not be written.
    """

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path

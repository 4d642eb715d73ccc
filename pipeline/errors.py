"""The pipeline's expected failures: one root type, plus the integrity violation that stops a strict run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pipeline.integrity import IntegrityRecord
from sotw.errors import SotwError

if TYPE_CHECKING:
    from pipeline.records import Records


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
    record
        What broke and where (its ``violation``: ``gap``, ``duplicate``, ``missing_snapshot``,
        ``digest_mismatch`` or ``late_after_close``), as an integrity record would say it.
    last_offset
        Offset of the last message applied to the session (None if none was).

    Attributes
    ----------
    records : Records or None
        What the session produced in its micro-batch before the violation, attached by
        ``SessionProcessor.apply``: the stateful step writes them, with ``record``, as the session's output of
        the batch that stops the query. Not pickled: it is only used in the worker that raised it.
    """

    def __init__(self, record: IntegrityRecord, last_offset: int | None = None) -> None:
        self.record = record
        self.last_offset = last_offset
        self.records: Records | None = None
        at = record.at
        last = "none" if last_offset is None else str(last_offset)
        message = (
            f"strict policy: {record.violation} in session {record.session!r} of sensor {record.sensor!r} at "
            f"topic {at.topic!r} partition {at.partition} offset {at.offset}: expected seq {record.expected_seq}, "
            f"got seq {record.got_seq} (last applied offset: {last})"
        )
        if record.detail:
            message += f"; {record.detail}"
        super().__init__(message.replace("\n", " "))

    @property
    def violation(self) -> str:
        """Which rule was broken."""
        return self.record.violation

    def __reduce__(self) -> tuple[object, ...]:
        # Spark pickles the worker's exception; the default pickling would call __init__ with the message.
        return (type(self), (self.record, self.last_offset))

    def as_dict(self) -> dict[str, Any]:
        """The stop as JSON-ready values: the record's integrity columns, ``last_offset`` and the message.

        This is what travels from the stateful step to the driver and what the commit of the stopping batch
        records (``pipeline.sinks``); ``from_dict`` turns it back into the same violation.
        """
        row = self.record.as_row()
        del row["record"]
        return {**row, "last_offset": self.last_offset, "message": str(self)}

    @classmethod
    def from_dict(cls, content: Mapping[str, Any]) -> IntegrityViolation:
        """The violation ``as_dict`` describes."""
        return cls(IntegrityRecord.from_row(content), content.get("last_offset"))


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

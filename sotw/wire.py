"""The sensor wire format, encoded and validated in exactly one place.

Every producer and consumer in sotw goes through this module, so the format described in
``docs/wire-format.md`` has a single definition. Encoding uses orjson for speed on the simulator's hot path;
the
table digest uses the standard library's JSON so that its canonical form is the one written in the spec.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
import orjson

KINDS = ("snapshot", "update", "end")
OPS = ("upsert", "delete")
_HEX = frozenset("0123456789abcdef")
_HOLE = "\x00hole\x00"
_HOLE_JSON = orjson.dumps(_HOLE)

Row = Mapping[str, Any]


class MalformedMessage(ValueError):
    """A value that breaks the wire format; ``reason`` says which rule."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Message:
    """One decoded, valid message.

    ``rows`` is the snapshot's list of row objects, ``row_count`` the end message's final row count.
    """

    sensor: str
    session: str
    seq: int
    kind: str
    ts: int
    rows: list[dict[str, Any]] | None = None
    op: str | None = None
    row: dict[str, Any] | None = None
    row_count: int | None = None
    digest: str | None = None


def encode_snapshot(sensor: str, session: str, seq: int, ts: int, rows: Iterable[Row]) -> bytes:
    """Encode a snapshot: the whole table as it is at the start of a session."""
    return orjson.dumps(
        {"sensor": sensor, "session": session, "seq": seq, "kind": "snapshot", "ts": ts, "rows": list(rows)}
    )


def encode_update(sensor: str, session: str, seq: int, ts: int, op: str, row: Row) -> bytes:
    """Encode an update of one row; for a delete only ``row["id"]`` is needed."""
    return orjson.dumps(
        {"sensor": sensor, "session": session, "seq": seq, "kind": "update", "ts": ts, "op": op, "row": row}
    )


#: Serializer of the ``row`` object of an update, the one ``encode_update`` uses; pair it with ``update_templates``.
encode_row: Callable[[Any], bytes] = orjson.dumps


def update_templates(sensor: str, session: str) -> dict[str, bytes]:
    """Byte templates of one session's updates, by op, so the hot path need not build a dict per message.

    ``update_templates(sensor, session)[op] % (seq, ts, encode_row(row))`` is byte for byte
    ``encode_update(sensor, session, seq, ts, op, row)`` when ``seq`` and ``ts`` are ``int``: the same field
    order, the same orjson escaping of the strings (done once here) and the same serializer for the row. It
    costs about two thirds of ``encode_update``, most of the rest being the row's own serialization.

    Parameters
    ----------
    sensor, session
        The session's sensor id and session id (any text; ``%`` and JSON escapes are handled).

    Returns
    -------
    dict
        ``{"upsert": template, "delete": template}``, each taking ``(seq, ts, row_json_bytes)``.
    """
    # The strings are JSON-escaped by orjson exactly as in a full dumps; a literal '%' in them must survive
    # the second formatting, hence the doubling.
    head = update_prefix(sensor, session).replace(b"%", b"%%") + b"%d" + UPDATE_AFTER_SEQ + b"%d"
    return {op: head + update_after_ts(op) + b"%b}" for op in OPS}


#: What follows the seq in every update, up to the ts (see ``update_prefix``).
UPDATE_AFTER_SEQ = b',"kind":"update","ts":'


def update_prefix(sensor: str, session: str) -> bytes:
    """An update's text up to its seq.

    ``prefix + seq + UPDATE_AFTER_SEQ + ts + update_after_ts(op) + row + b"}"``, the numbers in decimal, is
    ``encode_update(sensor, session, seq, ts, op, row)``: the compiled encoder (``simulator.native``) writes
    updates so.
    """
    return b'{"sensor":' + orjson.dumps(sensor) + b',"session":' + orjson.dumps(session) + b',"seq":'


def update_after_ts(op: str) -> bytes:
    """What follows the ts in an update with this op, up to the row (see ``update_prefix``)."""
    return b',"op":"' + op.encode("ascii") + b'","row":'


def row_template(row: Row, holes: Iterable[str] = ()) -> bytes:
    """A row's JSON as ``encode_row`` writes it, with the ``holes`` columns left as ``%b`` for later filling.

    The simulator encodes a whole block of updates with one bytes formatting: each row keeps this template for
    as long as it lives (its id, name and unit never change) and only the moving columns are filled in, with
    ``encode_row(value)`` fragments (orjson writes a float64 array's items exactly as it writes Python floats).
    ``update_templates(sensor, session)[op] % (seq, ts, row_template(row, holes) % fragments)`` is byte for
    byte ``encode_update(sensor, session, seq, ts, op, row)``. Every other ``%`` is doubled.

    Parameters
    ----------
    row
        The row; the values of the hole columns are ignored.
    holes
        Columns whose JSON value is left out, in any order (the template's holes follow the row's key order).
    """
    gaps = set(holes)
    # A string orjson escapes to something no row text can contain unescaped: each hole's marker.
    marked = {k: (_HOLE if k in gaps else v) for k, v in row.items()}
    return orjson.dumps(marked).replace(b"%", b"%%").replace(_HOLE_JSON, b"%b")


def encode_floats(values: Any) -> list[bytes]:
    """The JSON text of each float of a 1-D float64 numpy array, exactly as ``encode_row`` writes a float.

    One orjson call for a whole block (its numpy support uses the same shortest round-trip writer as for
    Python floats), then a split on the commas: the values for ``row_template``'s holes without a Python
    call per value.
    """
    if len(values) == 0:
        return []
    return orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].split(b",")


def encode_end(sensor: str, session: str, seq: int, ts: int, row_count: int, digest: str) -> bytes:
    """Encode the end of a session with the final row count and the table digest."""
    return orjson.dumps(
        {
            "sensor": sensor,
            "session": session,
            "seq": seq,
            "kind": "end",
            "ts": ts,
            "rows": row_count,
            "digest": digest,
        }
    )


def canonical_row(row: Row) -> str:
    """Serialize a row the canonical way: compact JSON, keys sorted, non-ASCII kept as UTF-8."""
    return json.dumps(row, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def table_digest(rows: Iterable[Row]) -> str:
    """Hex SHA-256 of the canonical table: rows sorted by ``id``, canonical JSON each, joined by newlines."""
    ordered = sorted(rows, key=lambda r: int(r["id"]))
    return canonical_digest(canonical_row(r) for r in ordered)


def canonical_digest(texts: Iterable[str]) -> str:
    """``table_digest`` of rows already in canonical form (``canonical_row``), in ``id`` order."""
    return hashlib.sha256("\n".join(texts).encode("utf-8")).hexdigest()


def _is_int(value: Any) -> bool:
    # bool is a subclass of int in Python, but true/false are not integers on the wire.
    return isinstance(value, int) and not isinstance(value, bool)


def _check_row(row: Any, where: str, need_columns: bool) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise MalformedMessage(f"{where} is not a JSON object")
    if "id" not in row:
        raise MalformedMessage(f"{where} has no 'id'")
    if not _is_int(row["id"]):
        raise MalformedMessage(f"{where} 'id' is not an integer")
    if need_columns and len(row) < 2:
        raise MalformedMessage(f"{where} has no columns besides 'id'")
    return row


# The hot path's decoder: msgspec checks every type rule of a plain update in C while it parses, so Python
# checks only what a schema cannot say. Integers are held to int64 (orjson, which the reference ``decode``
# uses, turns integers beyond 64 bits into floats, so such a value must not pass here), row values to the
# scalars, and the fields to the update's own (msgspec skips an unknown field's value without checking it as
# JSON, so bad UTF-8 or an overflowing number there would pass): anything else takes the reference path.
_I64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class _PlainUpdate(msgspec.Struct, forbid_unknown_fields=True):
    sensor: str
    session: Annotated[str, msgspec.Meta(min_length=1)]
    seq: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
    kind: Literal["update"]
    ts: _I64
    op: Literal["upsert", "delete"]
    row: dict[str, str | _I64 | float | bool | None]


_PLAIN_UPDATE = msgspec.json.Decoder(_PlainUpdate)


def plain_update(value: bytes | None, key: bytes) -> tuple[str, int, int, str, dict[str, Any]] | None:
    """``(sensor, seq, ts, op, row)`` of a valid update keyed by its session, else None: the hot path's decode.

    Almost every message a consumer sees is such an update. This accepts only updates ``decode`` accepts (with
    ``key`` given) and returns the same fields, but builds no ``Message`` and leaves the type rules to a msgspec
    schema, at about half of ``orjson.loads`` plus the checks in Python. Anything else returns None (a
    snapshot, an end, a malformed value, and the rare valid update the schema is stricter about: row values
    that are arrays or objects, integers beyond int64): the caller then asks ``decode``, which says what the
    message is or which rule it breaks.
    """
    if value is None:
        return None
    try:
        msg = _PLAIN_UPDATE.decode(value)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None
    row = msg.row
    if type(row.get("id")) is not int or key != msg.session.encode("utf-8"):
        return None
    op = msg.op
    if op == "upsert" and len(row) < 2:
        return None
    return msg.sensor, msg.seq, msg.ts, op, row


def decode(value: bytes | None, key: bytes | None = None) -> Message:
    """Decode and validate one Kafka message value (and key, when given).

    Raises
    ------
    MalformedMessage
        If the value is not UTF-8 JSON, a required field is missing or has the wrong type, or the key does not
        equal the session.
    """
    if value is None:
        raise MalformedMessage("value is null")
    try:
        obj = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise MalformedMessage(f"value is not UTF-8 JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise MalformedMessage("value is not a JSON object")
    for name in ("sensor", "session", "seq", "kind", "ts"):
        if name not in obj:
            raise MalformedMessage(f"missing field '{name}'")
    sensor, session, seq, kind, ts = obj["sensor"], obj["session"], obj["seq"], obj["kind"], obj["ts"]
    if not isinstance(sensor, str):
        raise MalformedMessage("'sensor' is not a string")
    if not isinstance(session, str) or not session:
        raise MalformedMessage("'session' is not a non-empty string")
    if not _is_int(seq) or seq < 0:
        raise MalformedMessage("'seq' is not a non-negative integer")
    if not _is_int(ts):
        raise MalformedMessage("'ts' is not an integer")
    if key is not None and key != session.encode("utf-8"):
        raise MalformedMessage("key does not equal 'session'")
    if kind == "snapshot":
        rows = obj.get("rows")
        if not isinstance(rows, list):
            raise MalformedMessage("snapshot 'rows' is not an array")
        checked = [_check_row(r, f"snapshot row {i}", need_columns=True) for i, r in enumerate(rows)]
        if len({r["id"] for r in checked}) != len(checked):
            raise MalformedMessage("snapshot has duplicate row ids")
        return Message(sensor, session, seq, kind, ts, rows=checked)
    if kind == "update":
        op = obj.get("op")
        if op not in OPS:
            raise MalformedMessage("update 'op' is not 'upsert' or 'delete'")
        row = _check_row(obj.get("row"), "update 'row'", need_columns=op == "upsert")
        return Message(sensor, session, seq, kind, ts, op=op, row=row)
    if kind == "end":
        count: Any = obj.get("rows")
        digest = obj.get("digest")
        if not _is_int(count) or count < 0:
            raise MalformedMessage("end 'rows' is not a non-negative integer")
        if not isinstance(digest, str) or len(digest) != 64 or not set(digest) <= _HEX:
            raise MalformedMessage("end 'digest' is not a hex SHA-256")
        return Message(sensor, session, seq, kind, ts, row_count=count, digest=digest)
    raise MalformedMessage(f"'kind' is not one of {', '.join(KINDS)}")

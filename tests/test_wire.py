import hashlib
import random

import numpy as np
import pytest

from sotw import wire


def test_update_round_trip_keeps_every_field():
    raw = wire.encode_update(
        "0007", "s-1", 5, 1_700_000_000_000, "upsert", {"id": 3, "value": 1.25, "name": "é"}
    )
    msg = wire.decode(raw, key=b"s-1")
    assert (msg.sensor, msg.session, msg.seq, msg.kind, msg.ts, msg.op) == (
        "0007",
        "s-1",
        5,
        "update",
        1_700_000_000_000,
        "upsert",
    )
    assert msg.row == {"id": 3, "value": 1.25, "name": "é"}


def test_digest_is_sha256_of_sorted_canonical_rows():
    rows = [{"id": 2, "b": 1, "a": "x"}, {"id": 1, "value": 0.5}]
    expected = hashlib.sha256(b'{"id":1,"value":0.5}\n{"a":"x","b":1,"id":2}').hexdigest()
    assert wire.table_digest(rows) == expected
    end = wire.decode(wire.encode_end("0001", "s", 9, 1, 2, expected))
    assert (end.row_count, end.digest) == (2, expected)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"\xff\xfe not json", "not UTF-8 JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"sensor": "a", "session": "s", "kind": "update", "ts": 1}', "missing field 'seq'"),
        (b'{"sensor": "a", "session": "s", "seq": "3", "kind": "update", "ts": 1}', "'seq' is not"),
        (b'{"sensor": "a", "session": "s", "seq": true, "kind": "end", "ts": 1}', "'seq' is not"),
        (b'{"sensor": "a", "session": "s", "seq": 1, "kind": "update", "ts": 1, "op": "merge"}', "'op'"),
        (b'{"sensor": "a", "session": "s", "seq": 0, "kind": "snapshot", "ts": 1, "rows": 3}', "'rows'"),
        (
            b'{"sensor": "a", "session": "s", "seq": 4, "kind": "end", "ts": 1, "rows": 1, "digest": "zz"}',
            "digest",
        ),
        (b'{"sensor": "a", "session": "s", "seq": 4, "kind": "hello", "ts": 1}', "'kind'"),
    ],
)
def test_malformed_values_are_rejected_with_the_rule_they_break(value, reason):
    with pytest.raises(wire.MalformedMessage, match=reason):
        wire.decode(value)


def test_key_must_equal_session():
    raw = wire.encode_update("a", "s-1", 1, 1, "delete", {"id": 1})
    with pytest.raises(wire.MalformedMessage, match="key"):
        wire.decode(raw, key=b"s-2")


@pytest.mark.parametrize(
    ("sensor", "session"),
    [("0007", "0007-0123456789ab-00001"), ('a%d"b', "s%%1\\é\n\u2028"), ("", "x")],
)
def test_update_templates_encode_byte_for_byte_what_encode_update_does(sensor, session):
    rng = random.Random(7)
    templates = wire.update_templates(sensor, session)
    rows = [
        {"id": 3, "value": 101.234, "status": "ok", "name": "pressure-3", "unit": "kPa"},
        {"id": 0, "value": -0.0, "status": 'al"arm', "name": "é/\\%s", "unit": "l/min"},
        {"id": 2**40, "value": 1e-7, "x1": 1e16, "x2": 12345678.125},
        {"id": 9},
    ]
    rows += [
        {"id": rng.randrange(10**6), "value": rng.uniform(-1e6, 1e6), "x1": rng.random()} for _ in range(200)
    ]
    for i, row in enumerate(rows):
        op = "delete" if len(row) == 1 else "upsert"
        seq, ts = i * 7919, 1_795_000_000_000 + i
        fast = templates[op] % (seq, ts, wire.encode_row(row))
        assert fast == wire.encode_update(sensor, session, seq, ts, op, row)
        assert wire.decode(fast).row == row


def test_row_templates_filled_with_encoded_floats_encode_byte_for_byte_what_encode_row_does():
    rng = np.random.default_rng(3)
    values = np.concatenate([rng.normal(0, 1e3, 500), [0.0, -0.0, 1e-7, 1e16, 123456.789, 0.1, 2.5e-300]])
    frags = wire.encode_floats(values)
    assert len(frags) == len(values) and wire.encode_floats(values[:0]) == []
    for k, value in enumerate(values.tolist()):
        row = {"id": k, "value": value, "status": "al%arm", "name": 'p%s"-é', "unit": "%"}
        template = wire.row_template(row, ["value", "status"])
        assert template % (frags[k], wire.encode_row("al%arm")) == wire.encode_row(row)
    # Holes follow the row's key order whatever order they are named in; no hole leaves no %b.
    row = {"id": 1, "x2": 2.0, "x1": 1.0}
    assert wire.row_template(row, ["x1", "x2"]) % (b"2.0", b"1.0") == wire.encode_row(row)
    assert wire.row_template({"id": 9}) == b'{"id":9}'


def _with(fields: dict, old: bytes, new: str) -> bytes:
    """An update of ``fields`` and row ``{"id": 1, "v": 1}`` with one piece of its JSON text replaced."""
    return wire.orjson.dumps({**fields, "row": {"id": 1, "v": 1}}).replace(old, new.encode())


def _variants() -> list[bytes]:
    """Valid updates and near misses of every rule an update must keep."""
    good = {"sensor": "a", "session": "s-1", "seq": 3, "kind": "update", "ts": 7, "op": "upsert"}
    row = {"id": 1, "v": 0.5}
    out = [
        wire.encode_update("a", "s-1", 3, 7, "upsert", row),
        wire.encode_update("a", "s-1", 3, 7, "delete", {"id": 1}),
    ]
    bad_values = {
        "sensor": [None, 5],
        "session": ["", "s-2", 1],
        "seq": [-1, True, 3.0, "3"],
        "ts": [1.5, None, False],
        "kind": ["snapshot", "end", "upd"],
        "op": ["merge", None],
    }
    for field, values in bad_values.items():
        for value in values:
            out.append(wire.orjson.dumps({**good, field: value, "row": row}))
        out.append(wire.orjson.dumps({**{k: v for k, v in good.items() if k != field}, "row": row}))
    for bad_row in [None, [], {"v": 1}, {"id": "1", "v": 1}, {"id": True, "v": 1}, {"id": 1}]:
        out.append(wire.orjson.dumps({**good, "row": bad_row}))
    out += [b"not json", b"[]", b"", b'{"seq": 3, "seq": -1}']
    # Repeated keys: the last one counts, in both.
    out.append(wire.encode_update("a", "s-1", 3, 7, "upsert", row)[:-1] + b',"seq":4}')
    out.append(wire.encode_update("a", "s-1", 3, 7, "upsert", row)[:-1] + b',"kind":"end"}')
    # Integers at the edges of int64; beyond 64 bits orjson makes them floats, which break these rules.
    for big in (2**63 - 1, -(2**63), 2**70, -(2**70)):
        out.append(_with(good, b'"ts":7', f'"ts":{big}'))
        out.append(_with(good, b'"id":1', f'"id":{big}'))
        if 0 <= big < 2**63:
            out.append(_with(good, b'"seq":3', f'"seq":{big}'))
        if -(2**63) <= big < 2**63:
            out.append(_with(good, b'"v":1', f'"v":{big}'))
    out += [
        wire.encode_update("a", "s-1", 3, 7, "upsert", row).replace(b'"v":0.5', rb'"v":"\ud800"'),
        b'{"sensor":"a\xff","session":"s-1","seq":3,"kind":"update","ts":7,"op":"upsert","row":{"id":1,"v":1}}',
        wire.encode_update("a", "s-1", 3, 7, "upsert", row) + b" x",
        wire.encode_update("a", "s-1", 3, 7, "upsert", row).replace(b'"v":0.5', b'"v":NaN'),
        wire.encode_update("a", "s-1", 3, 7, "upsert", row).replace(b'"v":0.5', b'"v":1e400'),
    ]
    # Invalid JSON inside a field an update does not have.
    for extra in (b'"x":"\xff"', b'"x":1e400', b'"x":-1e400', b'"x":[1,{"a\xff":"b"}]', b'"x\xff":1'):
        out.append(wire.encode_update("a", "s-1", 3, 7, "upsert", row)[:-1] + b"," + extra + b"}")
    return out


def _left_to_decode() -> list[bytes]:
    """Valid updates that the hot path leaves to ``decode``: values its schema does not take.

    These cost the general path's time, and nothing else: ``decode`` accepts them as it always did.
    """
    good = {"sensor": "a", "session": "s-1", "seq": 3, "kind": "update", "ts": 7, "op": "upsert"}
    out = [
        wire.encode_update("a", "s-1", 3, 7, "upsert", {"id": 1, "v": [1, 2]}),
        wire.encode_update("a", "s-1", 3, 7, "upsert", {"id": 1, "v": {"x": 0.5}}),
        # Integers beyond int64: orjson keeps those below 2**64 as integers and makes the others floats.
        _with(good, b'"v":1', f'"v":{2**64 - 1}'),
        _with(good, b'"v":1', f'"v":{2**70}'),
        _with(good, b'"v":1', f'"v":{-(2**70)}'),
        _with(good, b'"seq":3', f'"seq":{2**63}'),
        # A field an update does not have (the wire format allows them).
        wire.encode_update("a", "s-1", 3, 7, "upsert", {"id": 1, "v": 1})[:-1] + b',"note":"x"}',
    ]
    return out


@pytest.mark.parametrize("value", _variants())
def test_plain_update_accepts_exactly_the_updates_decode_accepts(value):
    try:
        msg = wire.decode(value, key=b"s-1")
    except wire.MalformedMessage:
        msg = None
    expected = None
    if msg is not None and msg.kind == "update":
        expected = (msg.sensor, msg.seq, msg.ts, msg.op, msg.row)
    assert wire.plain_update(value, b"s-1") == expected


@pytest.mark.parametrize("value", _left_to_decode())
def test_plain_update_leaves_updates_with_nested_or_huge_values_to_decode(value):
    assert wire.decode(value, key=b"s-1").kind == "update"
    assert wire.plain_update(value, b"s-1") is None

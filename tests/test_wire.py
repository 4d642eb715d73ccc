import hashlib

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

"""The replicated configuration's merge rule and its messages, without any node."""

from __future__ import annotations

import itertools
import json

import pytest

from episub.config.codec import (
    ConfigCodecError,
    Snapshot,
    SyncRequest,
    Update,
    decode,
    encode_snapshot,
    encode_sync,
    encode_update,
    entry_for,
    value_of,
)
from episub.config.state import ConfigLimitError, ConfigState, Entry

A, B = b"node-a", b"node-b"


def put(version: int, writer: bytes, value: object) -> Entry:
    return entry_for(value, version, writer)


def test_the_highest_version_wins_whatever_the_order() -> None:
    writes = [("k", put(1, A, "one")), ("k", put(3, B, "three")), ("k", put(2, A, "two"))]
    for order in itertools.permutations(writes):
        state = ConfigState()
        state.apply(order)
        assert value_of(state.get("k")) == "three"  # type: ignore[arg-type]
        assert state.version == 3


def test_a_tie_between_writers_goes_to_the_larger_writer_id_everywhere() -> None:
    one, two = ConfigState(), ConfigState()
    one.apply([("k", put(5, A, "from a")), ("k", put(5, B, "from b"))])
    two.apply([("k", put(5, B, "from b")), ("k", put(5, A, "from a"))])
    assert value_of(one.get("k")) == value_of(two.get("k")) == "from b"  # type: ignore[arg-type]


def test_a_delete_is_not_undone_by_an_older_write_arriving_late() -> None:
    state = ConfigState()
    state.apply([("k", put(1, A, 1)), ("k", Entry(2, A, "deleted", b""))])
    assert state.apply([("k", put(1, A, 1))]) == []
    assert state.get("k") is None and "k" in state.entries() and state.values() == {}


def test_the_version_never_goes_backwards() -> None:
    state = ConfigState()
    state.apply([("a", put(7, A, 1))])
    state.apply([("b", put(2, B, 1))])
    assert state.version == 7
    assert state.stamp_for_write(B) == (8, B)


def test_a_local_write_past_the_size_limit_is_refused_with_nothing_applied() -> None:
    state = ConfigState(max_bytes=1000)
    with pytest.raises(ConfigLimitError, match="more than its limit of 1000"):
        state.check_write({"big": put(1, A, "x" * 2000)})
    assert len(state) == 0


def test_a_local_write_past_the_key_limit_is_refused() -> None:
    state = ConfigState(max_keys=2)
    state.apply([("a", put(1, A, 1)), ("b", put(1, A, 1))])
    state.check_write({"a": put(2, A, 2)})  # a change of a held key is fine
    with pytest.raises(ConfigLimitError, match="3 keys"):
        state.check_write({"c": put(2, A, 1)})


def test_a_peer_entry_past_a_bound_is_dropped_and_counted() -> None:
    state = ConfigState(max_keys=1)
    assert state.apply([("a", put(1, A, 1)), ("b", put(2, A, 1))]) == ["a"]
    assert state.rejected == 1 and state.version == 1


def test_values_are_bytes_or_json_and_nothing_else() -> None:
    assert value_of(put(1, A, b"\x00\xff")) == b"\x00\xff"
    assert value_of(put(1, A, {"a": [1, 2.5, None]})) == {"a": [1, 2.5, None]}
    with pytest.raises(TypeError, match="bytes or JSON-serialisable, not set"):
        put(1, A, {1, 2})
    with pytest.raises(TypeError, match="JSON"):
        put(1, A, float("nan"))


def test_messages_round_trip() -> None:
    changes = {
        "flag": put(4, A, True),
        "blob": put(4, A, b"\x01"),
        "gone": Entry(4, A, "deleted", b""),
    }
    assert decode(encode_update(4, A, changes)) == Update(4, A, changes)
    assert decode(encode_sync(A, B, 0)) == SyncRequest(A, B, 0)
    assert decode(encode_snapshot([A, B], changes)) == Snapshot((A, B), changes)


@pytest.mark.parametrize(
    "raw",
    [
        b"\xff",
        b"[]",
        b'{"op": "nope"}',
        b'{"op": "update", "version": 0, "writer": "aa", "set": {}}',
        b'{"op": "update", "version": 1.5, "writer": "aa", "set": {}}',
        b'{"op": "update", "version": 1, "writer": "zz", "set": {}}',
        b'{"op": "update", "version": 1, "writer": "aa", "set": {"k": ["json", "{"]}}',
        b'{"op": "update", "version": 1, "writer": "aa", "set": {"k": ["bytes", "!!"]}}',
        b'{"op": "update", "version": 1, "writer": "aa", "set": {"k": ["deleted", "x"]}}',
        b'{"op": "update", "version": 1, "writer": "aa", "set": {"": ["json", "1"]}}',
        b'{"op": "update", "version": 1, "writer": "aa", "set": {"k": ["other", "1"]}}',
        b'{"op": "sync", "from": "aa", "to": "", "version": 1}',
        b'{"op": "snapshot", "for": "aa", "entries": {}}',
        b'{"op": "snapshot", "for": ["aa"], "entries": {"k": [1, "aa", "json"]}}',
        json.dumps({"op": "snapshot", "for": ["aa"] * 65, "entries": {}}).encode(),
    ],
)
def test_a_malformed_message_raises_the_codec_error_only(raw: bytes) -> None:
    with pytest.raises(ConfigCodecError):
        decode(raw)

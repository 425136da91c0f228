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
from episub.config.state import MAX_PENDING_UPDATES, ConfigLimitError, ConfigState, Entry

A, B = b"node-a", b"node-b"


def put(version: int, writer: bytes, value: object) -> Entry:
    return entry_for(value, version, writer)


def update(state: ConfigState, version: int, writer: bytes, **values: object) -> list[str]:
    return state.apply_update(version, {k: put(version, writer, v) for k, v in values.items()})


def test_the_highest_version_wins_whatever_the_order() -> None:
    writes = [(1, A, "one"), (3, B, "three"), (2, A, "two")]
    for order in itertools.permutations(writes):
        state = ConfigState()
        for version, writer, value in order:
            update(state, version, writer, k=value)
        assert value_of(state.get("k")) == "three"  # type: ignore[arg-type]
        assert (state.version, state.behind) == (3, False)


def test_a_tie_between_writers_goes_to_the_larger_writer_id_everywhere() -> None:
    one, two = ConfigState(), ConfigState()
    update(one, 1, A, k="from a"), update(one, 1, B, k="from b")
    update(two, 1, B, k="from b"), update(two, 1, A, k="from a")
    assert value_of(one.get("k")) == value_of(two.get("k")) == "from b"  # type: ignore[arg-type]


def test_a_delete_is_not_undone_by_an_older_write_arriving_late() -> None:
    state = ConfigState()
    update(state, 1, A, k=1)
    state.apply_update(2, {"k": Entry(2, A, "deleted", b"")})
    assert update(state, 1, A, k=1) == []
    assert state.get("k") is None and "k" in state.entries() and state.values() == {}


def test_the_version_never_passes_a_gap_and_an_update_above_it_waits() -> None:
    state = ConfigState()
    update(state, 1, A, a=1)
    assert update(state, 3, A, c=3) == []  # version 2 missing: kept aside, not applied
    assert (state.version, state.top, state.lag, state.behind) == (1, 3, 2, True)
    assert state.missing() == [2] and state.get("c") is None
    assert state.stamp_for_write(B) == (4, B)  # above every version known, held or not
    assert sorted(update(state, 2, A, b=2)) == ["b", "c"]  # fills the gap: 2, then 3
    assert (state.version, state.behind) == (3, False)
    assert {k: value_of(e) for k, e in state.values().items()} == {"a": 1, "b": 2, "c": 3}


def test_a_snapshot_moves_the_version_to_its_senders_and_an_older_one_is_ignored() -> None:
    sender = ConfigState()
    for version in (1, 2, 3):
        update(sender, version, A, k=version, **{f"k{version}": version})
    state = ConfigState()
    update(state, 1, A, k=1, k1=1)
    update(state, 5, A, k5=5)  # 4 missing as well
    assert state.merge_snapshot(sender.version, sender.entries())
    assert (state.version, state.top, state.missing()) == (3, 5, [4])
    assert value_of(state.get("k")) == 3 and state.get("k5") is None  # type: ignore[arg-type]
    assert state.merge_snapshot(2, {"k": put(2, A, 2)}) == []  # older than what is held
    update(state, 4, A, k=4)
    assert (state.version, state.behind) == (5, False) and state.get("k5") is not None


def test_a_reported_version_makes_the_replica_behind_until_it_holds_it() -> None:
    state = ConfigState()
    state.note_version(2)
    assert (state.behind, state.lag, state.missing()) == (True, 2, [1, 2])
    update(state, 1, A, a=1), update(state, 2, A, a=2)
    assert not state.behind


def test_updates_kept_above_a_gap_are_bounded_and_the_dropped_are_counted() -> None:
    state = ConfigState()
    for version in range(2, 2 + MAX_PENDING_UPDATES + 10):
        update(state, version, A, k=version)
    update(state, 5, A, k=5)  # a duplicate of a kept one: kept once
    assert state.pending_dropped == 10
    assert (state.version, state.top) == (0, MAX_PENDING_UPDATES + 11)
    update(state, 1, A, k=1)  # the kept ones apply; the dropped ones stay missing
    assert state.version == MAX_PENDING_UPDATES + 1 and state.behind
    small = ConfigState(max_bytes=200)
    update(small, 2, A, k="x" * 150)
    update(small, 3, A, k="y" * 150)  # past max_bytes of kept updates
    assert small.pending_dropped == 1


def test_a_local_write_past_the_size_limit_is_refused_with_nothing_applied() -> None:
    state = ConfigState(max_bytes=1000)
    with pytest.raises(ConfigLimitError, match="more than its limit of 1000"):
        state.check_write({"big": put(1, A, "x" * 2000)})
    assert len(state) == 0


def test_a_local_write_past_the_key_limit_is_refused() -> None:
    state = ConfigState(max_keys=2)
    state.apply_update(1, {"a": put(1, A, 1), "b": put(1, A, 1)})
    state.check_write({"a": put(2, A, 2)})  # a change of a held key is fine
    with pytest.raises(ConfigLimitError, match="3 keys"):
        state.check_write({"c": put(2, A, 1)})


def test_a_peer_entry_past_a_bound_is_dropped_and_counted() -> None:
    state = ConfigState(max_keys=1)
    assert state.apply_update(1, {"a": put(1, A, 1), "b": put(1, A, 1)}) == ["a"]
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
    assert decode(encode_snapshot([A, B], changes, 4)) == Snapshot((A, B), changes, 4, True)
    assert decode(encode_snapshot([A], {}, 0, ready=False)) == Snapshot((A,), {}, 0, False)
    # from a sender without version and ready (older): it claims version 0
    assert decode(b'{"op": "snapshot", "for": [], "entries": {}}') == Snapshot((), {}, 0, True)


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
        b'{"op": "snapshot", "for": [], "entries": {}, "version": -1}',
        b'{"op": "snapshot", "for": [], "entries": {}, "version": 1, "ready": 1}',
    ],
)
def test_a_malformed_message_raises_the_codec_error_only(raw: bytes) -> None:
    with pytest.raises(ConfigCodecError):
        decode(raw)

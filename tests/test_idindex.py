"""episub/proto/idindex.py: the seen ids' table (packed ids, open addressing) against a
dict, with ids whose hashes collide, serials past 2**32 and the table growing and
shrinking as ids flow through it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from episub.proto.idindex import IdIndex


class Colliding(bytes):
    """An id whose hash is one of a few values: every lookup must confirm the whole id."""

    def __hash__(self) -> int:
        return self[0] % 3


def _id(n: int, colliding: bool) -> bytes:
    raw = n.to_bytes(32, "big")
    return Colliding(raw) if colliding else raw


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), st.integers(0, 40)), max_size=300),
    st.booleans(),
    st.sampled_from([0, 2**32 - 40, 2**33 + 5]),
)
def test_index_answers_as_a_dict_does(
    ops: list[tuple[bool, int]], colliding: bool, start: int
) -> None:
    """Adds (a new id at the next serial, or the held one's serial back) and removals
    (oldest first, as seen expires, or any one, as a taken-again id is) against a model."""
    index = IdIndex()
    index.base = index.next = start
    model: dict[bytes, int] = {}
    for add, n in ops:
        mid = _id(n, colliding)
        if add:
            serial = index.add(mid)
            if mid in model:
                assert serial == -1 - model[mid]
            else:
                assert serial == start + len_rows(index) - 1
                model[mid] = serial
        elif model:
            victim = min(model.values()) if n % 2 else sorted(model.values())[n % len(model)]
            assert index.remove(victim)
            assert not index.remove(victim)  # a second time: not held
            (gone,) = [m for m, serial in model.items() if serial == victim]
            assert index.id_of(victim) == gone
            del model[gone]
        assert len(index) == len(model)
        for held, serial in model.items():
            assert index.find(held) == serial and held in index
            assert index.id_of(serial) == held
        for other in range(41):
            if _id(other, colliding) not in model:
                assert index.find(_id(other, colliding)) == -1
        assert list(index) == sorted(model, key=model.__getitem__)
        slots = len(index._slots)
        assert slots == 8 or 8 * len(model) >= slots // 2  # shrinks as ids go


def len_rows(index: IdIndex) -> int:
    return index.next - index.base


def test_rows_given_back_and_the_rest_still_found() -> None:
    index = IdIndex()
    ids = [n.to_bytes(32, "big") for n in range(1000)]
    for mid in ids:
        index.add(mid)
    for serial in range(600):
        assert index.remove(serial)
    index.drop_before(600)
    assert len(index._ids) == 400 * 32 and index.base == 600
    assert [index.find(mid) for mid in ids[600:]] == list(range(600, 1000))
    assert all(index.find(mid) == -1 for mid in ids[:600])


def test_an_id_of_another_size_is_refused() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        IdIndex().add(b"short")

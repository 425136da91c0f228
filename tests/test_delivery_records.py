"""What the node delivers: made as the dataclass makes it; held by the subscriber's bounded
buffer, where many items in or out at once are what one at a time gives."""

from __future__ import annotations

import pickle
from dataclasses import FrozenInstanceError, fields

import pytest
from hypothesis import given
from hypothesis import strategies as st

from episub.records import Delivery, Item, LagBuffer, Lagged, Lost, make_delivery

# An operation: ("put", n) puts n new items, ("lag", n) adds n lost upstream, ("take", limit)
# takes up to `limit` items (None: all).
OPERATIONS = st.lists(
    st.tuples(st.just("put"), st.integers(0, 6))
    | st.tuples(st.just("lag"), st.integers(1, 3))
    | st.tuples(st.just("take"), st.none() | st.integers(0, 6)),
    max_size=30,
)


def _one_at_a_time(buffer: LagBuffer, op: str, arg: int | None, items: list[Item]) -> list[Item]:
    if op == "put":
        for item in items:
            buffer.put(item)
    elif op == "lag":
        buffer.add_lag(arg or 0)
    else:
        out: list[Item] = []
        while (arg is None or len(out) < arg) and (item := buffer.take()) is not None:
            out.append(item)
        return out
    return []


def _at_once(buffer: LagBuffer, op: str, arg: int | None, items: list[Item]) -> list[Item]:
    if op == "put":
        buffer.put_many(items)
    elif op == "lag":
        buffer.add_lag(arg or 0)
    else:
        return buffer.take_many(arg)
    return []


@given(capacity=st.integers(1, 8), operations=OPERATIONS)
def test_put_many_and_take_many_are_put_and_take_item_by_item(
    capacity: int, operations: list[tuple[str, int | None]]
) -> None:
    one, many = LagBuffer(capacity), LagBuffer(capacity)
    serial = 0
    for op, arg in operations:
        items: list[Item] = []
        if op == "put":
            items = [Lost(b"p", serial + i, serial + i) for i in range(arg or 0)]
            serial += len(items)
        assert _at_once(many, op, arg, items) == _one_at_a_time(one, op, arg, items)
        assert many.dropped == one.dropped
    assert many.take_many() == _one_at_a_time(one, "take", None, [])
    assert many.take() is None and many.take_many() == []


def test_take_many_gives_the_lag_after_the_items_before_it() -> None:
    buffer = LagBuffer(2)
    buffer.put_many([Lost(b"p", 0, 0), Lost(b"p", 1, 1), Lost(b"p", 2, 2)])  # the third dropped
    assert buffer.take_many(1) == [Lost(b"p", 0, 0)]
    assert buffer.take_many() == [Lost(b"p", 1, 1), Lagged(1)]


def test_make_delivery_is_the_dataclass_made_with_every_field() -> None:
    # A field added to Delivery and not to make_delivery fails here (an unexpected keyword).
    values = {
        "topic": "t",
        "publisher": b"p",
        "seq": 3,
        "timestamp_ms": 4,
        "key": b"k",
        "value": b"v",
        "headers": (("h", b"x"),),
        "id": b"i" * 32,
    }
    assert [f.name for f in fields(Delivery)] == list(values)
    made = make_delivery(**values)  # type: ignore[arg-type]
    assert made == Delivery(**values)  # type: ignore[arg-type]
    assert hash(made) == hash(Delivery(**values))  # type: ignore[arg-type]
    assert pickle.loads(pickle.dumps(made)) == made
    with pytest.raises(FrozenInstanceError):
        made.seq = 5  # type: ignore[misc]

"""Framing on a stream: items encoded once and packed by budget; frames read back whole."""

from __future__ import annotations

import struct
from collections import deque
from functools import partial

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from episub.net.framing import (
    FRAME_OVERHEAD,
    PIGGYBACK_BUDGET,
    max_frame_size,
    take_frame,
    take_frames,
)
from episub.proto.messages import GetTopics, Ping, Prune, Topics
from episub.proto.wire import (
    FrameDecoder,
    FrameError,
    encode_frame,
    encode_item,
    frame_from_items,
)
from tests.net_helpers import FrameReader

ITEMS = [
    ("t", Ping(nonce=7, want_view=True)),
    (None, GetTopics()),
    ("other", Prune()),
    (None, Topics(topics=("a", "b"))),
]


def decode(frame: bytes) -> list[tuple[str | None, object]]:
    decoder = FrameDecoder(max_frame_size=1 << 20)
    decoder.feed(frame)
    items = decoder.next_frame()
    assert items is not None and decoder.next_frame() is None
    return items


def test_a_frame_of_items_encoded_one_by_one_is_the_frame_encoded_at_once() -> None:
    assert take_frame(deque(encode_item(t, m) for t, m in ITEMS))[0] == encode_frame(ITEMS)


def test_take_frame_drains_everything_queued_into_one_frame_in_order() -> None:
    queue = deque(encode_item(t, m) for t, m in ITEMS)
    frame, count = take_frame(queue)
    assert count == len(ITEMS) and not queue
    assert decode(frame) == ITEMS


def test_take_frame_stops_at_the_byte_budget_and_leaves_the_rest_queued() -> None:
    item = encode_item("t", Ping(nonce=1))
    queue = deque([item] * 10)
    frame, count = take_frame(queue, budget=len(item) * 3)
    assert count == 3 and len(queue) == 7
    assert len(frame) == 4 + 3 * len(item)


def test_take_frame_always_takes_one_item_even_over_budget() -> None:
    queue = deque([encode_item("t", Ping(nonce=1))] * 2)
    _, count = take_frame(queue, budget=1)
    assert count == 1 and len(queue) == 1


def test_take_frame_keeps_to_the_decoders_item_limit() -> None:
    queue = deque([encode_item("t", Prune())] * 10)
    _, count = take_frame(queue, max_items=4)
    assert count == 4


@given(
    sizes=st.lists(st.integers(1, 300), min_size=1, max_size=40),
    budget=st.integers(1, 2000),
    max_items=st.integers(1, 50),
)
def test_take_frame_takes_the_items_in_line_while_the_body_stays_within_budget(
    sizes: list[int], budget: int, max_items: int
) -> None:
    # The rule, one item at a time: the first always, then each next one while the frame
    # has fewer than max_items and the body stays within budget.
    items = [bytes([i % 256]) * size for i, size in enumerate(sizes)]
    expected = 1
    body = sizes[0]
    while expected < min(len(sizes), max_items) and body + sizes[expected] <= budget:
        body += sizes[expected]
        expected += 1
    queue = deque(items)
    frame, count = take_frame(queue, budget=budget, max_items=max_items)
    assert count == expected
    assert frame == frame_from_items(items[:expected])
    assert list(queue) == items[expected:]


def test_the_frame_limit_is_a_maximal_message_plus_the_overhead() -> None:
    assert max_frame_size(1000) == 1000 + FRAME_OVERHEAD


async def _reader_over(chunks: list[bytes], *, max_frame: int = 1 << 16) -> list[object]:
    """Frames a FrameReader returns for `chunks` sent one by one, then EOF; a FrameError
    ends the list."""
    send, receive = trio.testing.memory_stream_one_way_pair()
    reader = FrameReader(receive, max_frame_size=max_frame)
    got: list[object] = []

    async def sender() -> None:
        for chunk in chunks:
            await send.send_all(chunk)
            await trio.testing.wait_all_tasks_blocked()
        await send.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender)
        try:
            while (frame := await reader.receive_frame()) is not None:
                got.append(frame)
            got.append(None)
        except FrameError as exc:
            got.append(exc)
    return got


def test_frames_arriving_one_byte_at_a_time_come_out_whole() -> None:
    data = encode_frame(ITEMS[:2]) + encode_frame(ITEMS[2:])
    got = trio.run(_reader_over, [data[i : i + 1] for i in range(len(data))])
    assert got == [ITEMS[:2], ITEMS[2:], None]


def test_a_clean_end_between_frames_is_none() -> None:
    assert trio.run(_reader_over, [encode_frame(ITEMS)]) == [ITEMS, None]


def test_an_end_inside_a_frame_is_a_frame_error() -> None:
    data = encode_frame(ITEMS)
    got = trio.run(_reader_over, [data[:-1]])
    assert isinstance(got[-1], FrameError)
    assert f"inside a frame ({len(data) - 1} bytes" in str(got[-1])


def test_a_huge_announced_length_is_refused_from_the_header_alone() -> None:
    got = trio.run(partial(_reader_over, [struct.pack(">I", 0xFFFFFFF0)], max_frame=1000))
    assert isinstance(got[0], FrameError)
    assert "4294967280 bytes announced" in str(got[0])


def test_garbage_after_good_frames_fails_only_after_they_are_handed_out() -> None:
    got = trio.run(_reader_over, [encode_frame(ITEMS) + b"\x00\x00\x00\x02\xff\xff"])
    assert got[0] == ITEMS
    assert isinstance(got[1], FrameError)


def test_bytes_fed_before_reading_count_and_come_first() -> None:
    async def main() -> None:
        send, receive = trio.testing.memory_stream_one_way_pair()
        reader = FrameReader(receive, max_frame_size=1 << 16)
        frame = encode_frame(ITEMS)
        reader.feed(frame[:5])
        await send.send_all(frame[5:])
        assert await reader.receive_frame() == ITEMS
        assert reader.bytes_received == len(frame)

    trio.run(main)


def test_take_frame_refuses_an_empty_queue() -> None:
    with pytest.raises(ValueError, match="at least one"):
        take_frame(deque())


def test_take_frames_drains_a_queue_bigger_than_a_frame_into_one_write_in_order() -> None:
    item = encode_item("t", Ping(nonce=1))
    many = 3 * (PIGGYBACK_BUDGET // len(item))  # three frames' worth
    queue = deque([item] * many)
    data, count, frames = take_frames(queue)
    assert (count, len(queue)) == (many, 0) and frames >= 3
    decoder = FrameDecoder(max_frame_size=1 << 20)
    decoder.feed(data)
    got = []
    while (frame := decoder.next_frame()) is not None:
        got += frame
    assert got == [("t", Ping(nonce=1))] * many


def test_take_frames_of_one_queued_item_is_that_items_frame() -> None:
    # The one-item shortcut (a flush per input) writes what the general path writes.
    item = encode_item("t", Ping(nonce=7))
    queue = deque([item])
    assert take_frames(queue) == (frame_from_items([item]), 1, 1)
    assert not queue


def test_take_frames_stops_at_its_budget_and_leaves_the_rest_queued() -> None:
    item = encode_item("t", Ping(nonce=1))
    queue = deque([item] * 100)
    data, count, frames = take_frames(queue, budget=10 * len(item))
    assert len(queue) == 100 - count and 0 < count < 100 and frames >= 1
    assert len(data) <= 10 * len(item) + frames * 4 + len(item)

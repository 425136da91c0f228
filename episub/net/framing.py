"""Frames on a connection: their sizes, and queued items packed into them.

Reading: a connection (connection.py) reads at most `READ_CHUNK` bytes at a time into a
wire.FrameDecoder and hands out every whole frame it then holds, so what the decoder holds
stays below one chunk plus one unfinished frame, itself bounded by `max_frame_size`.

Writing: the runtime encodes each message once (`wire.encode_item`) and queues the bytes
per peer. `take_frames` drains what is queued into frames (piggybacking) up to a byte budget
per frame and the decoder's item limit, and up to `WRITE_BUDGET` in all, so a burst of
messages costs one seal and one write.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from itertools import accumulate, islice

from episub.proto.framing import LENGTH_PREFIX
from episub.proto.wire import MAX_ITEMS_PER_FRAME, frame_from_items

__all__ = [
    "FRAME_OVERHEAD",
    "PIGGYBACK_BUDGET",
    "READ_CHUNK",
    "WRITE_BUDGET",
    "max_frame_size",
    "take_frame",
    "take_frames",
]

# What a frame may carry beyond one message of max_message_size: the GOSSIP's id, hops,
# publisher, topic (<= 256 bytes), protobuf tags and lengths of up to 64 headers, and the
# small control messages piggybacked beside it. An IHAVE of 1024 ids is ~38 KiB and a
# NODES of 256 peers ~17 KiB, so 64 KiB covers the largest control message as well.
FRAME_OVERHEAD = 64 * 1024  # guess, from the sizes above
# How much queued traffic one frame gathers: big enough that a tick's control messages go
# out as one write, small enough that a queue of large messages interleaves with others.
PIGGYBACK_BUDGET = 64 * 1024  # guess: a typical TCP send window's worth
READ_CHUNK = 64 * 1024  # trio's own default for receive_some in its examples
# What one write carries at most: a few frames, sealed together. Guess: big enough that a
# burst costs few system calls, small enough to interleave with reading.
WRITE_BUDGET = 256 * 1024


def max_frame_size(max_message_size: int) -> int:
    """The largest frame a node accepts: one maximal message plus `FRAME_OVERHEAD`."""
    return max_message_size + FRAME_OVERHEAD


def take_frames(queue: deque[bytes], *, budget: int = WRITE_BUDGET) -> tuple[bytes, int, int]:
    """Pop queued items into back-to-back frames, up to `budget` bytes in all (the first
    frame always goes): (their bytes, number of items, number of frames)."""
    if len(queue) == 1:  # one item waiting (a flush per input): its frame, in line
        item = queue.popleft()
        return LENGTH_PREFIX.pack(len(item)) + item, 1, 1
    frame, count = take_frame(queue, budget=min(PIGGYBACK_BUDGET, budget))
    if not queue or len(frame) >= budget:
        return frame, count, 1
    frames = [frame]
    size = len(frame)
    while queue and size < budget:
        frame, taken = take_frame(queue, budget=min(PIGGYBACK_BUDGET, budget - size))
        frames.append(frame)
        size += len(frame)
        count += taken
    return b"".join(frames), count, len(frames)


def take_frame(
    queue: deque[bytes],
    *,
    budget: int = PIGGYBACK_BUDGET,
    max_items: int = MAX_ITEMS_PER_FRAME,
) -> tuple[bytes, int]:
    """Pop queued items into one frame: (frame bytes, number of items).

    Items go in queue order while the body stays within `budget`; the first item always
    goes, whatever its size (the caller refuses items the peer would not accept).
    """
    if not queue:
        raise ValueError("take_frame needs at least one queued item")
    first = queue.popleft()
    more = 0  # items after the first that fit: the running sizes of those next, in C
    if queue:
        sizes = list(accumulate(map(len, islice(queue, max_items - 1))))
        more = bisect_right(sizes, budget - len(first))  # sizes only grow: a prefix fits
    if more == len(queue):
        items = [first, *queue]
        queue.clear()
    else:
        items = [first, *islice(queue, more)]
        for _ in range(more):
            queue.popleft()
    return frame_from_items(items), len(items)

"""Length-prefixed frames: a 4-byte big-endian length, then that many bytes of body.

The node wire (wire.py: each body one protobuf `Frame` of items) and the agent protocol
(episub/agent/wire.py: each body one `Request` or `Response`) frame this way, with this
one decoder and its one bound: `FrameSplitter` checks each length as soon as its 4 bytes
are here, so a header announcing more than `max_size` is refused from the header alone
and its body is never held. Sans-IO (h11's manner): feed bytes, take bodies.
"""

from __future__ import annotations

import struct

__all__ = [
    "LENGTH_PREFIX",
    "LENGTH_PREFIX_SIZE",
    "MAX_ENCODABLE_FRAME",
    "FrameError",
    "FrameSplitter",
    "frame",
]

LENGTH_PREFIX = struct.Struct(">I")
LENGTH_PREFIX_SIZE = LENGTH_PREFIX.size
# What a 4-byte length can announce at all.
MAX_ENCODABLE_FRAME = (1 << 32) - 1
# Bodies from this size on are copied out of the read buffer through a view (one copy, not
# a slice and then its bytes): a view costs ~1 us, a second copy of 64 KiB several.
_COPY_THROUGH_VIEW = 64 * 1024


class FrameError(ValueError):
    """The peer sent bytes that are not a valid frame: drop the connection.

    The stream cannot be resynchronised after one."""


def frame(body: bytes) -> bytes:
    """`body` with its length prefix."""
    if len(body) > MAX_ENCODABLE_FRAME:
        raise ValueError(f"frame of {len(body)} bytes does not fit a 4-byte length")
    return LENGTH_PREFIX.pack(len(body)) + body


class FrameSplitter:
    """Turns the bytes of one stream into frame bodies.

    `feed()` whatever arrives, then call `next_body()` until it returns None. Bodies that
    are complete but not yet taken stay buffered in full, so the caller bounds them by the
    size of what it feeds at once; the unfinished frame at the end is bounded here, by
    `max_size`. Bodies must be `min_size`..`max_size` bytes (the node wire has no empty
    frame; an agent message may be empty). A bad length is raised by `next_body()` once the
    bodies before it are taken; after any error the splitter only raises.
    """

    def __init__(self, max_size: int, *, min_size: int = 0) -> None:
        if not 0 < max_size <= MAX_ENCODABLE_FRAME:
            raise ValueError(f"max_size must be 1..{MAX_ENCODABLE_FRAME} bytes, not {max_size!r}")
        if not 0 <= min_size <= max_size:
            raise ValueError(f"min_size must be 0..{max_size}, not {min_size!r}")
        self.max_size = max_size
        self.min_size = min_size
        self._buffer = bytearray()
        # _buffer[:_complete] is whole frames whose headers were checked; after it, at most
        # one unfinished frame.
        self._complete = 0
        # A bad header found by feed() behind complete frames, raised once those are taken.
        self._pending_error: FrameError | None = None
        self._broken = False

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as bodies."""
        return len(self._buffer)

    def feed(self, data: bytes | bytearray) -> None:
        """Buffer `data`; a bad frame header in it is reported by a later `next_body()`."""
        if self._broken:  # check_usable(), inline: this runs per read
            self.check_usable()
        if self._pending_error is not None:
            return  # nothing after a bad header can be framed; don't hold it
        self._buffer += data
        self._scan()

    def whole_body(self, data: bytes) -> bytes | None:
        """The body of `data` when nothing is buffered and `data` is exactly one frame with
        a valid header (the usual read: taken without buffering it); else None, and `data`
        is for `feed()`."""
        if self._buffer or self._broken or self._pending_error or len(data) < LENGTH_PREFIX_SIZE:
            return None
        (length,) = LENGTH_PREFIX.unpack_from(data)
        if len(data) - LENGTH_PREFIX_SIZE != length or not self.min_size <= length <= self.max_size:
            return None
        return data[LENGTH_PREFIX_SIZE:]

    def next_body(self) -> bytes | None:
        """The next whole frame's body, or None when more bytes are needed."""
        if self._broken:  # check_usable(), inline: this runs per frame
            self.check_usable()
        if self._complete == 0:
            if self._pending_error is not None:
                self.fail()
                raise self._pending_error
            return None
        (length,) = LENGTH_PREFIX.unpack_from(self._buffer)
        end = LENGTH_PREFIX_SIZE + length
        if length < _COPY_THROUGH_VIEW:
            body = bytes(self._buffer[LENGTH_PREFIX_SIZE:end])
        else:
            with memoryview(self._buffer) as view:  # one copy of the body, not two
                body = bytes(view[LENGTH_PREFIX_SIZE:end])
        del self._buffer[:end]
        self._complete -= end
        return body

    def fail(self) -> None:
        """A body turned out bad (its caller could not decode it): only raise from now on."""
        self._broken = True
        self._buffer.clear()
        self._complete = 0

    def check_usable(self) -> None:
        if self._broken:
            raise FrameError("decoder is in error state after an invalid frame")

    def _scan(self) -> None:
        """Advance `_complete` over whole frames, checking each header as soon as it is here."""
        buffer = self._buffer
        while len(buffer) - self._complete >= LENGTH_PREFIX_SIZE:
            (length,) = LENGTH_PREFIX.unpack_from(buffer, self._complete)
            if not self.min_size <= length <= self.max_size:
                what = "empty frame" if length == 0 else f"frame of {length} bytes announced"
                self._pending_error = FrameError(
                    f"{what}; frames must be {self.min_size}..{self.max_size} bytes"
                )
                del buffer[self._complete :]
                return
            end = self._complete + LENGTH_PREFIX_SIZE + length
            if len(buffer) < end:
                return
            self._complete = end

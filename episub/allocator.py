"""The C allocator under a node process: keep large blocks out of glibc's heap, and give
free memory back to the OS when the node is quiet after a large release.

CPython takes every block over 512 bytes from the C allocator (glibc's malloc on Linux),
and two of glibc's habits cost a node memory it does not use:

- glibc serves a block of at least its mmap threshold (128 KiB at start) with a mapping
  of its own, returned whole when freed; but each time such a block is freed it raises
  the threshold to that block's size (up to 32 MiB), and from then on blocks of that size
  come from the heap. A table's old copy left when it grows, or a 1 MB agent request once
  answered, then stays in the heap as free memory that small objects split and pin.
  `limit_heap_growth` fixes the threshold at its start value, which also stops the rise
  (mallopt(3)): large blocks keep their own mappings (a list or an array that grows is
  moved with mremap, without a copy).
- Free memory between live blocks goes back to the OS only through `malloc_trim`, which
  walks the heap's free chunks and returns their whole pages (`release_free_memory`).
  `ReleaseWatch` calls it once a node has been quiet after letting go of many messages:
  while messages flow, the memory freed is taken again at once, and trimming would only
  cost page faults.

Without glibc (musl, macOS, Windows) both do nothing. No I/O; the caller keeps the time.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable
from functools import cache

__all__ = ["ReleaseWatch", "limit_heap_growth", "release_free_memory"]

log = logging.getLogger("episub.allocator")

_M_MMAP_THRESHOLD = -3  # mallopt(3) parameter numbers, from glibc's malloc.h
MMAP_THRESHOLD = 128 * 1024  # glibc's own start value; blocks this big get a mapping
RELEASE_AFTER = 16 * 1024 * 1024  # bytes let go before a quiet node trims: guess, ~1/4 of
# retention's default 64 MiB (a trim costs ~1-10 ms on a heap of ~100 MB; far smaller
# releases are taken again by the next messages anyway)


@cache
def _glibc() -> ctypes.CDLL | None:
    """The process's C library, if it is glibc (the one with mallopt and malloc_trim)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # noqa: B018 (glibc names it; musl and others do not)
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.malloc_trim.argtypes = (ctypes.c_size_t,)
    except (OSError, AttributeError, TypeError):
        return None
    return libc


def limit_heap_growth() -> bool:
    """Fix glibc's mmap threshold (see the module's docstring); False without glibc.
    Called once, when a node process starts."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def release_free_memory() -> bool:
    """Give the heap's free pages back to the OS (glibc's malloc_trim); False without
    glibc, or when there was nothing to give."""
    libc = _glibc()
    return False if libc is None else bool(libc.malloc_trim(0))


class ReleaseWatch:
    """Trims once `released()` (bytes a node's tables have let go, counted from any start)
    has grown by at least `release_after` since the last trim, and has not moved since the
    previous `check`: call `check` at a steady interval (a second), and the node trims
    one interval after a large release ends, never while messages flow. `before_trim`
    runs first (the node copies retention's columns to their size, so the room they grew
    to is free to give back)."""

    __slots__ = ("_before_trim", "_last", "_released", "_trimmed_at", "release_after", "trims")

    def __init__(
        self,
        released: Callable[[], int],
        release_after: int = RELEASE_AFTER,
        before_trim: Callable[[], object] | None = None,
    ) -> None:
        self._released = released
        self._before_trim = before_trim  # e.g. tables copied to their size, freeing the room
        self.release_after = release_after
        self._trimmed_at = self._last = released()
        self.trims = 0

    def pending(self) -> bool:
        """Has `released()` moved since the last `check`, or is a trim due? Then the next
        `check` should come soon (a steady interval); otherwise it can wait."""
        now = self._released()
        return now != self._last or now - self._trimmed_at >= self.release_after

    def check(self) -> bool:
        """Trim if the rule says so; True when it did."""
        now = self._released()
        quiet, self._last = now == self._last, now
        if not quiet or now - self._trimmed_at < self.release_after:
            return False
        self._trimmed_at = now
        self.trims += 1
        if self._before_trim is not None:
            self._before_trim()
        release_free_memory()
        return True

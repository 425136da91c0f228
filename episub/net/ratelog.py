"""Log lines that a peer can provoke, at most one per kind per interval, with a count.

A hostile peer can make a node report the same fault thousands of times a second (a
misbehaving message per frame item, a core error per frame). One line per kind per
`interval`, saying how many were left out since the last, keeps the log readable and its
size bounded by the number of kinds, not by the peer's sending rate.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable

__all__ = ["RateLimitedLog"]

# Kinds remembered at once: a kind is our own description of a fault (a message class, a
# reason), so there are few of them; the bound only guards against a bug that makes
# every line a kind of its own.
MAX_KINDS = 1024


class RateLimitedLog:
    """`log(kind, level, msg, *args)` writes at most one line per `kind` per `interval`
    seconds of `clock()`; the next line written for that kind says how many were left out.
    """

    def __init__(self, logger: logging.Logger, interval: float, clock: Callable[[], float]):
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, not {interval!r}")
        self._logger = logger
        self._interval = interval
        self._clock = clock
        self._last: dict[Hashable, float] = {}  # kind -> when its last line was written
        self._skipped: dict[Hashable, int] = {}  # kind -> lines left out since then

    def log(
        self,
        kind: Hashable,
        level: int,
        msg: str,
        *args: object,
        exc_info: BaseException | None = None,
    ) -> bool:
        """Write the line unless one of this kind went out less than `interval` ago;
        True if written."""
        now = self._clock()
        last = self._last.get(kind)
        if last is not None and now - last < self._interval:
            self._skipped[kind] = self._skipped.get(kind, 0) + 1
            return False
        skipped = self._skipped.pop(kind, 0)
        if skipped:
            msg = f"{msg} (and {skipped} more like it in the last {now - last:.0f} s)"  # type: ignore[operator]
        if last is None and len(self._last) >= MAX_KINDS:
            oldest = next(iter(self._last))
            del self._last[oldest]
            self._skipped.pop(oldest, None)
        self._last.pop(kind, None)
        self._last[kind] = now
        self._logger.log(level, msg, *args, exc_info=exc_info)
        return True

"""Log lines a stranger or a peer can cause, at most one per kind per interval, with a count.

A client without the key can fail handshakes as fast as it can connect; each failure
logged a ~200-byte WARNING, 600 KB in 12 s. A member can likewise misbehave,
or trip a core error, on every frame (episub/net/runtime.py). `LogLimiter` lets the first line
of a kind through, then at most one per `interval`; the next line that goes out says how
many of its kind were suppressed since the last one. Counters (node.stats()) still count
every event: the limit is on the log only.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable

__all__ = ["LOG_INTERVAL", "LogLimiter"]

LOG_INTERVAL = 60.0  # s; an operator sees the first failure at once, then one a minute


class LogLimiter:
    def __init__(self, logger: logging.Logger, interval: float = LOG_INTERVAL) -> None:
        self._logger = logger
        self._interval = interval
        # kind -> (when its last line went out, lines suppressed since). One entry per
        # kind the caller names: callers use a fixed set (failure reasons).
        self._kinds: dict[Hashable, tuple[float, int]] = {}

    def log(
        self,
        kind: Hashable,
        now: float,
        level: int,
        message: str,
        *args: object,
        exc_info: BaseException | None = None,
    ) -> bool:
        """Log `message % args` (with `exc_info`'s traceback, if given) unless a line of
        `kind` went out less than `interval` ago; returns whether it was logged."""
        last = self._kinds.get(kind)
        if last is not None and now - last[0] < self._interval:
            self._kinds[kind] = (last[0], last[1] + 1)
            return False
        suppressed = 0 if last is None else last[1]
        self._kinds[kind] = (now, 0)
        if suppressed:
            message += " (and %d more like it in the last %.0f s, not logged)"
            args = (*args, suppressed, now - last[0])  # type: ignore[index]
        self._logger.log(level, message, *args, exc_info=exc_info)
        return True

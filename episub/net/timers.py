"""When the core's timers fire: the runtime's timer queue, with the rules that save wakeups.

The core says how long (`ScheduleTimer.delay`) and how late or early a timer may fire
(its hints); this queue decides the instant, on trio's clock, and the runtime only sleeps
until the head and feeds the core what is due. No I/O and no clock here: `now` comes in,
so every rule is tested without trio.

Rules this queue keeps:
- A plain timer fires at `now + delay`.
- `coalesce` (pings, probes): rounded up to a whole TIMER_TICK of the epoch clock, which
  every node shares, so that a node's pings and its neighbours' come together and a
  process wakes for them once instead of once each.
- `upkeep` (stabilisation, optimisation, shuffles): rounded up to a TIMER_TICK of the
  node's own phase (from its id), so that nodes' upkeep decisions do not line up.
- Either hint with a delay of at least SLOW_TICK_AFTER (a settled node's upkeep): rounded
  up to a SLOW_TICK of the node's own phase, so its upkeep every 12-60 s shares wakeups.
- Timers due within TIMER_SLACK of each other fire in one wakeup.
- `early` (the IHAVE flush): the timer may fire up to that many seconds before its
  deadline while the node is awake for a message anyway (`take_early`); a timer taken
  early is gone from the queue.
"""

from __future__ import annotations

import heapq
import itertools
import math
import zlib
from collections.abc import Hashable, Sequence

__all__ = [
    "SLOW_TICK",
    "SLOW_TICK_AFTER",
    "TIMER_RETRY",
    "TIMER_SLACK",
    "TIMER_TICK",
    "TimerQueue",
]

# A wakeup of an idle process costs 100-300 us of CPU whatever it does (trio, cold caches,
# the VM), so upkeep costs what its wakeups cost. Guess: 2 s, a small part of the ping,
# probe, stabilisation and optimisation periods.
TIMER_TICK = 2.0
# Guess: a tenth of the settled ping period, half the settled stabilisation period: at
# most one timer wakeup per SLOW_TICK for a settled node's upkeep.
SLOW_TICK = 6.0
SLOW_TICK_AFTER = 4 * TIMER_TICK
# Guess: far below any protocol period, far above the rounding of the same instant
# reached by arithmetic on different clocks (as Linux's timer slack for sleeps).
TIMER_SLACK = 0.001
TIMER_RETRY = 1.0  # seconds before a timer the core failed on fires again (guess)

_Entry = tuple[float, int, Hashable]  # (deadline, seq, token): seq keeps equal deadlines in order


class TimerQueue:
    """The core's timers (and the runtime's own) by deadline, on trio's clock."""

    def __init__(self, *, node_id: bytes, epoch: float) -> None:
        """`epoch`: the epoch clock minus trio's (the shared ticks are whole seconds of the
        epoch clock); `node_id` spreads this node's own ticks over a tick."""
        self._heap: list[_Entry] = []
        self._seq = itertools.count()
        self._epoch = epoch
        self.phase = zlib.crc32(node_id) / 2**32 * TIMER_TICK
        # Entries that may fire early -> from when. A few at a time (one IHAVE flush per
        # topic); `_early_from` is a lower bound of those instants, so that a read looks
        # at none of them before one may fire.
        self._early: dict[_Entry, float] = {}
        self._early_from = math.inf

    def __len__(self) -> int:
        return len(self._heap)

    @property
    def head(self) -> float:
        """The earliest deadline (inf when no timer is set): what to sleep until."""
        heap = self._heap
        return heap[0][0] if heap else math.inf

    def schedule(
        self,
        now: float,
        delay: float,
        token: Hashable,
        *,
        coalesce: bool = False,
        upkeep: bool = False,
        early: float = 0.0,
    ) -> float:
        """Set `token` to fire `delay` seconds after `now`, as the hints allow (see the
        module docstring); returns its deadline."""
        deadline = now + delay
        if (coalesce or upkeep) and delay >= SLOW_TICK_AFTER:
            deadline = self._on_own_tick(deadline, SLOW_TICK)
        elif coalesce:
            epoch = self._epoch
            deadline = math.ceil((deadline + epoch) / TIMER_TICK) * TIMER_TICK - epoch
        elif upkeep:
            deadline = self._on_own_tick(deadline, TIMER_TICK)
        entry = (deadline, next(self._seq), token)
        heapq.heappush(self._heap, entry)
        if early > 0:
            self._early[entry] = deadline - early
            self._early_from = min(self._early_from, deadline - early)
        return deadline

    def upkeep_deadline(self, now: float, delay: float) -> float:
        """The first of this node's slow upkeep ticks at least `delay` seconds after `now`:
        for periodic work of the process, so that it wakes with the node's own upkeep."""
        return self._on_own_tick(now + delay, SLOW_TICK)

    def _on_own_tick(self, deadline: float, tick: float) -> float:
        phase = self.phase
        return math.ceil((deadline - phase) / tick) * tick + phase

    def pop_due(self, now: float) -> list[Hashable]:
        """The tokens due by `now` (within TIMER_SLACK), in deadline order, taken off."""
        heap = self._heap
        due: list[Hashable] = []
        horizon = now + TIMER_SLACK
        while heap and heap[0][0] <= horizon:
            entry = heapq.heappop(heap)
            if self._early:
                self._early.pop(entry, None)
            due.append(entry[2])
        return due

    def take_early(self, now: float) -> Sequence[Hashable]:
        """The tokens that may fire early and may by `now`, taken off; for a node awake
        anyway (what they send goes out with what woke it). Looked at on every read: most
        find none, at the cost of one comparison."""
        if self._early_from > now:
            return ()
        early = self._early
        due = [entry for entry, at in early.items() if at <= now]
        self._early_from = min((at for at in early.values() if at > now), default=math.inf)
        if not due:
            return ()
        heap = self._heap
        for entry in due:
            del early[entry]
            heap.remove(entry)
        heapq.heapify(heap)
        return [entry[2] for entry in due]

    def tokens(self) -> list[Hashable]:
        """Every token set, in no order (for tests and inspection)."""
        return [entry[2] for entry in self._heap]

    def deadline_of(self, token: Hashable) -> float | None:
        """The earliest deadline set for `token` (for tests and inspection)."""
        return min((d for d, _, t in self._heap if t == token), default=None)

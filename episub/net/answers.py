"""What a peer's requests may cost this node: its answers streamed within a budget, and its
requests throttled, then refused with the peer dropped, past their budget.

A peer with the key can ask much with little: one PULL of 4,096 seqs names 4 GB of 1 MB
messages. So an answer (the core's Sends marked `answer`: PULL, GRAFT over ranges,
history, GETHELD) is not encoded when the core makes it. It waits in the peer's
`AnswerLane` as a recipe (`make`: the message object the core already holds, encoded only
when taken) and is taken a batch at a time as the peer's send queue drains, at most
`ANSWER_BYTES_PER_SECOND` a peer. What is taken and when is the network's business
(network.py); this module keeps the lanes and the budgets, with no I/O and no clock (`now`
comes in).

Rules:
- A lane holds at most ANSWER_MAX_ITEMS answers and ANSWER_MAX_BYTES bytes: what a peer
  asks beyond that, while it does not read what it asked for, is dropped (counted).
- A repeat of an answer still waiting (same key: the message id) is merged with it.
- A lane goes with its peer's connection (`cancel`): what a gone peer asked is not made.
- Requests cost work (seqs or rows they make the node look at) from a token bucket of
  REQUEST_WORK_PER_SECOND (burst REQUEST_WORK_BURST): a request that finds the bucket
  empty is refused (throttled, counted); a peer that keeps asking until it owes a whole
  burst more is dropped (`over_budget`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "ANSWER_BYTES_PER_SECOND",
    "ANSWER_MAX_BYTES",
    "ANSWER_MAX_ITEMS",
    "REQUEST_WORK_BURST",
    "REQUEST_WORK_PER_SECOND",
    "AnswerCounters",
    "AnswerLane",
    "RequestBudget",
    "TokenBucket",
    "Verdict",
]

# Bytes of answers one peer may be sent per second, like a Kafka client quota
# (producer_byte_rate/consumer_byte_rate; unlimited by default there). A catch-up of 100 MB
# from one neighbour takes ~3 s; answering costs ~2.2-2.6 ms of CPU per MB on 2 shared
# cores (benchmarks/answer_cost.py), so one asking peer gets at most ~8-9% of one core.
ANSWER_BYTES_PER_SECOND = 32 * 1024 * 1024
ANSWER_BURST_BYTES = 8 * 1024 * 1024  # guess: a quarter second at the rate; ≥ max_frame_size/2
# Answers one peer may have waiting: two whole PULLs' worth of items (MAX_PULL_SPAN: 4,096).
ANSWER_MAX_ITEMS = 8192
# ...and bytes, counted at their encoded size: the messages are the store's own objects
# while it holds them, so this bounds what a lane can keep alive beyond them.
ANSWER_MAX_BYTES = 64 * 1024 * 1024  # guess: the retention default's size (64 MiB)
# Work (seqs or store rows a request makes the node look at) a peer's requests may cost per
# second, in the spirit of gossipsub v1.1's IWANT limit (GossipSubMaxIHaveLength: 5,000
# ids per peer per heartbeat). Guess: a page of 20,000 publishers' holdings or five
# MAX_PULL_SPAN PULLs a second; an honest catch-up asks far less.
REQUEST_WORK_PER_SECOND = 20_000.0
REQUEST_WORK_BURST = 40_000.0  # guess: two seconds' worth, so a catch-up's burst passes


class TokenBucket:
    """`rate` tokens a second, at most `burst` banked; may go into debt down to -`burst`."""

    __slots__ = ("_at", "burst", "level", "rate")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.level = burst
        self._at = now

    def refill(self, now: float) -> float:
        """The level now."""
        if now > self._at:
            self.level = min(self.burst, self.level + (now - self._at) * self.rate)
            self._at = now
        return self.level

    def wait(self, now: float) -> float:
        """Seconds until the level is positive again (0: it is)."""
        level = self.refill(now)
        return 0.0 if level > 0 else (1e-3 - level) / self.rate


@dataclass(slots=True)
class AnswerCounters:
    """As node.stats() reports them."""

    answers_sent: int = 0  # answer messages handed to a send queue
    answers_merged: int = 0  # repeats of an answer already waiting, merged with it
    answers_dropped: int = 0  # over a lane's bounds (the peer did not read what it asked)
    answers_cancelled: int = 0  # waiting when the asker's connection went
    answers_throttled: int = 0  # times a lane waited for its byte budget
    requests_throttled: int = 0  # requests refused: the peer's work budget was spent
    peers_over_budget: int = 0  # peers dropped for asking on past their budget


class AnswerLane:
    """One peer's answers waiting to be sent: key -> (size, make), in the order asked."""

    __slots__ = ("bucket", "bytes", "items", "timer_set")

    def __init__(self, now: float) -> None:
        self.items: OrderedDict[Hashable, tuple[int, Callable[[], bytes | None]]] = OrderedDict()
        self.bytes = 0
        self.bucket = TokenBucket(ANSWER_BYTES_PER_SECOND, ANSWER_BURST_BYTES, now)
        self.timer_set = False  # a wakeup for the byte budget is pending

    def __len__(self) -> int:
        return len(self.items)

    def add(
        self,
        key: Hashable,
        size: int,
        make: Callable[[], bytes | None],
        counters: AnswerCounters,
    ) -> None:
        if key in self.items:
            counters.answers_merged += 1
            return
        if len(self.items) >= ANSWER_MAX_ITEMS or self.bytes + size > ANSWER_MAX_BYTES:
            counters.answers_dropped += 1
            return
        self.items[key] = (size, make)
        self.bytes += size

    def take(self) -> tuple[int, Callable[[], bytes | None]]:
        """The oldest waiting answer (there is one)."""
        _, (size, make) = self.items.popitem(last=False)
        self.bytes -= size
        return size, make

    def idle(self, now: float) -> bool:
        """Empty, with its byte budget full again: forgetting it changes nothing."""
        bucket = self.bucket
        return not self.items and not self.timer_set and bucket.refill(now) >= bucket.burst

    def cancel(self, counters: AnswerCounters) -> None:
        counters.answers_cancelled += len(self.items)
        self.items.clear()
        self.bytes = 0


class Verdict(Enum):
    """What a request's charge says: serve it, refuse it, or refuse it and drop the peer."""

    OK = "ok"
    THROTTLED = "throttled"
    OVER = "over"


class RequestBudget:
    """One peer's work budget (REQUEST_WORK_PER_SECOND)."""

    __slots__ = ("bucket",)

    def __init__(self, now: float) -> None:
        self.bucket = TokenBucket(REQUEST_WORK_PER_SECOND, REQUEST_WORK_BURST, now)

    def charge(self, work: float, now: float) -> Verdict:
        """A refused request still costs its work, so a peer that asks on regardless goes
        deeper into debt, until it owes a whole burst: then it is dropped."""
        bucket = self.bucket
        level = bucket.refill(now)
        bucket.level = level - work
        if level > 0:
            return Verdict.OK
        return Verdict.OVER if bucket.level < -bucket.burst else Verdict.THROTTLED

    @property
    def idle(self) -> bool:
        """Owes nothing: forgetting it changes nothing for its peer."""
        return self.bucket.level >= self.bucket.burst

"""Fault injection: drop or delay chosen message kinds, and cut one direction of the network.

Three faults, each aimed at one repair path of the protocol:

- drop KIND=P: every send of that message kind is dropped with probability P (1.0: all).
  `graft=0.5` makes half the repairs fail, so the missing-message timer must try the next
  announcer; `ihave=1.0` removes lazy push entirely, so the eager tree alone must deliver.
- delay KIND=SECONDS: every send of that kind arrives SECONDS later than the link's delay
  (the simulator keeps no per-link FIFO, so a delayed message may be overtaken).
- one-way partition FRACTION@START-END: from START to END seconds after the first counted
  publish, a random FRACTION of the nodes, the sender among them, cannot send to the
  others, while the others still reach them. Nothing reports it (no ConnectionLost): a
  firewall that drops one direction, the nasty case, since both ends still believe the
  link stands. What the far side missed comes back through IHAVE/GRAFT from its own
  side and, after the heal, through the per-publisher gap pull.

Message kinds are the wire's names in lower case (`MESSAGE_KINDS`). A dropped or delayed
message still opens the connection, as a send into a lossy network does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from episub.proto import messages as m

# Derived from the message unions (messages.py): every kind the simulator's nodes send.
MESSAGE_KINDS: dict[str, type] = {
    cls.__name__.lower(): cls
    for cls in (*m.BROADCAST_MESSAGES, *m.MEMBERSHIP_MESSAGES, *m.NODE_MESSAGES)
}
MAX_DELAY = 3600.0  # seconds; a longer "delay" is a drop, and says so better as one


def _kind_value(text: str, what: str, form: str) -> tuple[str, float]:
    kind, sep, value = text.partition("=")
    kind = kind.strip().lower()
    if not sep or not kind or not value.strip():
        raise ValueError(f"{what} must be {form}, not {text!r}")
    if kind not in MESSAGE_KINDS:
        raise ValueError(
            f"unknown message kind {kind!r} in {text!r}; kinds are {', '.join(MESSAGE_KINDS)}"
        )
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{what} of {kind} must be a number, not {value.strip()!r}") from None
    return kind, number


def parse_drop(text: str) -> tuple[str, float]:
    """`KIND=P` with P in [0, 1]: drop that kind with probability P."""
    kind, p = _kind_value(text, "drop", "KIND=P")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"drop probability of {kind} must be in [0, 1], not {p:g}")
    return kind, p


def parse_delay(text: str) -> tuple[str, float]:
    """`KIND=SECONDS`: deliver that kind SECONDS later."""
    kind, seconds = _kind_value(text, "delay", "KIND=SECONDS")
    if not 0.0 <= seconds <= MAX_DELAY or math.isnan(seconds):
        raise ValueError(f"delay of {kind} must be in 0..{MAX_DELAY:g} seconds, not {seconds:g}")
    return kind, seconds


@dataclass(frozen=True, slots=True, kw_only=True)
class OneWayPartition:
    """A FRACTION of the nodes (the sender among them) cannot send to the rest from
    `start` to `end` seconds after the first counted publish."""

    fraction: float
    start: float
    end: float

    def __post_init__(self) -> None:
        if not 0.0 < self.fraction < 1.0:
            raise ValueError(f"one-way partition fraction must be in (0, 1), not {self.fraction:g}")
        if not 0.0 <= self.start < self.end or math.isinf(self.end):
            raise ValueError(
                f"one-way partition needs 0 <= START < END (finite), not "
                f"{self.start:g}-{self.end:g}"
            )

    @classmethod
    def parse(cls, text: str) -> OneWayPartition:
        """`FRACTION@START-END`, e.g. `0.5@2-6`."""
        fraction, at, span = text.partition("@")
        start, dash, end = span.partition("-")
        if not at or not dash:
            raise ValueError(
                f"one-way partition must be FRACTION@START-END (e.g. 0.5@2-6), not {text!r}"
            )
        try:
            return cls(fraction=float(fraction), start=float(start), end=float(end))
        except ValueError as exc:
            if "could not convert" in str(exc):
                raise ValueError(
                    f"one-way partition must be FRACTION@START-END with numbers, not {text!r}"
                ) from None
            raise

    def __str__(self) -> str:
        return f"{self.fraction:g}@{self.start:g}-{self.end:g}"

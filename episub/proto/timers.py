"""The timers the core sets, a small enum per layer (iroh's `Timer` enums). A timer token is
(topic, generation, member); a token whose name no layer sets is a bug, not a stale timer,
and `timer_named` says so loudly. The members are `str`s, so a token reads as its name."""

from __future__ import annotations

import enum
from collections.abc import Hashable

from episub.proto.errors import LocalProtocolError

__all__ = ["BroadcastTimer", "MembershipTimer", "timer_named"]


class BroadcastTimer(enum.StrEnum):
    IHAVE = "ihave"  # flush the queued IHAVE announcements
    MISSING = "missing"  # GRAFT what was announced and has not come
    GAP = "gap"  # PULL what a stream's gap still lacks (ordering)
    SETTLE = "settle"  # fix where a new subscriber's stream starts (ordering)
    HEADS = "heads"  # name quiet streams' heads to the neighbours
    ANSWERS = "answers"  # the next batch of answers where nothing reports drains (answers.py)


class MembershipTimer(enum.StrEnum):
    STABILIZE = "stabilize"  # shrink an oversubscribed view, grow a thin one
    OPTIMIZE = "optimize"  # swap a near link for a nearer passive peer
    SHUFFLE = "shuffle"  # refresh the passive view
    PING = "ping"  # RTT samples and liveness of the active view
    PROBE = "probe"  # RTT samples of passive peers and near candidates
    JOIN_RETRY = "join_retry"  # ask the contacts again until our JOIN is taken in
    RECOVER = "recover"  # an isolated node asks its contacts and remembered peers again


def timer_named(name: Hashable) -> BroadcastTimer | MembershipTimer:
    """The timer `name` (the last part of a token) stands for; LocalProtocolError when no
    layer sets one of that name: every token the core hands out comes back to it as is."""
    if isinstance(name, BroadcastTimer | MembershipTimer):
        return name  # as the layers set them
    if isinstance(name, str):  # a name spelled out (tests fire timers by name)
        for kind in (BroadcastTimer, MembershipTimer):
            try:
                return kind(name)
            except ValueError:
                continue
    raise LocalProtocolError(f"no layer of the core sets a timer named {name!r}")

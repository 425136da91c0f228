"""Answering a PULL in bulk: a publisher's consecutive stored messages packed into HISTORY
messages (messages.History), each within MAX_HISTORY_MESSAGES and a byte budget, so that a
range fetch costs the sender one answer and the receiver one item per pack, not per seq."""

from __future__ import annotations

from collections.abc import Iterable

from episub.proto import messages as m

__all__ = ["HISTORY_BYTES", "history_packs"]

# Envelope bytes one HISTORY carries at most (and max_message_size, when smaller: the frame
# bound is one maximal message plus overhead, so a pack always fits a frame). Guess: a TCP
# send window's worth, as PIGGYBACK_BUDGET, so answers interleave with live traffic.
HISTORY_BYTES = 64 * 1024


def history_packs(
    publisher: m.PeerId, messages: Iterable[tuple[bytes, int]], max_message_size: int
) -> list[m.History]:
    """`messages` ((envelope bytes, hops), seqs rising) of `publisher` as HISTORY messages:
    each holds at least one and at most MAX_HISTORY_MESSAGES, and more than one only while
    their bytes stay within min(HISTORY_BYTES, max_message_size)."""
    budget = min(HISTORY_BYTES, max_message_size)
    packs: list[m.History] = []
    raws: list[bytes] = []
    hops: list[int] = []
    size = 0
    for raw, hop in messages:
        if raws and (size + len(raw) > budget or len(raws) >= m.MAX_HISTORY_MESSAGES):
            packs.append(m.History(publisher=publisher, envelopes=tuple(raws), hops=tuple(hops)))
            raws, hops, size = [], [], 0
        raws.append(raw)
        hops.append(hop)
        size += len(raw)
    if raws:
        packs.append(m.History(publisher=publisher, envelopes=tuple(raws), hops=tuple(hops)))
    return packs

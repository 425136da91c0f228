"""Retention read back: the one place a stored envelope becomes a `Delivery`, and what
this node holds as a GETHELD answers it.

Delivery (fanout), `retained`/`fetch` and the gap scan of a fetch all see messages made
here, so a message read from retention equals the one delivered live."""

from __future__ import annotations

from episub.proto.envelope import Envelope
from episub.proto.messages import MAX_HELD_SPANS, GetHeld, Held, HeldSpan
from episub.records import Delivery
from episub.retention import RetentionStore, Span

__all__ = ["delivery_of", "held_page", "missing", "retained", "retained_envelopes"]


def delivery_of(topic: str, message_id: bytes, envelope: Envelope) -> Delivery:
    return Delivery(
        topic=topic,
        publisher=envelope.publisher,  # type: ignore[arg-type]
        seq=envelope.seq,
        timestamp_ms=envelope.timestamp_ms,
        key=envelope.key,
        value=envelope.payload,
        headers=envelope.headers,
        id=message_id,
    )


def retained(
    store: RetentionStore[bytes],
    topic: str,
    publisher: bytes,
    first_seq: int,
    last_seq: int,
    now: float,
) -> list[Delivery]:
    """Stored messages of `publisher` on `topic`, first_seq..last_seq, in order."""
    kept = store.entries(topic, publisher, first_seq, last_seq, now)
    return [delivery_of(topic, mid, Envelope.decode(raw)) for mid, raw in kept]


def retained_envelopes(
    store: RetentionStore[bytes],
    topic: str,
    publisher: bytes,
    first_seq: int,
    last_seq: int,
    now: float,
) -> list[Envelope]:
    """`retained`'s messages as their envelopes, without a Delivery each: for a reader that
    takes their fields into columns (the agent's pages of rows)."""
    decode = Envelope.decode
    return [decode(raw) for _, raw in store.entries(topic, publisher, first_seq, last_seq, now)]


def missing(held: list[Delivery], first_seq: int, last_seq: int) -> tuple[int, int] | None:
    """The span from the first to the last seq of first..last that `held` lacks."""
    have = {m.seq for m in held}
    lacking = [s for s in range(first_seq, last_seq + 1) if s not in have]
    return (lacking[0], lacking[-1]) if lacking else None


def held_page(store: RetentionStore[bytes], topic: str, query: GetHeld, now: float) -> Held:
    """A GETHELD's answer from retention: one page, never more than MAX_HELD_SPANS. Its
    cost follows the page's size, not the number of publishers held (store.page's
    cursor): a peer asking again and again pays per answer."""
    more = False
    found: list[tuple[bytes, Span]] = []
    if query.spans:
        for asked in query.spans:
            span = store.span(topic, asked.publisher, asked.first_seq, asked.last_seq, now)  # type: ignore[arg-type]
            if span is not None:
                found.append((asked.publisher, span))  # type: ignore[arg-type]
    else:
        found, more = store.page(topic, query.after, MAX_HELD_SPANS, now)  # type: ignore[arg-type]
    spans = []
    for publisher, span in found:
        since = span.first
        if query.since_ms:
            first = store.first_since(topic, publisher, query.since_ms, now)
            since = span.last + 1 if first is None or first > span.last else max(first, since)
        spans.append(
            HeldSpan(
                publisher=publisher,
                first_seq=span.first,
                last_seq=span.last,
                count=span.count,
                since_seq=since,
            )
        )
    return Held(nonce=query.nonce, spans=tuple(spans), more=more)

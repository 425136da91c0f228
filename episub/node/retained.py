"""The store read back: the one place a stored envelope becomes a `Delivery`.

Delivery (fanout), `retained`/`fetch` and the gap scan of a fetch all see messages made
here, so a message read from retention equals the one delivered live."""

from __future__ import annotations

from episub.proto.envelope import Envelope
from episub.proto.store import MessageStore
from episub.records import Delivery, make_delivery

__all__ = ["delivery_of", "missing", "retained", "retained_envelopes"]


def delivery_of(topic: str, message_id: bytes, envelope: Envelope) -> Delivery:
    return make_delivery(
        topic,
        envelope.publisher,  # type: ignore[arg-type]
        envelope.seq,
        envelope.timestamp_ms,
        envelope.key,
        envelope.payload,
        envelope.headers,
        message_id,
    )


def retained(
    store: MessageStore,
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
    store: MessageStore,
    topic: str,
    publisher: bytes,
    first_seq: int,
    last_seq: int,
    now: float,
) -> list[Envelope]:
    """`retained`'s messages as their envelopes, without a Delivery each: for a reader that
    takes their fields into columns (the agent's pages of rows)."""
    decode = Envelope.decode
    return [decode(raw) for raw in store.get(topic, publisher, first_seq, last_seq, now)]


def missing(held: list[Delivery], first_seq: int, last_seq: int) -> tuple[int, int] | None:
    """The span from the first to the last seq of first..last that `held` lacks."""
    have = {m.seq for m in held}
    lacking = [s for s in range(first_seq, last_seq + 1) if s not in have]
    return (lacking[0], lacking[-1]) if lacking else None

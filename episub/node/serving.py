"""Answering peers from retention: a GETHELD (what this node holds) and the seqs of a PULL
that the core's cache no longer has."""

from __future__ import annotations

from episub.net.runtime import Runtime
from episub.node.retained import held_page
from episub.proto.events import AnswerHeld, HeldAsked, HistoryAsked, ServeHistory
from episub.retention import RetentionStore

__all__ = ["answer_held", "serve_history"]


def answer_held(
    runtime: Runtime, store: RetentionStore[bytes], event: HeldAsked, now: float
) -> None:
    held = held_page(store, event.topic, event.query, now)
    runtime.input(AnswerHeld(event.topic, event.peer, held))


def serve_history(
    runtime: Runtime, store: RetentionStore[bytes], event: HistoryAsked, now: float
) -> None:
    """A PULL's seqs the core's cache lacked, from retention when it holds them: the stored
    bytes themselves (no decoding, no copy), which the runtime encodes as the peer reads."""
    kept = store.entries_at(
        event.topic,
        event.publisher,  # type: ignore[arg-type]
        event.seqs,
        now,
    )
    # Given even when empty: the PULL's next batch waits for it (events.ServeHistory).
    runtime.input(ServeHistory(event.topic, event.peer, tuple(kept), event.publisher))

"""Python's cyclic garbage collector in a node process: rare full collections.

A full collection walks every object the collector tracks, and a node holds many that
live long (its store's and cache's columns, views, per-stream tables, a row object per
held publisher). CPython's default thresholds (700, 10, 10) run a young collection every
700 net allocations and a full one about every hundred of those once the long-lived set
has grown by a quarter: with 20,000 publishers held, full collections took 45-105 ms,
several a second, while the node answered a storm of requests, and nothing else ran
meanwhile (the agent's `inspect` included). A young threshold of YOUNG_THRESHOLD makes
every kind of collection ~70x rarer (full ones at most 32 ms in the same storm); the
node's own tables make few reference cycles, so what waits for a collection is small.
`gc.freeze()` moves what exists before the node starts (modules, classes, its
configuration) out of every later collection.

For processes the node owns (the agent runner): an application that embeds a `Node` keeps
its own collector settings.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "collect_rarely"]

# Net allocations of tracked objects between young collections. Guess from the storm
# above: 50,000 took the longest full collection from 105 to 32 ms; a young collection
# then costs ~1-3 ms at most, and memory waiting for it is a few MB.
YOUNG_THRESHOLD = 50_000


def collect_rarely() -> None:
    """This process's collector set as the module says; what exists now is frozen."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
    gc.freeze()

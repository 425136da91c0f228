"""A ReadRange's fetch, running ahead of the pages: the first page of a range whose node
lacks part of it starts one fetch of the whole range (Node.fetch_range) in the agent's
nursery, and every page of it waits on that fetch instead of fetching by itself. So the
node keeps asking holders while a page is encoded and sent, and while the client turns it
into rows; nothing is asked twice across pages.

Rules:
- A page is answered as soon as its seqs are all held, or the fetch has ended (what is
  then missing, nobody asked holds), or READ_FETCH_BUDGET passed and the page can be cut
  after at least one held seq (the client asks again from there), or READ_FETCH_BUDGET +
  fetch_timeout passed (the fetch made no progress on this page: it is answered as is).
  So a client waits at most fetch_timeout + READ_FETCH_BUDGET per reply, however long the
  range.
- At most MAX_READAHEADS fetches run at once; past that a page fetches only itself.
- A fetch ends by its own rules (episub/node/fetching.py): nothing lacking, nobody holds
  the rest, or no progress for fetch_timeout; one whose reader went away ends so too.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import trio

from episub.agent.wire import READ_FETCH_BUDGET
from episub.node import Node
from episub.node.checks import FETCH_MAX_SPAN
from episub.node.fetching import FetchReport, NodeAnswer

__all__ = ["MAX_READAHEADS", "ReadAhead"]

log = logging.getLogger("episub.agent")

# Fetches running ahead of their readers at once; guess: a few per Spark task slot, each
# bounded by its range (FETCH_MAX_SPAN seqs, a bit per seq).
MAX_READAHEADS = 64


@dataclass(eq=False)
class _RangeFetch:
    topic: str
    publisher: bytes
    first: int
    last: int
    changed: trio.Event = field(default_factory=trio.Event)  # set on progress and at the end
    report: FetchReport | None = None  # set when it ended

    def progressed(self) -> None:
        """Wake every page waiting on this fetch (each takes `changed` before it looks)."""
        changed, self.changed = self.changed, trio.Event()
        changed.set()


class ReadAhead:
    """The fetches running ahead of ReadRange pages, on `node`, in `nursery`."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._running: list[_RangeFetch] = []

    async def page_end(
        self,
        nursery: trio.Nursery,
        topic: str,
        publisher: bytes,
        first: int,
        upto: int,
        last: int,
        timeout: float,
        holders: Sequence[bytes],
    ) -> int:
        """Where the page first..upto (of a read of first..last) ends, by the rules above:
        upto, or the seq before the first one still lacking."""
        held = self.node.held_seqs(topic, publisher, first, upto)
        if len(held) == upto - first + 1:
            return upto  # nothing to fetch for this page
        fetch = self._covering(topic, publisher, first, upto)
        if fetch is None:
            end = min(last, first + FETCH_MAX_SPAN - 1)
            fetch = _RangeFetch(topic, publisher, first, end)
            if len(self._running) < MAX_READAHEADS:
                self._running.append(fetch)
                nursery.start_soon(self._fetch, fetch, timeout, holders)
            else:
                fetch.last = upto  # too many ahead: this page fetches only itself
                await self._fetch(fetch, timeout, holders)
        started = trio.current_time()
        while True:
            changed = fetch.changed  # taken before looking: progress after the look sets it
            held = self.node.held_seqs(topic, publisher, first, upto)
            prefix = _prefix(held, first)
            if prefix == upto - first + 1 or fetch.report is not None:
                return upto
            waited = trio.current_time() - started
            if prefix and waited >= READ_FETCH_BUDGET:
                return first + prefix - 1
            if waited >= READ_FETCH_BUDGET + timeout:
                return upto
            limit = READ_FETCH_BUDGET if prefix else READ_FETCH_BUDGET + timeout
            with trio.move_on_after(limit - waited):
                await changed.wait()

    def _covering(self, topic: str, publisher: bytes, first: int, upto: int) -> _RangeFetch | None:
        for fetch in self._running:
            if (
                fetch.topic == topic
                and fetch.publisher == publisher
                and fetch.first <= first
                and upto <= fetch.last
            ):
                return fetch
        return None

    async def _fetch(self, fetch: _RangeFetch, timeout: float, holders: Sequence[bytes]) -> None:
        try:
            fetch.report = await self.node.fetch_range(
                fetch.topic, fetch.publisher, fetch.first, fetch.last, timeout=timeout,
                holders=holders, on_progress=fetch.progressed,
            )  # fmt: skip
            if fetch.report.lacking:
                answers = "; ".join(_answer_text(a) for a in fetch.report.asked)
                log.warning(
                    "fetch of %r, publisher %r, seqs %d..%d: %d not found (%s); asked: %s",
                    fetch.topic, fetch.publisher, fetch.first, fetch.last,
                    fetch.report.lacking, fetch.report.ended, answers or "no node to ask",
                )  # fmt: skip
        finally:
            if fetch.report is None:
                fetch.report = FetchReport(-1, "stopped")
            fetch.progressed()
            if fetch in self._running:
                self._running.remove(fetch)


def _prefix(held: list[int], first: int) -> int:
    """How many seqs from `first` on `held` (sorted) has without a hole."""
    if not held or held[0] != first:
        return 0
    if held[-1] - first + 1 == len(held):
        return len(held)
    low, high = 0, len(held) - 1  # held[i] == first + i up to the first hole: bisect it
    while low < high:
        mid = (low + high + 1) // 2
        if held[mid] == first + mid:
            low = mid
        else:
            high = mid - 1
    return low + 1


def _answer_text(answer: NodeAnswer) -> str:
    """One asked node's answer, for a log line: its address and what it said it holds."""
    who = answer.node.decode("latin-1").split("/")[0]
    if answer.held is None:
        said = f"error: {answer.error}" if answer.error else "no answer"
    elif not answer.held:
        said = "holds none of it"
    else:
        said = "holds " + ", ".join(f"{s.first_seq}..{s.last_seq} ({s.count})" for s in answer.held)
    return f"{who} {said} (asked for {answer.chunks_asked} chunks)"

"""Where a read starts and ends, per publisher: the episub source's offsets, without Spark.

The source's driver-side methods ask the reachable nodes what they hold (source.py) and
hand the answers here; this module decides, from those answers alone and a little memory
of its own, the offsets of each micro-batch and the ranges its tasks read. No I/O, no
clock (`now` comes in), so a test can plan ten thousand batches in a second.

Offsets are {topic: {publisher: next seq}}, publishers as text (their bytes as latin-1,
which round-trips any id), as Kafka's are {topic: {partition: offset}}.

Rules this planner keeps:
- What is held is what any reachable node holds: the earliest seq of a publisher is the
  lowest any of them holds, its latest the highest (`union`).
- A publisher first seen mid-query is read in that batch from its earliest held row (Kafka
  reads a new partition from its earliest offset in the batch that finds it); where it
  starts travels in the batch's end offsets (NEW_MARK), so every range a batch reads is
  named by its offsets and replays exactly.
- Rows a query should read that no reachable node holds are lost: `failOnDataLoss` fails
  the query naming them; otherwise they are skipped, with one warning giving their count,
  and the ranges read start after them.
- Offsets stay bounded: a publisher leaves them once no reachable node has held anything
  of it for `gone_grace` (a node may only be out of reach for a moment, and a publisher
  that left and came back would be read again from its earliest held seq). If this planner
  saw it hold rows past the query's position, those rows are lost (as above).
- maxOffsetsPerTrigger is shared fairly between publishers (water-filling), so one busy
  publisher cannot starve a quiet one; minOffsetsPerTrigger holds a batch back until
  enough rows wait or maxTriggerDelay has passed since the last batch.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from episub.proto.messages import HeldSpan
from episub.proto.reserved import CONTROL_PREFIX_TEXT
from episub.records import format_publisher

__all__ = [
    "NEW_MARK",
    "DataLossError",
    "Holding",
    "OffsetPlanner",
    "Offsets",
    "Range",
    "pack",
    "publisher_bytes",
    "publisher_text",
    "union",
]

log = logging.getLogger("spark_connector.source")

Offsets = dict[str, dict[str, int]]
# In a batch's end offsets, `NEW_MARK + publisher` gives where a publisher first seen at
# that batch's planning starts (its earliest held row): the batch reads it from there, and
# a re-run of the batch (after a restart too: Spark logs the offsets) reads the same rows.
# It is in that batch's end only; no stream's name starts with the control prefix.
NEW_MARK = CONTROL_PREFIX_TEXT + "from/"
# A publisher no reachable node holds, that this planner did not see read to its end, stays
# in the offsets this long before it leaves them: a node restarting, a link being repaired.
# Guess: a few liveness timeouts of the overlay (episub's ping timeout is 5 s).
GONE_GRACE = 60.0


class DataLossError(RuntimeError):
    """Rows the query should read are no longer held anywhere it could read them."""


def publisher_text(publisher: bytes) -> str:
    return format_publisher(publisher)  # the spelling users see everywhere (episub.records)


def publisher_bytes(text: str) -> bytes:
    return text.encode("latin-1")  # parse_publisher's, without its check: offsets we wrote


@dataclass(frozen=True, slots=True)
class Holding:
    """What the reachable nodes hold of one publisher, together."""

    first: int  # the lowest seq any of them holds
    last: int  # the highest
    holders: tuple[bytes, ...]  # node ids holding some of it: those holding `first` first
    since: int = 0  # the first seq stamped at or after an asked time (last + 1: none)


Holdings = dict[str, Holding]  # publisher text -> Holding, for one topic


def union(nodes: Iterable[tuple[bytes, Iterable[HeldSpan]]]) -> Holdings:
    """One topic's holdings from each node's answer (node id, spans); control streams are
    left out."""
    spans: dict[str, list[tuple[bytes, HeldSpan]]] = {}
    for node_id, held in nodes:
        for span in held:
            text = publisher_text(span.publisher)  # type: ignore[arg-type]
            if not text.startswith(CONTROL_PREFIX_TEXT):
                spans.setdefault(text, []).append((node_id, span))
    out = {}
    for text, found in spans.items():
        first = min(s.first_seq for _, s in found)
        last = max(s.last_seq for _, s in found)
        ordered = sorted(found, key=lambda f: (f[1].first_seq != first, f[1].first_seq))
        recent = [s.since_seq for _, s in found if s.since_seq <= s.last_seq]
        out[text] = Holding(
            first=first,
            last=last,
            holders=tuple(dict.fromkeys(n for n, _ in ordered if n)),
            since=min(recent) if recent else last + 1,
        )
    return out


@dataclass(frozen=True, slots=True)
class Range:
    """Rows first_seq..last_seq (offsets) of one publisher, for one task to read."""

    topic: str
    publisher: str
    first_seq: int
    last_seq: int
    # Nodes known to hold it when planned (the task asks them first if its node lacks it).
    holders: tuple[bytes, ...] = ()
    # The seqs of the messages holding its first and last row, when they are record
    # batches (rowmap.py); -1: plain messages, whose seq is their row's offset.
    first_msg: int = -1
    last_msg: int = -1

    @property
    def rows(self) -> int:
        return self.last_seq - self.first_seq + 1


class OffsetPlanner:
    """One query's planning memory: what it last saw held, and when each publisher it
    reads was last held anywhere. Made on the driver; never pickled to tasks."""

    def __init__(
        self,
        *,
        fail_on_data_loss: bool,
        min_rows: int | None = None,
        max_trigger_delay: float = math.inf,
        now: float = 0.0,
        gone_grace: float = GONE_GRACE,
    ) -> None:
        self.fail_on_data_loss = fail_on_data_loss
        self.min_rows = min_rows
        self.max_trigger_delay = max_trigger_delay
        self.gone_grace = gone_grace
        self._held: dict[str, Holdings] = {}  # the last holdings seen, per topic
        self._seen_last: dict[tuple[str, str], int] = {}  # last seq ever seen held
        self._unheld_since: dict[tuple[str, str], float] = {}
        self._skipped_to: dict[tuple[str, str], int] = {}  # rows below were skipped
        self._last_batch_at = now
        self.skipped_rows = 0  # rows skipped as lost (failOnDataLoss false)

    # -- where a query starts -----------------------------------------------------------

    def start_offsets(
        self,
        topics: Iterable[str],
        starting: str | Offsets,
        holdings: Mapping[str, Holdings],
        *,
        by_time: bool = False,
        strategy_latest: bool = False,
    ) -> Offsets:
        """The first batch's start: "earliest", "latest", JSON (-2 earliest, -1 latest per
        publisher), or `by_time` (holdings asked with a time: each publisher from its first
        row stamped then or later; with none that recent, an error unless
        `strategy_latest`, which starts it after its last)."""
        out: Offsets = {}
        for topic in topics:
            held = holdings.get(topic, {})
            self._remember(topic, held)
            if by_time:
                late = [p for p, h in held.items() if h.since > h.last]
                if late and not strategy_latest:
                    raise DataLossError(
                        f"topic {topic!r}: no row of publisher(s) {', '.join(map(repr, late[:5]))} "
                        "is stamped at or after the starting time; set "
                        "startingOffsetsByTimestampStrategy=latest to start them after their "
                        "last row"
                    )
                out[topic] = {p: h.since for p, h in held.items()}
            elif starting == "latest":
                out[topic] = {p: h.last + 1 for p, h in held.items()}
            elif starting == "earliest":
                out[topic] = {p: h.first for p, h in held.items()}
            else:
                given = starting.get(topic, {})  # type: ignore[union-attr]
                out[topic] = {}
                for publisher, seq in given.items():
                    h = held.get(publisher)
                    if seq >= 0:
                        out[topic][publisher] = seq
                    elif h is not None:  # -2 earliest, -1 latest; held nowhere: left out
                        out[topic][publisher] = h.first if seq == -2 else h.last + 1
        return out

    def end_of_batch_read(
        self,
        topics: Iterable[str],
        ending: str | Offsets,
        holdings: Mapping[str, Holdings],
        *,
        by_time: bool = False,
    ) -> Offsets:
        """A batch read's end (exclusive): "latest" (what is held now), JSON (-1: latest),
        or `by_time` (each publisher up to its first row stamped at or after the time)."""
        out: Offsets = {}
        for topic in topics:
            held = holdings.get(topic, {})
            if by_time:
                out[topic] = {p: h.since for p, h in held.items()}
            elif ending == "latest":
                out[topic] = {p: h.last + 1 for p, h in held.items()}
            else:
                out[topic] = {
                    p: (held[p].last + 1 if seq == -1 else seq)
                    for p, seq in ending.get(topic, {}).items()  # type: ignore[union-attr]
                    if seq >= 0 or p in held
                }
        return out

    # -- each micro-batch -----------------------------------------------------------------

    def latest(
        self,
        start: Offsets,
        topics: Iterable[str],
        holdings: Mapping[str, Holdings],
        *,
        now: float,
        max_rows: int | None = None,
        target: Offsets | None = None,
    ) -> Offsets:
        """The next batch's end offsets from `start`: what is held, within `max_rows`, and
        no further than `target` (Trigger.AvailableNow's end); `start` itself when there is
        nothing to read yet, or too little for minOffsetsPerTrigger."""
        end: Offsets = {}
        wanted: dict[tuple[str, str], tuple[int, int]] = {}
        for topic in dict.fromkeys([*start, *topics]):
            held = holdings.get(topic, {})
            self._remember(topic, held)
            begun = {
                p: seq
                for p, seq in start.get(topic, {}).items()
                if not p.startswith(CONTROL_PREFIX_TEXT)
            }
            end[topic] = {}
            for publisher, position in begun.items():
                h = held.get(publisher)
                key = (topic, publisher)
                if h is None:
                    if self._gone(key, position, now):
                        continue  # leaves the offsets
                    end[topic][publisher] = position
                    continue
                self._unheld_since.pop(key, None)
                if position < h.first:
                    skipped = self._skipped_to.get(key, position)
                    if skipped < h.first:  # newly lost: said once, with what is new
                        self._lost(topic, publisher, max(position, skipped), h.first - 1)
                        self._skipped_to[key] = h.first
                    position = h.first
                end[topic][publisher] = position
                upto = h.last + 1
                if target is not None:
                    upto = min(upto, target.get(topic, {}).get(publisher, position))
                if upto > position:
                    wanted[key] = (position, upto)
            for publisher, h in held.items():
                if publisher not in begun and (
                    target is None or publisher in target.get(topic, {})
                ):
                    # New: read in this batch from its earliest held row, as Kafka reads a
                    # new partition in the batch that finds it (see NEW_MARK).
                    end[topic][publisher] = h.first
                    end[topic][NEW_MARK + publisher] = h.first
                    upto = h.last + 1
                    if target is not None:
                        upto = min(upto, target[topic][publisher])
                    if upto > h.first:
                        wanted[(topic, publisher)] = (h.first, upto)
        if target is None and self.min_rows is not None:
            waiting = sum(upto - position for position, upto in wanted.values())
            if waiting < self.min_rows and now - self._last_batch_at < self.max_trigger_delay:
                return start
        for (topic, publisher), upto in _share(wanted, max_rows).items():
            end[topic][publisher] = upto
        end = {
            topic: publishers for topic, publishers in end.items() if publishers or topic in start
        }
        if end != start:
            self._last_batch_at = now
        return end

    def knows(self, topic: str) -> bool:
        """Has this planner seen what the reachable nodes hold of `topic`?"""
        return topic in self._held

    def remember(self, topic: str, held: Holdings) -> None:
        """What the reachable nodes hold of `topic` now: the holders `ranges` names."""
        self._remember(topic, held)

    def _remember(self, topic: str, held: Holdings) -> None:
        self._held[topic] = held
        for publisher, h in held.items():
            key = (topic, publisher)
            self._seen_last[key] = max(self._seen_last.get(key, -1), h.last)

    def _gone(self, key: tuple[str, str], position: int, now: float) -> bool:
        """`key`'s publisher is held by no reachable node: does it leave the offsets?"""
        since = self._unheld_since.setdefault(key, now)
        if now - since < self.gone_grace:
            return False
        seen = self._seen_last.get(key)
        if seen is not None and seen >= position:
            # Rows this planner saw held, not yet read, now held nowhere: lost.
            self._lost(*key, max(position, self._skipped_to.get(key, position)), seen)
        self._forget(key)
        return True

    def _forget(self, key: tuple[str, str]) -> None:
        self._seen_last.pop(key, None)
        self._unheld_since.pop(key, None)
        self._skipped_to.pop(key, None)

    def _lost(self, topic: str, publisher: str, first: int, last: int) -> None:
        what = (
            f"topic {topic!r}, publisher {publisher!r}: seqs {first}..{last} "
            f"({last - first + 1} rows) are held by no reachable node (aged out of "
            "retention, or never received)"
        )
        if self.fail_on_data_loss:
            raise DataLossError(
                f"{what}. Set failOnDataLoss=false to skip them, or read sooner / keep more "
                "(register(spark, retention=...))."
            )
        self.skipped_rows += last - first + 1
        log.warning("skipping %d lost rows: %s", last - first + 1, what)

    # -- the ranges a batch reads -----------------------------------------------------------

    def ranges(self, start: Offsets, end: Offsets) -> list[Range]:
        """The ranges between `start` and `end`, past rows skipped as lost, with the nodes
        that held them when planned."""
        out = []
        for topic, publishers in end.items():
            held = self._held.get(topic, {})
            for publisher, upto in sorted(publishers.items()):
                if publisher.startswith(CONTROL_PREFIX_TEXT):
                    continue
                first = start.get(topic, {}).get(publisher)
                if first is None:
                    first = publishers.get(NEW_MARK + publisher)  # new at this batch
                    if first is None:
                        continue
                first = max(first, self._skipped_to.get((topic, publisher), first))
                if first >= upto:
                    continue
                h = held.get(publisher)
                holders = h.holders if h is not None else ()
                out.append(Range(topic, publisher, first, upto - 1, holders))
        return out


def pack(
    ranges: list[Range], max_rows: int, min_partitions: int | None = None
) -> list[list[Range]]:
    """Ranges cut to at most `max_rows` rows (fewer, to make `min_partitions` tasks at
    least) and packed into tasks of at most that many rows, in order."""
    total = sum(r.rows for r in ranges)
    size = max_rows
    if min_partitions and total:
        size = max(1, min(max_rows, math.ceil(total / min_partitions)))
    pieces = []
    for r in ranges:
        for low in range(r.first_seq, r.last_seq + 1, size):
            high = min(r.last_seq, low + size - 1)
            pieces.append(Range(r.topic, r.publisher, low, high, r.holders))
    tasks: list[list[Range]] = []
    rows = 0
    for piece in pieces:
        if not tasks or rows + piece.rows > size:
            tasks.append([])
            rows = 0
        tasks[-1].append(piece)
        rows += piece.rows
    return tasks


def _share(
    wanted: dict[tuple[str, str], tuple[int, int]], budget: int | None
) -> dict[tuple[str, str], int]:
    """End seq per stream: all of it without a budget; else a fair share of `budget` rows
    (water-filling: a stream needing less than an equal share leaves the rest to others)."""
    if budget is None:
        return {k: upto for k, (_, upto) in wanted.items()}
    need = {k: upto - position for k, (position, upto) in wanted.items()}
    grant = dict.fromkeys(need, 0)
    left = budget
    open_streams = sorted(k for k in need if need[k] > 0)
    while left > 0 and open_streams:
        share = max(1, left // len(open_streams))
        for k in list(open_streams):
            take = min(share, need[k] - grant[k], left)
            grant[k] += take
            left -= take
            if grant[k] == need[k]:
                open_streams.remove(k)
            if left == 0:
                break
    return {k: wanted[k][0] + grant[k] for k in wanted}

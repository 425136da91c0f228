"""Topics as a Structured Streaming source: `spark.readStream.format("episub")`.

Offsets are small JSON dicts, {topic: {publisher: next seq}}: where each publisher's stream
of each topic stands (publishers as text: their bytes decoded as latin-1, which round-trips
any id). The driver-side methods (`initialOffset`, `latestOffset`, `partitions`) ask the
driver's node which publishers it has seen and how far; `read()` runs on an executor and
takes its ranges from that executor's own node, which holds them because it follows the
topic, asking its neighbours for what it lacks (a node that started after the data was
published, or a replay of an old range). A range is the same rows whenever it is read, so a
re-run batch replays exactly.

Choices, in the Kafka source's spirit:
- A publisher first seen after the query started is read from the first seq the driver's
  node still holds of it (Kafka reads a new partition from its earliest offset), from the
  batch after the one whose offsets first name it.
- `maxRowsPerTrigger` is shared fairly between publishers (water-filling), so one busy
  publisher cannot starve a quiet one.
- Data loss: a range the driver's node no longer holds the start of, or that a task could
  not complete, fails the query with the range named when `failOnDataLoss` is true (the
  default); otherwise it is skipped with a warning.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from spark_connector.deployment import Deployment, driver_client, executor_client
from spark_connector.options import SourceOptions

__all__ = ["DataLossError", "EpisubStreamReader", "RangePartition", "publisher_text"]

log = logging.getLogger("spark_connector.source")

Offsets = dict[str, dict[str, int]]


class DataLossError(RuntimeError):
    """Rows the query should read are no longer held anywhere it could read them."""


def publisher_text(publisher: bytes) -> str:
    return publisher.decode("latin-1")


def publisher_bytes(text: str) -> bytes:
    return text.encode("latin-1")


@dataclass(frozen=True, slots=True)
class Range:
    topic: str
    publisher: str
    first_seq: int
    last_seq: int


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """The ranges one task reads; all it needs travels with it (read() is stateless)."""

    ranges: tuple[Range, ...]
    deployment: Deployment
    fetch_timeout: float
    fail_on_data_loss: bool


class EpisubStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions, deployment: Deployment) -> None:
        self.options = options
        self.deployment = deployment
        self._target: Offsets | None = None  # Trigger.AvailableNow's end

    # -- driver side ------------------------------------------------------------------------

    def _held(self) -> dict[str, dict[str, tuple[int, int]]]:
        """topic -> publisher -> (first seq held, last seq) on the driver's node."""
        with driver_client(self.deployment) as client:
            out = {}
            for topic in self.options.topics:
                client.join(topic)
                out[topic] = {publisher_text(p): span for p, span in client.offsets(topic).items()}
            return out

    def initialOffset(self) -> dict:
        held = self._held()
        starting = self.options.starting_offsets
        out: Offsets = {}
        for topic in self.options.topics:
            if starting == "latest":
                out[topic] = {p: last + 1 for p, (_, last) in held[topic].items()}
            elif starting == "earliest":
                out[topic] = {p: first for p, (first, _) in held[topic].items()}
            else:
                out[topic] = dict(starting.get(topic, {}))  # type: ignore[union-attr]
        return out

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_rows_per_trigger is not None:
            return ReadMaxRows(self.options.max_rows_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._available()

    def _available(self) -> Offsets:
        return {
            topic: {p: last + 1 for p, (_, last) in spans.items()}
            for topic, spans in self._held().items()
        }

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        held = self._held()
        available = self._target if self._target is not None else self._available()
        end: Offsets = {}
        wanted: dict[tuple[str, str], tuple[int, int]] = {}
        for topic in self.options.topics:
            begun = start.get(topic, {})
            end[topic] = dict(begun)
            for publisher, upto in available.get(topic, {}).items():
                first_held = held.get(topic, {}).get(publisher, (0, -1))[0]
                position = begun.get(publisher)
                if position is None:
                    # A new publisher enters the offsets first, at the first seq still held,
                    # and is read from the next batch on: so every range a batch reads has
                    # its start in the batch's start offset, and replays exactly.
                    end[topic][publisher] = min(first_held, upto)
                    continue
                if position < first_held:
                    self._lost(topic, publisher, position, first_held - 1, "the driver's node")
                    position = first_held
                end[topic][publisher] = position
                if upto > position:
                    wanted[(topic, publisher)] = (position, upto)
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        for (topic, publisher), upto in _share(wanted, budget).items():
            end[topic][publisher] = upto
        return end

    def _lost(self, topic: str, publisher: str, first: int, last: int, where: str) -> None:
        what = (
            f"topic {topic!r}, publisher {publisher!r}: seqs {first}..{last} are no longer "
            f"held by {where} (aged out of retention, or never received)"
        )
        if self.options.fail_on_data_loss:
            raise DataLossError(
                f"{what}. Set failOnDataLoss=false to skip them, or read sooner / keep more."
            )
        log.warning("skipping lost rows: %s", what)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        step = self.options.max_rows_per_partition
        out: list[InputPartition] = []
        for topic, publishers in end.items():
            for publisher, upto in sorted(publishers.items()):
                # A publisher new in `end` has no rows in this batch (see latestOffset).
                first = start.get(topic, {}).get(publisher, upto)
                for low in range(first, upto, step):
                    rng = Range(topic, publisher, low, min(upto, low + step) - 1)
                    out.append(
                        RangePartition(
                            ranges=(rng,),
                            deployment=self.deployment,
                            fetch_timeout=self.options.fetch_timeout,
                            fail_on_data_loss=self.options.fail_on_data_loss,
                        )
                    )
        return out

    def commit(self, end: dict) -> None:
        pass  # nothing to release: nodes keep history by retention, not by commits

    # -- executor side ----------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        assert isinstance(partition, RangePartition)
        return read_ranges(partition)


def read_ranges(partition: RangePartition) -> Iterator[tuple]:
    """The rows of `partition`'s ranges, from this executor's node."""
    with executor_client(partition.deployment) as client:
        for topic in dict.fromkeys(r.topic for r in partition.ranges):
            client.join(topic)
        for rng in partition.ranges:
            messages = client.read_range(
                rng.topic,
                publisher_bytes(rng.publisher),
                rng.first_seq,
                rng.last_seq,
                fetch_timeout=partition.fetch_timeout,
            )
            expected = rng.last_seq - rng.first_seq + 1
            if len(messages) != expected:
                have = {m.seq for m in messages}
                lacking = [s for s in range(rng.first_seq, rng.last_seq + 1) if s not in have]
                what = (
                    f"topic {rng.topic!r}, publisher {rng.publisher!r}: {len(lacking)} of seqs "
                    f"{rng.first_seq}..{rng.last_seq} (first {lacking[0]}) were not found on "
                    f"this executor's node nor its neighbours within "
                    f"{partition.fetch_timeout} s"
                )
                if partition.fail_on_data_loss:
                    raise DataLossError(f"{what}. Set failOnDataLoss=false to skip them.")
                log.warning("skipping lost rows: %s", what)
            for m in messages:
                yield (
                    m.topic,
                    publisher_text(m.publisher),
                    m.seq,
                    datetime.datetime.fromtimestamp(m.timestamp_ms / 1000, tz=datetime.UTC),
                    m.key,
                    m.value,
                    [(name, value) for name, value in m.headers],
                )


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

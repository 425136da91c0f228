"""The `episub` data source's options: parsed and checked once, each with a clear error.

Spark hands options over as case-insensitive strings. Every name is checked against the
known ones, so a typo (`maxRowPerTrigger`) fails the query at once instead of being
ignored; names Spark itself passes along (`path`, `checkpointLocation`, `queryName`) are
let through. Defaults follow Spark's Kafka source where there is one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from episub.proto.messages import check_topic_name

__all__ = ["OptionError", "SinkOptions", "SourceOptions", "parse_sink", "parse_source"]

# Options Spark itself may pass to a data source, which are not ours to refuse.
_SPARK_OWN = {"path", "checkpointlocation", "queryname"}
# How long a task's read waits on its node's neighbours for what the node lacks of a range
# (Node.fetch). Guess: a few PULL rounds over the overlay, with room for a loaded machine.
DEFAULT_FETCH_TIMEOUT = 10.0
# Seqs of one publisher per InputPartition: a bigger range is split, so one busy publisher
# still spreads over several tasks. Guess: a few MB of small rows per task.
DEFAULT_MAX_ROWS_PER_PARTITION = 20_000
# A task publishes its partition's rows in requests of this many. Guess: the agent's batch
# bound (10,000) is the most; 1,000 keeps a request's memory small for 1 MiB messages.
DEFAULT_SINK_BATCH = 1_000


class OptionError(ValueError):
    """A bad option; the message names it and says what is expected."""


@dataclass(frozen=True, slots=True)
class SourceOptions:
    topics: tuple[str, ...]
    starting_offsets: str | dict[str, dict[str, int]]  # "earliest", "latest", or per topic
    max_rows_per_trigger: int | None
    fail_on_data_loss: bool
    bootstrap: tuple[str, ...]
    fetch_timeout: float
    max_rows_per_partition: int


@dataclass(frozen=True, slots=True)
class SinkOptions:
    topics: tuple[str, ...]  # the `topic` option: the default topic first, then others allowed
    bootstrap: tuple[str, ...]
    batch_size: int


_SOURCE = {
    "topic",
    "topics",
    "startingoffsets",
    "maxrowspertrigger",
    "failondataloss",
    "bootstrap",
    "fetchtimeout",
    "maxrowsperpartition",
}
_SINK = {"topic", "topics", "bootstrap", "batchsize"}


def _lower(options: Mapping[str, str], known: set[str], what: str) -> dict[str, str]:
    out = {}
    for name, value in options.items():
        low = name.lower()
        if low in _SPARK_OWN:
            continue
        if low not in known:
            raise OptionError(
                f"unknown option {name!r} for the episub {what}; known options: "
                f"{', '.join(sorted(known))}"
            )
        out[low] = value
    return out


def _topics(opts: dict[str, str], required: bool = True) -> tuple[str, ...]:
    text = opts.get("topic", opts.get("topics"))
    if text is None or not text.strip():
        if not required:
            return ()
        raise OptionError('option "topic" is required: one topic or a comma-separated list')
    topics = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    for topic in topics:
        try:
            check_topic_name(topic)
        except ValueError as exc:
            raise OptionError(f'option "topic": {exc}') from None
    return topics


def _int(opts: dict[str, str], name: str, label: str, default: int | None) -> int | None:
    text = opts.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f'option "{label}" must be a whole number, not {text!r}') from None
    if value < 1:
        raise OptionError(f'option "{label}" must be >= 1, not {value}')
    return value


def _float(opts: dict[str, str], name: str, label: str, default: float) -> float:
    text = opts.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise OptionError(f'option "{label}" must be a number of seconds, not {text!r}') from None
    if not 0 <= value <= 120:
        raise OptionError(f'option "{label}" must be in 0..120 seconds, not {value}')
    return value


def _bool(opts: dict[str, str], name: str, label: str, default: bool) -> bool:
    text = opts.get(name)
    if text is None:
        return default
    if text.strip().lower() in ("true", "false"):
        return text.strip().lower() == "true"
    raise OptionError(f'option "{label}" must be true or false, not {text!r}')


def _bootstrap(opts: dict[str, str]) -> tuple[str, ...]:
    from episub.net.peer_id import PeerIdError, parse_address

    text = opts.get("bootstrap", "")
    addresses = tuple(a.strip() for a in text.split(",") if a.strip())
    for address in addresses:
        try:
            parse_address(address)
        except PeerIdError as exc:
            raise OptionError(f'option "bootstrap": {exc}') from None
    return addresses


def _starting(opts: dict[str, str], topics: tuple[str, ...]) -> str | dict[str, dict[str, int]]:
    text = opts.get("startingoffsets", "latest").strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        parsed = None
    shape = (
        'option "startingOffsets" must be "earliest", "latest" or JSON '
        '{"topic": {"publisher": seq, ...}, ...}'
    )
    if not isinstance(parsed, dict):
        raise OptionError(f"{shape}, not {text!r:.200}")
    out: dict[str, dict[str, int]] = {}
    for topic, publishers in parsed.items():
        if topic not in topics:
            raise OptionError(f'option "startingOffsets" names topic {topic!r}, not read here')
        if not isinstance(publishers, dict) or not all(
            isinstance(p, str) and isinstance(s, int) and not isinstance(s, bool) and s >= 0
            for p, s in publishers.items()
        ):
            raise OptionError(f"{shape}, with seqs >= 0; got {publishers!r:.200} for {topic!r}")
        out[topic] = dict(publishers)
    return out


def parse_source(options: Mapping[str, str]) -> SourceOptions:
    opts = _lower(options, _SOURCE, "source")
    topics = _topics(opts)
    return SourceOptions(
        topics=topics,
        starting_offsets=_starting(opts, topics),
        max_rows_per_trigger=_int(opts, "maxrowspertrigger", "maxRowsPerTrigger", None),
        fail_on_data_loss=_bool(opts, "failondataloss", "failOnDataLoss", True),
        bootstrap=_bootstrap(opts),
        fetch_timeout=_float(opts, "fetchtimeout", "fetchTimeout", DEFAULT_FETCH_TIMEOUT),
        max_rows_per_partition=_int(  # type: ignore[arg-type]
            opts, "maxrowsperpartition", "maxRowsPerPartition", DEFAULT_MAX_ROWS_PER_PARTITION
        ),
    )


def parse_sink(options: Mapping[str, str]) -> SinkOptions:
    opts = _lower(options, _SINK, "sink")
    return SinkOptions(
        topics=_topics(opts, required=False),
        bootstrap=_bootstrap(opts),
        batch_size=_int(opts, "batchsize", "batchSize", DEFAULT_SINK_BATCH),  # type: ignore[arg-type]
    )

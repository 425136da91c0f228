"""The `episub` data source's options: parsed and checked once, each with a clear error.

Spark hands options over as case-insensitive strings. Every name is checked against the
known ones, so a typo (`maxRowPerTrigger`) fails the query at once instead of being
ignored; names Spark itself passes along (`path`, `checkpointLocation`, `queryName`) are
let through. Names follow Spark's Kafka source where the meaning is the same (docs/spark.md
has the table), and a Kafka option that means nothing here fails naming what does.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from episub.proto.messages import check_topic_name

__all__ = [
    "EARLIEST",
    "LATEST",
    "OptionError",
    "SinkOptions",
    "SourceOptions",
    "check_reader_options",
    "parse_batch_source",
    "parse_sink",
    "parse_source",
]

# Options Spark itself may pass to a data source, which are not ours to refuse.
_SPARK_OWN = {"path", "checkpointlocation", "queryname"}
# How long a task's read waits on other nodes for what its node lacks of a range
# (Node.fetch). Guess: a few PULL rounds over the overlay, with room for a loaded machine.
DEFAULT_FETCH_TIMEOUT = 10.0
# Seqs per InputPartition: a bigger range is split, small ones share a task. Guess: a few
# MB of small rows per task.
DEFAULT_MAX_ROWS_PER_PARTITION = 100_000
# A task publishes its partition's rows in requests of this many. Guess: the agent's batch
# bound (10,000) is the most; 1,000 keeps a request's memory small for 1 MiB messages.
DEFAULT_SINK_BATCH = 4096  # rows per record batch (arrow_rows.BATCH_ROWS)
# Kafka's maxTriggerDelay default: with minOffsetsPerTrigger, a batch runs at the latest
# this long after the previous one.
DEFAULT_MAX_TRIGGER_DELAY = 15 * 60.0
# How long a task waits for its rows to be held by other nodes (acks 1 or all). Guess:
# Kafka's request.timeout.ms (30 s).
DEFAULT_ACK_TIMEOUT = 30.0
# In JSON offsets, as in Kafka's: -2 is a publisher's earliest held seq, -1 its latest.
EARLIEST = -2
LATEST = -1
ACKS = ("local", "1", "all")

Offsets = dict[str, dict[str, int]]


class OptionError(ValueError):
    """A bad option; the message names it and says what is expected."""


@dataclass(frozen=True, slots=True)
class SourceOptions:
    topics: tuple[str, ...]  # subscribed by name (`topic`, `topics`, `subscribe`)
    pattern: str | None  # `subscribePattern`: topics the overlay knows whose name matches
    starting_offsets: str | Offsets  # "earliest", "latest", or per topic (-2/-1 allowed)
    starting_timestamp: int | None  # ms: each publisher from its first row stamped since
    starting_by_timestamp: dict[str, dict[str, int]] | None  # topic -> publisher -> ms
    strategy_latest: bool  # startingOffsetsByTimestampStrategy: latest (else error)
    ending_offsets: str | Offsets  # batch reads: "latest", or per topic (-1 allowed)
    ending_timestamp: int | None  # batch reads: up to the first row stamped at or after
    ending_by_timestamp: dict[str, dict[str, int]] | None
    max_rows_per_trigger: int | None
    min_rows_per_trigger: int | None
    max_trigger_delay: float  # seconds
    fail_on_data_loss: bool
    include_headers: bool
    bootstrap: tuple[str, ...]
    fetch_timeout: float
    max_rows_per_partition: int
    min_partitions: int | None


@dataclass(frozen=True, slots=True)
class SinkOptions:
    topics: tuple[str, ...]  # the `topic` option: the default topic first, then others allowed
    bootstrap: tuple[str, ...]
    batch_size: int
    acks: str  # "local", "1" or "all"
    ack_timeout: float


_SOURCE = {
    "topic",
    "topics",
    "subscribe",
    "subscribepattern",
    "startingoffsets",
    "startingtimestamp",
    "startingoffsetsbytimestamp",
    "startingoffsetsbytimestampstrategy",
    "maxrowspertrigger",
    "maxoffsetspertrigger",
    "minrowspertrigger",
    "minoffsetspertrigger",
    "maxtriggerdelay",
    "failondataloss",
    "includeheaders",
    "bootstrap",
    "fetchtimeout",
    "maxrowsperpartition",
    "maxrecordsperpartition",
    "minpartitions",
}
_BATCH_ONLY = {"endingoffsets", "endingtimestamp", "endingoffsetsbytimestamp"}
_SINK = {"topic", "topics", "bootstrap", "batchsize", "acks", "acktimeout"}
# Spark lower-cases option names before we see them: each in the spelling the docs use
# (Kafka's where the name is Kafka's), for messages.
_SPELLED = {
    name.lower(): name
    for name in (
        "topic", "topics", "subscribe", "subscribePattern", "startingOffsets",
        "startingTimestamp", "startingOffsetsByTimestamp",
        "startingOffsetsByTimestampStrategy", "maxRowsPerTrigger", "maxOffsetsPerTrigger",
        "minRowsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay", "failOnDataLoss",
        "includeHeaders", "bootstrap", "fetchTimeout", "maxRowsPerPartition",
        "maxRecordsPerPartition", "minPartitions", "endingOffsets", "endingTimestamp",
        "endingOffsetsByTimestamp", "batchSize", "acks", "ackTimeout",
    )
}  # fmt: skip

# Kafka's options that have no meaning here, and what to use instead.
_KAFKA_ONLY = {
    "assign": 'episub topics have no partitions to assign: name topics with "subscribe" (or '
    '"topic"), and publishers\' positions with "startingOffsets" JSON',
    "kafka.bootstrap.servers": 'use option "bootstrap" (host:port of episub nodes), or '
    "spark_connector.register(spark, bootstrap=[...]) for every query",
    "kafka.group.id": "episub has no consumer groups: every query reads every row it is "
    "given, and keeps its own position in its checkpoint",
    "groupidprefix": "episub has no consumer groups: every query reads every row it is "
    "given, and keeps its own position in its checkpoint",
    "fetchoffset.numretries": 'use option "fetchTimeout" (seconds a task waits on other '
    "nodes for rows its node lacks)",
    "fetchoffset.retryintervalms": 'use option "fetchTimeout" (seconds a task waits on other '
    "nodes for rows its node lacks)",
    "kafkaconsumer.polltimeoutms": 'use option "fetchTimeout" (seconds a task waits on other '
    "nodes for rows its node lacks)",
    "kafka.acks": 'use option "acks" (local, 1 or all)',
    "maxbytespertrigger": 'episub bounds batches in rows: use "maxOffsetsPerTrigger"',
}


def _lower(options: Mapping[str, str], known: set[str], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in options.items():
        low = name.lower()
        if low in _SPARK_OWN:
            continue
        if low in _KAFKA_ONLY:
            raise OptionError(
                f"option {name!r} is Kafka's, with no meaning here: {_KAFKA_ONLY[low]}"
            )
        if low.startswith("kafka."):
            raise OptionError(
                f"option {name!r} is a Kafka client setting, with no meaning here: episub "
                "nodes are configured with spark_connector.register(spark, ...)"
            )
        if low in _BATCH_ONLY and what == "source":
            raise OptionError(
                f"option {name!r} is for batch reads (spark.read.format('episub')); a "
                "streaming query runs until it is stopped (Trigger.AvailableNow reads what "
                "is there at the start, then stops)"
            )
        if low not in known:
            raise OptionError(_unknown(name, known, what))
        canonical = _ALIASES.get(low, low)
        if canonical in out and canonical != low and out[canonical] != value:
            raise OptionError(f"option {name!r} and its alias disagree: give one of them")
        out[canonical] = value
    return out


def _unknown(name: str, known: set[str], what: str) -> str:
    """One line: the unknown option, the nearest known one if any is near, the rest."""
    near = difflib.get_close_matches(name.lower(), sorted(known), n=1, cutoff=0.6)
    guess = f'did you mean "{_SPELLED[near[0]]}"? ' if near else ""
    shown = ", ".join(sorted((_SPELLED[k] for k in known if k not in _ALIASES), key=str.lower))
    return f"unknown option {name!r} for the episub {what}: {guess}known options: {shown}"


def check_reader_options(options: Mapping[str, str]) -> None:
    """What `schema()` can check before Spark knows whether the read is a stream or a batch
    (a streaming query's own checks come only after `start()`, off the caller's thread):
    every name, and every value as the one kind of read the options allow."""
    names = set(_lower(options, _SOURCE | _BATCH_ONLY, "reader"))  # names of either kind
    if names & _BATCH_ONLY:
        parse_batch_source(options)
    else:
        parse_source(options)  # as lenient as a batch read, but on startingOffsets=latest


# Alias -> the name it stands for (Kafka's name, or ours).
_ALIASES = {
    "maxoffsetspertrigger": "maxrowspertrigger",
    "minoffsetspertrigger": "minrowspertrigger",
    "maxrecordsperpartition": "maxrowsperpartition",
}


def _topic_list(text: str, label: str) -> tuple[str, ...]:
    topics = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    if not topics:
        raise OptionError(f'option "{label}" names no topic')
    for topic in topics:
        try:
            check_topic_name(topic)
        except ValueError as exc:
            raise OptionError(f'option "{label}": {exc}') from None
    return topics


def _topics(opts: dict[str, str], required: bool = True) -> tuple[str, ...]:
    given = [name for name in ("topic", "topics", "subscribe") if name in opts]
    if len(given) > 1:
        raise OptionError(f"give one of options {', '.join(given)}, not several")
    if not given:
        if not required:
            return ()
        raise OptionError(
            'option "topic" (or Kafka\'s "subscribe") is required: one topic or a '
            'comma-separated list; or "subscribePattern"'
        )
    return _topic_list(opts[given[0]], given[0])


def _int(
    opts: dict[str, str], name: str, label: str, default: int | None, low: int = 1
) -> int | None:
    text = opts.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f'option "{label}" must be a whole number, not {text!r}') from None
    if value < low:
        raise OptionError(f'option "{label}" must be >= {low}, not {value}')
    return value


def _float(opts: dict[str, str], name: str, label: str, default: float, high: float = 120) -> float:
    text = opts.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise OptionError(f'option "{label}" must be a number of seconds, not {text!r}') from None
    if not 0 <= value <= high:
        raise OptionError(f'option "{label}" must be in 0..{high:g} seconds, not {value}')
    return value


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def _duration(opts: dict[str, str], name: str, label: str, default: float) -> float:
    """Seconds from Kafka's duration strings ("15m", "30s", "500ms"; a bare number: s)."""
    text = opts.get(name)
    if text is None:
        return default
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None:
        raise OptionError(
            f'option "{label}" must be a duration such as 30s, 15m or 500ms, not {text!r}'
        )
    return float(match[1]) * _UNITS[match[2]]


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


def _offsets_json(
    opts: dict[str, str], name: str, label: str, topics: tuple[str, ...], allowed: tuple[int, ...]
) -> str | Offsets | None:
    """ "earliest"/"latest", or JSON {"topic": {"publisher": seq}} with seqs >= 0 or one of
    `allowed` (-2 earliest, -1 latest)."""
    text = opts.get(name)
    if text is None:
        return None
    text = text.strip()
    words = {"earliest": EARLIEST, "latest": LATEST}
    if text.lower() in words:
        if words[text.lower()] not in allowed:
            raise OptionError(f'option "{label}" cannot be {text.lower()!r} here')
        return text.lower()
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        parsed = None
    specials = " or ".join(str(a) for a in allowed)
    words_allowed = ", ".join(f'"{w}"' for w, v in words.items() if v in allowed)
    shape = (
        f'option "{label}" must be {words_allowed} or JSON '
        f'{{"topic": {{"publisher": seq, ...}}, ...}} (seq >= 0, or {specials})'
    )
    if not isinstance(parsed, dict):
        raise OptionError(f"{shape}, not {text!r:.200}")
    out: Offsets = {}
    for topic, publishers in parsed.items():
        if topics and topic not in topics:
            raise OptionError(f'option "{label}" names topic {topic!r}, not read here')
        if not isinstance(publishers, dict) or not all(
            isinstance(p, str)
            and isinstance(s, int)
            and not isinstance(s, bool)
            and (s >= 0 or s in allowed)
            for p, s in publishers.items()
        ):
            raise OptionError(f"{shape}; got {publishers!r:.200} for {topic!r}")
        out[topic] = dict(publishers)
    return out


def _timestamp(opts: dict[str, str], name: str, label: str) -> int | None:
    text = opts.get(name)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise OptionError(
            f'option "{label}" must be milliseconds since the Unix epoch, not {text!r}'
        ) from None
    if value < 0:
        raise OptionError(f'option "{label}" must be >= 0, not {value}')
    return value


def _by_timestamp(
    opts: dict[str, str], name: str, label: str, topics: tuple[str, ...]
) -> dict[str, dict[str, int]] | None:
    found = _offsets_json(opts, name, label, topics, ())
    if isinstance(found, str):
        raise OptionError(f'option "{label}" takes JSON {{"topic": {{"publisher": ms}}}}')
    return found


def _pattern(opts: dict[str, str]) -> str | None:
    text = opts.get("subscribepattern")
    if text is None:
        return None
    try:
        re.compile(text)
    except re.error as exc:
        raise OptionError(f'option "subscribePattern" is not a regular expression: {exc}') from None
    return text


def _one_of(**given: object) -> None:
    """Options that say one thing in different ways (where a read starts): one at most."""
    names = [name for name, value in given.items() if value is not None]
    if len(names) > 1:
        raise OptionError(f"give one of options {', '.join(names)}, not several")


def _source_common(opts: dict[str, str], *, batch: bool) -> dict[str, object]:
    pattern = _pattern(opts)
    topics = _topics(opts, required=pattern is None)
    if pattern is not None and topics:
        raise OptionError('give "subscribePattern" or topics by name ("topic"), not both')
    starts = (EARLIEST,) if batch else (EARLIEST, LATEST)
    starting = _offsets_json(opts, "startingoffsets", "startingOffsets", topics, starts)
    starting_timestamp = _timestamp(opts, "startingtimestamp", "startingTimestamp")
    by_timestamp = _by_timestamp(
        opts, "startingoffsetsbytimestamp", "startingOffsetsByTimestamp", topics
    )
    _one_of(
        startingOffsets=starting,
        startingTimestamp=starting_timestamp,
        startingOffsetsByTimestamp=by_timestamp,
    )
    strategy = opts.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise OptionError(
            f'option "startingOffsetsByTimestampStrategy" must be error or latest, not {strategy!r}'
        )
    max_rows = _int(opts, "maxrowspertrigger", "maxOffsetsPerTrigger", None)
    min_rows = _int(opts, "minrowspertrigger", "minOffsetsPerTrigger", None)
    if max_rows is not None and min_rows is not None and min_rows > max_rows:
        raise OptionError(
            f"minOffsetsPerTrigger ({min_rows}) must not be above maxOffsetsPerTrigger ({max_rows})"
        )
    if "maxtriggerdelay" in opts and min_rows is None:
        raise OptionError('option "maxTriggerDelay" goes with "minOffsetsPerTrigger"')
    return {
        "topics": topics,
        "pattern": pattern,
        "starting_offsets": starting
        if starting is not None
        else ("earliest" if batch else "latest"),
        "starting_timestamp": starting_timestamp,
        "starting_by_timestamp": by_timestamp,
        "strategy_latest": strategy == "latest",
        "max_rows_per_trigger": max_rows,
        "min_rows_per_trigger": min_rows,
        "max_trigger_delay": _duration(
            opts, "maxtriggerdelay", "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY
        ),
        "fail_on_data_loss": _bool(opts, "failondataloss", "failOnDataLoss", True),
        "include_headers": _bool(opts, "includeheaders", "includeHeaders", True),
        "bootstrap": _bootstrap(opts),
        "fetch_timeout": _float(opts, "fetchtimeout", "fetchTimeout", DEFAULT_FETCH_TIMEOUT),
        "max_rows_per_partition": _int(
            opts, "maxrowsperpartition", "maxRowsPerPartition", DEFAULT_MAX_ROWS_PER_PARTITION
        ),
        "min_partitions": _int(opts, "minpartitions", "minPartitions", None),
    }


def parse_source(options: Mapping[str, str]) -> SourceOptions:
    """A streaming query's options (`spark.readStream.format("episub")`)."""
    opts = _lower(options, _SOURCE, "source")
    return SourceOptions(
        **_source_common(opts, batch=False),  # type: ignore[arg-type]
        ending_offsets="latest",
        ending_timestamp=None,
        ending_by_timestamp=None,
    )


def parse_batch_source(options: Mapping[str, str]) -> SourceOptions:
    """A batch read's options (`spark.read.format("episub")`): from startingOffsets
    (default earliest) to endingOffsets (default latest: what is held when it is planned)."""
    opts = _lower(options, _SOURCE | _BATCH_ONLY, "batch source")
    for stream_only in ("maxrowspertrigger", "minrowspertrigger", "maxtriggerdelay"):
        if stream_only in opts:
            raise OptionError(
                f'option "{_SPELLED[stream_only]}" is for streaming queries; a batch reads all'
            )
    common = _source_common(opts, batch=True)
    topics: tuple[str, ...] = common["topics"]  # type: ignore[assignment]
    ending = _offsets_json(opts, "endingoffsets", "endingOffsets", topics, (LATEST,))
    ending_timestamp = _timestamp(opts, "endingtimestamp", "endingTimestamp")
    ending_by = _by_timestamp(opts, "endingoffsetsbytimestamp", "endingOffsetsByTimestamp", topics)
    _one_of(
        endingOffsets=ending, endingTimestamp=ending_timestamp, endingOffsetsByTimestamp=ending_by
    )
    return SourceOptions(
        **common,  # type: ignore[arg-type]
        ending_offsets=ending if ending is not None else "latest",
        ending_timestamp=ending_timestamp,
        ending_by_timestamp=ending_by,
    )


def parse_sink(options: Mapping[str, str]) -> SinkOptions:
    opts = _lower(options, _SINK, "sink")
    acks = opts.get("acks", "1").strip().lower()
    if acks == "0":
        acks = "local"  # Kafka's acks=0 never waits either
    if acks == "-1":
        acks = "all"  # Kafka's other name for all
    if acks not in ACKS:
        raise OptionError(f'option "acks" must be local, 1 or all, not {opts["acks"]!r}')
    return SinkOptions(
        topics=_topics(opts, required=False),
        bootstrap=_bootstrap(opts),
        batch_size=_int(opts, "batchsize", "batchSize", DEFAULT_SINK_BATCH),  # type: ignore[arg-type]
        acks=acks,
        ack_timeout=_float(opts, "acktimeout", "ackTimeout", DEFAULT_ACK_TIMEOUT, high=600),
    )

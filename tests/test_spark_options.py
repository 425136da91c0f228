"""The data source's options, parsed without Spark: Kafka's names where they mean the same,
one clear error for each bad value, and Kafka's options that mean nothing here refused with
the episub equivalent named."""

from __future__ import annotations

import pytest

from spark_connector.options import (
    OptionError,
    check_reader_options,
    parse_batch_source,
    parse_sink,
    parse_source,
)


def test_kafka_names_are_aliases_of_ours() -> None:
    o = parse_source(
        {
            "subscribe": "a, b",
            "maxOffsetsPerTrigger": "100",
            "minOffsetsPerTrigger": "10",
            "maxTriggerDelay": "30s",
            "maxRecordsPerPartition": "500",
            "includeHeaders": "false",
        }
    )
    assert o.topics == ("a", "b")
    assert (o.max_rows_per_trigger, o.min_rows_per_trigger, o.max_trigger_delay) == (100, 10, 30.0)
    assert o.max_rows_per_partition == 500 and not o.include_headers
    assert parse_source({"topic": "a", "maxRowsPerTrigger": "7"}).max_rows_per_trigger == 7


@pytest.mark.parametrize(
    ("text", "seconds"), [("15m", 900.0), ("500ms", 0.5), ("2h", 7200.0), ("45", 45.0)]
)
def test_max_trigger_delay_takes_kafkas_durations(text: str, seconds: float) -> None:
    o = parse_source({"topic": "a", "minOffsetsPerTrigger": "1", "maxTriggerDelay": text})
    assert o.max_trigger_delay == seconds


def test_json_offsets_take_minus_two_for_earliest_and_minus_one_for_latest() -> None:
    o = parse_source({"topic": "t", "startingOffsets": '{"t": {"p": -2, "q": -1, "r": 5}}'})
    assert o.starting_offsets == {"t": {"p": -2, "q": -1, "r": 5}}
    b = parse_batch_source({"topic": "t", "endingOffsets": '{"t": {"p": -1}}'})
    assert b.starting_offsets == "earliest" and b.ending_offsets == {"t": {"p": -1}}


def test_a_subscribe_pattern_is_checked_as_a_regular_expression() -> None:
    assert parse_source({"subscribePattern": r"events\..*"}).pattern == r"events\..*"
    with pytest.raises(OptionError, match="not a regular expression"):
        parse_source({"subscribePattern": "("})
    with pytest.raises(OptionError, match="not both"):
        parse_source({"subscribePattern": "a.*", "topic": "a"})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topic": "t", "kafka.bootstrap.servers": "h:9092"}, 'use option "bootstrap"'),
        ({"topic": "t", "assign": '{"t": [0]}'}, 'name topics with "subscribe"'),
        ({"topic": "t", "kafka.group.id": "g"}, "no consumer groups"),
        ({"topic": "t", "groupIdPrefix": "g"}, "no consumer groups"),
        ({"topic": "t", "fetchOffset.numRetries": "3"}, '"fetchTimeout"'),
        ({"topic": "t", "kafkaConsumer.pollTimeoutMs": "5"}, '"fetchTimeout"'),
        ({"topic": "t", "kafka.security.protocol": "SSL"}, "Kafka client setting"),
        ({"topic": "t", "maxBytesPerTrigger": "1m"}, '"maxOffsetsPerTrigger"'),
        ({"topic": "t", "endingOffsets": "latest"}, "for batch reads"),
    ],
)
def test_kafka_options_with_no_meaning_here_fail_naming_what_to_use(
    options: dict[str, str], message: str
) -> None:
    with pytest.raises(OptionError, match=message):
        parse_source(options)


def test_the_sink_refuses_kafka_client_settings_and_takes_acks() -> None:
    with pytest.raises(OptionError, match='use option "acks"'):
        parse_sink({"topic": "t", "kafka.acks": "all"})
    assert parse_sink({"topic": "t"}).acks == "1"
    assert [
        parse_sink({"topic": "t", "acks": a}).acks for a in ("0", "1", "all", "-1", "local")
    ] == [
        "local",
        "1",
        "all",
        "all",
        "local",
    ]
    with pytest.raises(OptionError, match="acks"):
        parse_sink({"topic": "t", "acks": "2"})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, 'option "topic"'),
        ({"topic": "a", "subscribe": "b"}, "not several"),
        ({"topic": "t", "startingOffsets": "soon"}, "startingOffsets"),
        ({"topic": "t", "startingOffsets": '{"u": {"p": 0}}'}, "topic 'u', not read here"),
        ({"topic": "t", "startingOffsets": '{"t": {"p": -3}}'}, "-2 or -1"),
        ({"topic": "t", "startingTimestamp": "yesterday"}, "milliseconds since the Unix"),
        ({"topic": "t", "startingTimestamp": "5", "startingOffsets": "earliest"}, "not several"),
        ({"topic": "t", "maxOffsetsPerTrigger": "0"}, ">= 1"),
        ({"topic": "t", "maxOffsetsPerTrigger": "5", "minOffsetsPerTrigger": "9"}, "not be above"),
        ({"topic": "t", "maxTriggerDelay": "5s"}, "goes with"),
        ({"topic": "t", "minOffsetsPerTrigger": "5", "maxTriggerDelay": "soon"}, "duration"),
        ({"topic": "t", "failOnDataLoss": "maybe"}, "true or false"),
        ({"topic": "t", "bootstrap": "nohost"}, "bootstrap"),
        ({"topic": "t", "maxRowPerTrigger": "5"}, "unknown option 'maxRowPerTrigger'"),
        ({"topic": "t", "startingOffsetsByTimestampStrategy": "maybe"}, "error or latest"),
    ],
)
def test_bad_source_options_fail_with_one_line_naming_them(
    options: dict[str, str], message: str
) -> None:
    with pytest.raises(OptionError, match=message):
        parse_source(options)


def test_a_batch_read_refuses_streaming_only_options_and_latest_as_a_start() -> None:
    with pytest.raises(OptionError, match="for streaming queries"):
        parse_batch_source({"topic": "t", "maxOffsetsPerTrigger": "5"})
    with pytest.raises(OptionError, match="cannot be 'latest'"):
        parse_batch_source({"topic": "t", "startingOffsets": "latest"})
    with pytest.raises(OptionError, match="cannot be 'earliest'"):
        parse_batch_source({"topic": "t", "endingOffsets": "earliest"})
    with pytest.raises(OptionError, match="-1"):
        parse_batch_source({"topic": "t", "endingOffsets": '{"t": {"p": -2}}'})


def test_an_unknown_option_names_the_nearest_known_one_in_the_docs_spelling() -> None:
    # Spark lower-cases names before the source sees them.
    with pytest.raises(OptionError) as raised:
        parse_source({"topic": "t", "startingoffset": "earliest"})
    message = str(raised.value)
    assert 'did you mean "startingOffsets"?' in message and "\n" not in message
    assert "known options: " in message and "maxRowsPerTrigger" in message
    with pytest.raises(OptionError, match='did you mean "acks"'):
        parse_sink({"topic": "t", "ack": "all"})
    with pytest.raises(OptionError) as raised:
        parse_source({"topic": "t", "zzzz": "1"})
    assert "did you mean" not in str(raised.value)


def test_reader_options_are_checked_for_either_kind_of_read() -> None:
    check_reader_options({"topic": "t", "maxOffsetsPerTrigger": "5"})  # a stream's
    check_reader_options({"topic": "t", "endingOffsets": "latest"})  # a batch's
    with pytest.raises(OptionError, match='did you mean "endingOffsets"'):
        check_reader_options({"topic": "t", "endingoffset": "latest"})
    with pytest.raises(OptionError, match="streaming queries"):
        check_reader_options({"topic": "t", "endingOffsets": "latest", "maxrowspertrigger": "5"})


# Run with pyspark hidden, as in an environment without the spark extra.
_WITHOUT_PYSPARK = """
import sys

class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "pyspark":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Hide())
import spark_connector
"""


def test_importing_the_connector_without_pyspark_says_which_extra_to_install() -> None:
    import subprocess
    import sys

    from tests.proc_helpers import env

    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_PYSPARK], capture_output=True, text=True, env=env()
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last == (
        "ModuleNotFoundError: spark_connector: pyspark not installed: pip install 'episub[spark]'"
    ), result.stderr
    assert "No module named 'pyspark'" not in result.stderr

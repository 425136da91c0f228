"""What one ReadRange page of one-row messages costs the agent and the reading task, per
row, as one Delivery each and as columns (`ReadRange.as_rows`): no I/O, no Spark.

    .venv/bin/python benchmarks/read_pages.py --out benchmarks/results/read_pages.json

A page of --rows messages of --size bytes (no key, no headers, as `episub node` publishes
them in benchmarks/outside_messages.py), each way:

  agent   the page's reply framed (agent/wire.py: delivery_to_pb per message, or rows_to_pb)
  task    the frame decoded and the page made one Arrow batch (the source's schema), after
          one warm-up page (pyarrow's first call costs a second once per process)

and, for the agent, the page as it is made from what a node holds: the messages read from
retention (their stored envelopes) and framed as columns, through a Delivery each
(`retained`, then rows_to_pb) and straight from the envelopes (`retained_envelopes`, then
envelope_rows_to_pb, the agent's way for plain rows).

Times are process CPU time, the best of --repeat runs, in µs per row.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from episub.agent import agent_pb2 as pb
from episub.agent.wire import (
    decode_response,
    delivery_from_pb,
    delivery_to_pb,
    encode_frame,
    envelope_rows_to_pb,
    rows_from_pb,
    rows_to_pb,
)
from episub.node.retained import retained, retained_envelopes
from episub.proto.envelope import Envelope
from episub.proto.store import MessageStore, RetentionConfig
from episub.records import Delivery


def page(rows: int, size: int) -> list[Delivery]:
    return [
        Delivery(
            topic="t", publisher=b"127.0.0.1:7000/0123456789abcdef", seq=seq,
            timestamp_ms=1_700_000_000_000 + seq, key=None,
            value=(b"%d " % seq + b"x" * size)[:size], headers=(), id=seq.to_bytes(32, "big"),
        )
        for seq in range(rows)
    ]  # fmt: skip


def retention_page(messages: list[Delivery]) -> tuple[MessageStore, bytes]:
    """A node's store holding `messages` as a node stores them (envelope bytes)."""
    publisher = messages[0].publisher
    store = MessageStore(
        RetentionConfig(max_messages=len(messages), max_bytes=1 << 40, max_age=3600.0)
    )
    places = store.places("t")
    for m in messages:
        envelope = Envelope(
            publisher=publisher, seq=m.seq, timestamp_ms=m.timestamp_ms, payload=m.value
        )
        store.add(places, m.id, envelope, 1, 0.0)
    return store, publisher


def best(repeat: int, work) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        started = time.process_time()
        work()
        times.append(time.process_time() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000, help="messages in the page")
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    import numpy as np
    import pyarrow as pa

    from spark_connector.arrow_rows import page_record_batch, source_schema
    from spark_connector.planner import publisher_text

    schema = source_schema(True)
    messages = page(args.rows, args.size)

    def one_each() -> bytes:
        out = pb.Messages(next_seq=args.rows)
        out.messages.extend(delivery_to_pb(m) for m in messages)
        return encode_frame(pb.Response(id=1, messages=out))

    def as_rows() -> bytes:
        out = pb.Messages(next_seq=args.rows)
        rows_to_pb(messages, out)
        return encode_frame(pb.Response(id=1, messages=out))

    def read_one_each(frame: bytes) -> pa.RecordBatch:
        """The task's way before as_rows: a Delivery per message, then each column built
        from Python lists."""
        got = [delivery_from_pb(m) for m in decode_response(frame[4:]).messages.messages]
        stamps = np.array([m.timestamp_ms for m in got], dtype=np.int64) * 1000
        columns = [
            pa.array([m.topic for m in got], pa.string()),
            pa.array([publisher_text(m.publisher) for m in got], pa.string()),
            pa.array([m.seq for m in got], pa.int64()),
            pa.array(stamps, type=schema.field("timestamp").type),
            pa.array([m.key for m in got], pa.binary()),
            pa.array([m.value for m in got], pa.binary()),
            pa.array([[dict(key=k, value=v) for k, v in m.headers] for m in got],
                     schema.field("headers").type),
        ]  # fmt: skip
        return pa.RecordBatch.from_arrays(columns, schema=schema)

    def read_as_rows(frame: bytes) -> pa.RecordBatch:
        rows = rows_from_pb(decode_response(frame[4:]).messages)
        return page_record_batch("t", "p", rows.rows, rows.seqs, schema)

    frames = {"one Delivery each": one_each(), "as_rows": as_rows()}
    readers = {"one Delivery each": read_one_each, "as_rows": read_as_rows}
    out: dict[str, object] = {"rows": args.rows, "size": args.size}
    for name, frame in frames.items():
        readers[name](frame)  # warm-up
        agent = best(args.repeat, one_each if name != "as_rows" else as_rows)
        task = best(args.repeat, lambda f=frame, r=readers[name]: r(f))  # type: ignore[misc]
        out[name] = {
            "agent_us_per_row": round(1e6 * agent / args.rows, 2),
            "task_us_per_row": round(1e6 * task / args.rows, 2),
            "frame_bytes": len(frame),
        }
    store, publisher = retention_page(messages)

    def via_deliveries() -> bytes:
        out = pb.Messages(next_seq=args.rows)
        rows_to_pb(retained(store, "t", publisher, 0, args.rows - 1, 0.0), out)
        return encode_frame(pb.Response(id=1, messages=out))

    def from_envelopes() -> bytes:
        out = pb.Messages(next_seq=args.rows)
        envelope_rows_to_pb(retained_envelopes(store, "t", publisher, 0, args.rows - 1, 0.0), out)
        return encode_frame(pb.Response(id=1, messages=out))

    assert via_deliveries() == from_envelopes()
    out["from retention"] = {
        "via_deliveries_us_per_row": round(1e6 * best(args.repeat, via_deliveries) / args.rows, 2),
        "from_envelopes_us_per_row": round(1e6 * best(args.repeat, from_envelopes) / args.rows, 2),
    }
    line = json.dumps(out)
    print(line)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(line + "\n")


if __name__ == "__main__":
    main()

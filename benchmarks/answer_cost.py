"""What answering costs a node's CPU per megabyte: the source of the per-peer answer byte
budget (episub/net/answers.py, ANSWER_BYTES_PER_SECOND).

    .venv/bin/python benchmarks/answer_cost.py

One PULL answer of a 1 MB message, as a node makes it when the asker's lane is served:
the HISTORY encoded (wire.encode_item), put in a frame, sealed, and written to a socket
whose other end another thread reads. The CPU time of the writing thread alone (user and
system) per answer, median of --rounds rounds of --answers answers; and what the byte
budget then allows one asking peer: that CPU per MB times the budget, as a share of one core.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import threading
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from episub.net.answers import ANSWER_BYTES_PER_SECOND
from episub.net.framing import take_frames
from episub.net.sealing import RecordSealer
from episub.proto import messages as m
from episub.proto.envelope import Envelope
from episub.proto.wire import encode_item

PAYLOAD = 1_000_000


def one_round(answers: int) -> float:
    """CPU seconds of this thread per answer."""
    envelope = Envelope(publisher=b"p" * 20, seq=0, timestamp_ms=1, payload=b"x" * PAYLOAD)
    history = m.History(publisher=envelope.publisher, envelopes=(envelope.raw,), hops=(1,))
    sealer = RecordSealer(bytes(32))
    ours, theirs = socket.socketpair()

    def drain() -> None:
        while theirs.recv(1 << 20):
            pass

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    started = time.thread_time()
    for _ in range(answers):
        frame, _, _ = take_frames(deque([encode_item("topic", history)]))
        ours.sendall(sealer.seal(frame))
    spent = time.thread_time() - started
    ours.close()
    reader.join()
    theirs.close()
    return spent / answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    per_answer = statistics.median(one_round(args.answers) for _ in range(args.rounds))
    per_mb = per_answer * 1e6 / PAYLOAD
    result = {
        "cpu_ms_per_mb_answered": round(per_mb * 1000, 2),
        "answer_bytes_per_second": ANSWER_BYTES_PER_SECOND,
        "core_share_at_the_budget": round(per_mb * ANSWER_BYTES_PER_SECOND / 1e6, 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""How fast a node's agent answers `inspect` while a keyed peer makes it serve the PULL
amplification sequence, and what the attack does to honest delivery's latency.

    .venv/bin/python benchmarks/inspect_under_attack.py --runs 2 \
        --out benchmarks/results/inspect_under_attack.json

Three `episub node` processes a, b (through a) and c (through b) on 127.0.0.1, as in
tests/test_bounded_answers_processes.py, whose pieces this script reuses (the repository
root goes on sys.path). Per run: a publishes HONEST messages ten at a time, 100 ms apart,
and b's and c's subscribers time each one (receipt minus its publish timestamp): the
"before" figures. Then, while a thread asks b's agent `inspect` every 20 ms, a raw peer
with the key joins b's topic and publishes 48 GOSSIPs of 1 MB under its own id; once c
holds them too and both subscribers here have read them, it sends 100 PULLs of all of
them in frames of ten and closes its connection, and a publishes as many again: the
"during" figures (inspect's over the whole sequence, honest delivery's from the PULLs
on). Printed: per run, `inspect`
answers, median, p99 and max latency and failures; honest delivery complete or not, and
its p99 at b and c before and during; `inspect` before the attack (the machine's own
noise); one JSON line, written to --out when given.

Timings on a shared machine move with its load: the 1-minute load average before and
after each run is recorded with it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from episub import Delivery
from tests.proc_helpers import Processes, wait_until
from tests.test_bounded_answers_processes import SEEDED, InspectProbe, pull_sequence
from tests.test_multiprocess import publish, subscribe
from tests.test_robustness_processes import stats, three_nodes

HONEST = 200  # messages a publishes in each phase
PACE = 0.1  # seconds between its batches of ten: 2 s a phase, about the attack's length


# Deliveries of other publishers (the attacker's) each subscriber has read, by node: the
# honest publisher waits until they are all read, so that its messages do not queue
# behind them in this process.
others_read: dict[str, int] = {}


def receive_latencies(
    name: str, subscribed: object, publisher: bytes, first: int, last: int
) -> dict:
    """Seqs first..last of `publisher` as they arrive: which came, and each one's latency
    (receipt here minus the publish timestamp, in ms)."""
    _, sub = subscribed  # type: ignore[misc]
    seqs, latencies = [], []
    others_read[name] = 0
    deadline = time.monotonic() + 60
    while (not seqs or seqs[-1] < last) and time.monotonic() < deadline:
        item = sub.receive(timeout=max(0.1, deadline - time.monotonic()))
        if item is None:
            break
        if isinstance(item, Delivery) and item.publisher == publisher and item.seq >= first:
            seqs.append(item.seq)
            latencies.append(time.time() * 1000 - item.timestamp_ms)
        elif isinstance(item, Delivery) and item.publisher != publisher:
            others_read[name] += 1
    return {"complete": seqs == list(range(first, last + 1)), "latencies": latencies}


def honest_phase(
    overlay: object,
    subs: dict,
    first: int,
    publisher: bytes = b"",
    go: threading.Event | None = None,
) -> tuple[bytes, dict[str, dict]]:
    """a publishes seqs first.. (once `go` is set); `publisher`: a's id, if known, so that
    the subscribers are read from the start (what else they get is read and ignored)."""
    known = [publisher] if publisher else []
    with ThreadPoolExecutor(len(subs)) as pool:

        def collect(name: str) -> dict:
            while not known:
                time.sleep(0.001)
            return receive_latencies(name, subs[name], known[0], first, first + HONEST - 1)

        futures = {name: pool.submit(collect, name) for name in subs}
        if go is not None:
            go.wait(120)
        for start in range(first, first + HONEST, 10):
            receipts = publish(overlay.socket("a"), start, 10)  # type: ignore[attr-defined]
            if not known:
                known.append(receipts[0].publisher)
            time.sleep(PACE)  # paces the load over the phase; no synchronisation
        return known[0], {name: f.result() for name, f in futures.items()}


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else float("nan")


def one_run() -> dict[str, object]:
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ep-bench-") as directory:
        processes = Processes(Path(directory))
        try:
            overlay = three_nodes(processes)
            subs = {name: subscribe(overlay.socket(name)) for name in ("b", "c")}
            with InspectProbe(overlay.socket("b")) as quiet:
                publisher, before = honest_phase(overlay, subs, 0)
            go = threading.Event()

            def relayed() -> None:
                """The 48 MB reached c too, and both subscribers here read it: what
                follows is the PULLs' doing."""
                wait_until(
                    lambda: (
                        stats(overlay, "c")["retained_messages"] >= SEEDED + HONEST
                        and all(others_read.get(name, 0) >= SEEDED for name in subs)
                    ),
                    what="c to hold the peer's messages and the subscribers to read them",
                )
                go.set()

            with InspectProbe(overlay.socket("b")) as probe, ThreadPoolExecutor(1) as pool:
                during_future = pool.submit(honest_phase, overlay, subs, HONEST, publisher, go)
                trio.run(pull_sequence, overlay, relayed)
                _, during = during_future.result()
            for client, _ in subs.values():
                client.close()
        finally:
            processes.kill_all()
    lat = sorted(probe.latencies)
    result: dict[str, object] = {
        "inspect_before_p99_ms": round(p99(quiet.latencies) * 1000, 1),
        "inspect_before_max_ms": round(max(quiet.latencies, default=math.nan) * 1000, 1),
        "inspect_answers": len(lat),
        "inspect_failures": len(probe.failures),
        "inspect_median_ms": round(statistics.median(lat) * 1000, 1) if lat else None,
        "inspect_p99_ms": round(p99(lat) * 1000, 1),
        "inspect_max_ms": round(lat[-1] * 1000, 1) if lat else None,
        "honest_complete": all(r["complete"] for r in (*before.values(), *during.values())),
    }
    for name in ("b", "c"):
        result[f"honest_p99_ms_{name}_before"] = round(p99(before[name]["latencies"]), 1)
        result[f"honest_p99_ms_{name}_during"] = round(p99(during[name]["latencies"]), 1)
    result["load_before"], result["load_after"] = load_before, os.getloadavg()[0]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    runs = [one_run() for _ in range(args.runs)]
    for run in runs:
        print(json.dumps(run), file=sys.stderr)
    line = json.dumps({"runs": runs})
    print(line)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(line + "\n")


if __name__ == "__main__":
    main()

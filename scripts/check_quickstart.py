"""Run docs/quickstart.md's "Three nodes on one machine" block as written, N times.

    .venv/bin/python scripts/check_quickstart.py --runs 20

Each run pastes the block into `bash` (three `episub node ... &` started together, as a
reader would), waits until each node's agent socket answers and shows a neighbour in the
topic, then pastes the next block (subscribe on n2 in the background), waits for its
`subscribed to 'events'` as the doc says, pastes the one after (publish `hello world` on
n0) and checks that the subscriber printed both values and exited; then it stops the
nodes (SIGTERM to the run's process group). Prints one line per run and the count that
worked; exits 1 unless every run did. The block's ports (7000-7002, 9464) and sockets
(/tmp/n0..n2.sock) must be free.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from episub.agent import AgentClient, AgentError, AgentUnavailable  # noqa: E402

SOCKETS = ("/tmp/n0.sock", "/tmp/n1.sock", "/tmp/n2.sock")
TOPIC = "events"
JOIN_WAIT = 60.0  # s: a bound, so a broken run fails instead of hanging
DELIVERY_WAIT = 30.0  # s: the same, for the subscriber's two messages
EXPECTED = ["hello", "world"]  # what the doc's subscriber prints
SUBSCRIBED = f"subscribed to {TOPIC!r}"  # what it says first, on stderr


def the_blocks() -> tuple[str, str, str]:
    """The section's first three sh blocks: the nodes, subscribe, publish."""
    text = (ROOT / "docs" / "quickstart.md").read_text()
    section = text.split("## Three nodes on one machine", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.DOTALL)
    assert len(blocks) >= 3, (
        "no nodes, subscribe, publish blocks under 'Three nodes on one machine'"
    )
    return blocks[0], blocks[1], blocks[2]


def linked(socket_path: str) -> bool:
    try:
        with AgentClient(socket_path, timeout=5.0) as client:
            return bool(client.inspect().topics.get(TOPIC))
    except (AgentUnavailable, AgentError, OSError):
        return False


def subscribe_and_publish(subscribe: str, publish: str, log: Path) -> tuple[bool, str]:
    """Run the subscribe block; once the subscriber says it is subscribed (on stderr), the
    publish block. The subscriber (`--count 2`, in the background) keeps stdout open until
    it exits, so reading stdout to its end waits for it."""
    subscriber = subprocess.Popen(
        ["bash", "-c", subscribe], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:
        said = _stderr_line(subscriber, DELIVERY_WAIT)
        if said != SUBSCRIBED:
            return False, f"the subscriber said {said!r}, not {SUBSCRIBED!r}"
        with open(log, "ab") as stderr:
            published = subprocess.run(
                ["bash", "-c", publish], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr,
                timeout=DELIVERY_WAIT,
            )  # fmt: skip
        if published.returncode != 0:
            return False, f"publish exited with {published.returncode}"
        try:
            out, _ = subscriber.communicate(timeout=DELIVERY_WAIT)
        except subprocess.TimeoutExpired:
            return False, f"the subscriber printed fewer than 2 values in {DELIVERY_WAIT:.0f} s"
        values = out.decode(errors="replace").splitlines()
        if values != EXPECTED:
            return False, f"the subscriber printed {values}"
        return True, "subscribed, then the subscriber printed hello, world"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(subscriber.pid, signal.SIGTERM)
        subscriber.wait()


def _stderr_line(process: subprocess.Popen[bytes], timeout: float) -> str:
    """The first line `process` writes to stderr, or "" if none comes within `timeout`."""
    assert process.stderr is not None
    ready, _, _ = select.select([process.stderr], [], [], timeout)
    return process.stderr.readline().decode(errors="replace").strip() if ready else ""


def run_once(blocks: tuple[str, str], log: Path) -> tuple[bool, str]:
    nodes, subscribe, publish = blocks
    with open(log, "ab") as stderr:
        shell = subprocess.Popen(
            ["bash", "-c", nodes],
            cwd=ROOT,
            start_new_session=True,  # the nodes share the shell's process group: one kill
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    started = time.monotonic()
    try:
        pending = set(SOCKETS)
        while pending and time.monotonic() - started < JOIN_WAIT:
            pending = {s for s in pending if not linked(s)}
            time.sleep(0.1)
        took = time.monotonic() - started
        if pending:
            return False, f"no neighbour after {took:.0f} s at {', '.join(sorted(pending))}"
        delivered, how = subscribe_and_publish(subscribe, publish, log)
        return delivered, f"all three linked after {took:.1f} s; {how}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGTERM)
        shell.wait()
        for path in SOCKETS:  # wait for each node's exit (it removes its socket first)
            deadline = time.monotonic() + 10
            while os.path.exists(path) and time.monotonic() < deadline:
                time.sleep(0.05)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--log", type=Path, default=Path("/tmp/check-quickstart.log"))
    args = parser.parse_args()
    blocks = the_blocks()
    worked = 0
    for i in range(args.runs):
        ok, how = run_once(blocks, args.log)
        worked += ok
        print(f"run {i + 1}: {'ok' if ok else 'FAILED'}: {how}", flush=True)
    print(f"{worked} of {args.runs} runs formed the three-node overlay and delivered")
    return 0 if worked == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())

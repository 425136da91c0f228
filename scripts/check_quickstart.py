"""Run docs/quickstart.md's "Three nodes on one machine" block as written, N times.

    .venv/bin/python scripts/check_quickstart.py --runs 20

Each run pastes the block into `bash` (three `episub node ... &` started together, as a
reader would), then waits until each node's agent socket answers and shows a neighbour in
the topic, and stops the nodes (SIGTERM to the run's process group). Prints one line per
run and the count that worked; exits 1 unless every run did. The block's ports (7000-7002,
9464) and sockets (/tmp/n0..n2.sock) must be free.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
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


def the_block() -> str:
    text = (ROOT / "docs" / "quickstart.md").read_text()
    section = text.split("## Three nodes on one machine", 1)[1]
    found = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert found is not None, "no sh block under 'Three nodes on one machine'"
    return found[1]


def linked(socket_path: str) -> bool:
    try:
        with AgentClient(socket_path, timeout=5.0) as client:
            return bool(client.inspect().topics.get(TOPIC))
    except (AgentUnavailable, AgentError, OSError):
        return False


def run_once(block: str, log: Path) -> tuple[bool, str]:
    with open(log, "ab") as stderr:
        shell = subprocess.Popen(
            ["bash", "-c", block],
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
        return True, f"all three linked after {took:.1f} s"
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
    block = the_block()
    worked = 0
    for i in range(args.runs):
        ok, how = run_once(block, args.log)
        worked += ok
        print(f"run {i + 1}: {'ok' if ok else 'FAILED'}: {how}", flush=True)
    print(f"{worked} of {args.runs} runs formed the three-node overlay")
    return 0 if worked == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())

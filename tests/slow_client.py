"""An outsider without the key: it opens slow connections to a node as fast as it can.

    .venv/bin/python -m tests.slow_client --target 127.0.0.1:7000 --source 127.0.0.2 \\
        --connections 20000 --seconds 60

Each connection comes from `--source` (any 127.0.0.0/8 address works on Linux), sends the
first two bytes of a handshake frame's length and then nothing: a handshake that never
finishes. The newest `--hold` connections are kept open; an older one is closed to make
room. The loop stops after `--connections` connections, `--seconds` seconds, or when its
stdin closes, whichever comes first: bounded in count and time.

stdout: "OPENED <n>" after the 1st connection and every `--report` more, then
"DONE <opened> <failed>" at the end. Used by tests/test_net_handshake_slots.py.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import select
import socket
import sys
import time

CONNECT_TIMEOUT = 2.0  # s; a full accept queue drops SYNs, and connect waits for the retry


def stdin_closed() -> bool:
    ready, _, _ = select.select([sys.stdin], [], [], 0)
    return bool(ready) and not sys.stdin.buffer.read1(4096)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="host:port of the node")
    parser.add_argument("--source", default="127.0.0.2", help="local address to connect from")
    parser.add_argument("--connections", type=int, default=20_000, help="at most this many")
    parser.add_argument("--seconds", type=float, default=60.0, help="for at most this long")
    parser.add_argument("--hold", type=int, default=800, help="connections kept open at once")
    parser.add_argument("--report", type=int, default=100, help="an OPENED line every N")
    args = parser.parse_args()
    host, _, port = args.target.rpartition(":")
    held: collections.deque[socket.socket] = collections.deque()
    opened = failed = 0
    deadline = time.monotonic() + args.seconds
    try:
        while opened < args.connections and time.monotonic() < deadline:
            if opened % 50 == 0 and stdin_closed():
                break
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.settimeout(CONNECT_TIMEOUT)
            try:
                sock.bind((args.source, 0))
                sock.connect((host, int(port)))
                sock.send(b"\x00\x00")  # half of a length prefix: the handshake never ends
            except OSError:
                failed += 1
                sock.close()
                continue
            held.append(sock)
            while len(held) > args.hold:
                held.popleft().close()
            opened += 1
            if opened == 1 or opened % args.report == 0:
                print(f"OPENED {opened}", flush=True)
    finally:
        for sock in held:
            with contextlib.suppress(OSError):
                sock.close()
    print(f"DONE {opened} {failed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""An outsider without the key, connecting to a node (flat out, or --rate a second), per --mode.

    .venv/bin/python tests/outsider_client.py --target 127.0.0.1:7000 --mode slow \\
        --source 127.0.0.2 --connections 20000 --seconds 60

Modes (each connection comes from --source; any 127.0.0.0/8 address works on Linux):
  slow       the first 2 bytes of a handshake frame's length, then nothing: a handshake
             that never finishes. The newest --hold connections stay open; older ones are
             closed to make room.
  idle       connects and sends nothing; held like `slow`.
  garbage    4 KiB of random bytes, then close.
  huge       a length prefix of 4 GiB - 1, 60 more bytes, then close.
  truncated  a real-looking Hello's length prefix and half of it, then close.

The loop stops after --connections connections, --seconds seconds, or when stdin closes,
whichever comes first: bounded in count and time. stdout: "OPENED <n>" after the first
connection and every --report more, then "DONE <opened> <failed>". Used by
benchmarks/outsider.py and tests/test_net_handshake_slots.py.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import select
import socket
import struct
import sys
import time

CONNECT_TIMEOUT = 2.0  # s; a full accept queue drops SYNs, and connect waits for the retry
_HELLO_LENGTH = struct.pack(">I", 120)  # about a Hello's size (episub/net/handshake.py)
OPENINGS = {
    "slow": b"\x00\x00",
    "idle": b"",
    "garbage": None,  # fresh random bytes per connection
    "huge": b"\xff\xff\xff\xff" + b"\x00" * 60,
    "truncated": _HELLO_LENGTH + b"\x08\x01\x12\x20" + b"\x00" * 56,
}
HELD = ("slow", "idle")  # modes that keep their connections open


def stdin_closed() -> bool:
    ready, _, _ = select.select([sys.stdin], [], [], 0)
    return bool(ready) and not sys.stdin.buffer.read1(4096)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="host:port of the node")
    parser.add_argument("--mode", choices=sorted(OPENINGS), default="slow")
    parser.add_argument("--source", default="127.0.0.2", help="local address to connect from")
    parser.add_argument("--connections", type=int, default=20_000, help="at most this many")
    parser.add_argument("--seconds", type=float, default=60.0, help="for at most this long")
    parser.add_argument("--hold", type=int, default=800, help="connections kept open at once")
    parser.add_argument("--report", type=int, default=100, help="an OPENED line every N")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="connections a second (0: flat out)"
    )
    args = parser.parse_args()
    host, _, port = args.target.rpartition(":")
    held: collections.deque[socket.socket] = collections.deque()
    opened = failed = 0
    started = time.monotonic()
    deadline = started + args.seconds
    try:
        while opened < args.connections and time.monotonic() < deadline:
            if args.rate > 0:
                time.sleep(max(0.0, started + opened / args.rate - time.monotonic()))
            if opened % 50 == 0 and stdin_closed():
                break
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.settimeout(CONNECT_TIMEOUT)
            opening = OPENINGS[args.mode]
            try:
                sock.bind((args.source, 0))
                sock.connect((host, int(port)))
                sock.sendall(os.urandom(4096) if opening is None else opening)
            except OSError:
                failed += 1
                sock.close()
                continue
            if args.mode in HELD:
                held.append(sock)
                while len(held) > args.hold:
                    held.popleft().close()
            else:
                sock.close()
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

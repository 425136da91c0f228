"""Where a publisher, a relay and a leaf spend their time: a summary of the cProfile files
that `loopback.py` leaves with BENCH_PROFILE_DIR (see peer_common.py).

    BENCH_PROFILE_DIR=/tmp/prof .venv/bin/python benchmarks/loopback.py --system episub \\
        --nodes 8 --size 256 --messages 20000 --out /tmp/prof/run.json
    .venv/bin/python benchmarks/profile_summary.py /tmp/prof /tmp/prof/run.json \\
        --out benchmarks/results/profile_after.json

The publisher is node 0; the relay is the receiver that wrote the most bytes (it forwards
to eager children), the leaf the one that wrote the least. Per role: the profiled total,
the functions with the most time of their own, and time by area (trio's loop, socket
system calls, sealing, the wire codec, the core, the node API, the benchmark's own code).
"""

from __future__ import annotations

import argparse
import json
import pstats
from pathlib import Path
from typing import Any

AREAS = (  # (area, substring of "file:function"), first match wins
    ("socket system calls", "_socket.socket"),
    ("socket system calls", "posix.read"),  # the reader and writer use os.read/os.write
    ("socket system calls", "posix.write"),
    ("epoll wait", "select.epoll"),
    ("sealing (ChaCha20-Poly1305)", "sealing.py"),
    ("sealing (ChaCha20-Poly1305)", "ChaCha20Poly1305"),
    ("wire codec", "proto/wire.py"),
    ("wire codec", "proto/envelope.py"),
    ("wire codec", "blake3"),
    ("wire codec", "google"),
    ("wire codec", "SerializeToString"),
    ("wire codec", "ParseFromString"),
    ("core (sans-IO)", "episub/proto/"),
    ("runtime and network", "episub/net/"),
    ("node API, retention, subscriptions", "episub/node/"),
    ("node API, retention, subscriptions", "episub/retention.py"),
    ("node API, retention, subscriptions", "episub/subscription.py"),
    ("benchmark's own code", "benchmarks/"),
    ("trio's scheduler and I/O", "trio/"),
    ("trio's scheduler and I/O", "outcome"),
    ("builtins and the rest", ""),
)


def summarize(path: Path, top: int) -> dict[str, Any]:
    stats = pstats.Stats(str(path))
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = []
    areas: dict[str, float] = {}
    waiting = 0.0
    for (file, line, name), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{file}:{name}"
        if "select.epoll" in where:
            waiting += tt
        area = next(a for a, key in AREAS if key in where)
        areas[area] = areas.get(area, 0.0) + tt
        rows.append((tt, f"{Path(file).name}:{line}({name})" if line else name))
    busy = total - waiting
    rows.sort(reverse=True)
    return {
        "profiled_s": round(total, 3),
        "busy_s": round(busy, 3),
        "by_area_pct_of_busy": {
            a: round(100 * t / busy, 1)
            for a, t in sorted(areas.items(), key=lambda kv: -kv[1])
            if a != "epoll wait" and busy > 0
        },
        "top_own_time": [
            {"function": where, "s": round(tt, 3), "pct_of_busy": round(100 * tt / busy, 1)}
            for tt, where in rows
            if "select.epoll" not in where
        ][:top],
    }


def roles(run: dict[str, Any]) -> dict[str, int]:
    nodes = run["nodes"]
    receivers = [n for n in nodes if n["role"] == "receiver"]
    written = sorted(receivers, key=lambda n: n.get("wire_bytes_written") or 0)
    return {"publisher": 0, "relay": written[-1]["index"], "leaf": written[0]["index"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("profiles", type=Path, help="BENCH_PROFILE_DIR of the run")
    p.add_argument("run", type=Path, help="the run's loopback.py --out JSON")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    run = json.loads(args.run.read_text())
    out: dict[str, Any] = {"command": run["command"], "summary": run["summary"]}
    for role, index in roles(run).items():
        out[role] = {"node": index, **summarize(args.profiles / f"node{index}.prof", args.top)}
        print(f"{role} (node {index}): busy {out[role]['busy_s']} s of {out[role]['profiled_s']}")
        for area, pct in out[role]["by_area_pct_of_busy"].items():
            print(f"  {pct:5.1f}%  {area}")
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()

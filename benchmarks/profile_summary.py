"""Where a publisher, a relay and a leaf spend their time: a summary of the cProfile files
that `loopback.py` leaves with BENCH_PROFILE_DIR (see peer_common.py).

    BENCH_PROFILE_DIR=/tmp/prof .venv/bin/python benchmarks/loopback.py --system episub \\
        --nodes 8 --size 256 --messages 20000 --out /tmp/prof/run.json
    .venv/bin/python benchmarks/profile_summary.py /tmp/prof /tmp/prof/run.json \\
        --out benchmarks/results/profile_after.json

With --idle, the profiles of an idle overlay (`idle_cpu.py --profile DIR`) are summed:
time by area, by job (frames read, timers by kind, dials, catch-ups) and the GC's share:

    .venv/bin/python benchmarks/idle_cpu.py --nodes 16 --profile /tmp/idle-prof
    .venv/bin/python benchmarks/profile_summary.py --idle /tmp/idle-prof

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
    ("node API, retention, subscriptions", "episub/proto/store.py"),
    ("node API, retention, subscriptions", "episub/subscription.py"),
    ("benchmark's own code", "benchmarks/"),
    ("trio's scheduler and I/O", "trio/"),
    ("trio's scheduler and I/O", "outcome"),
    ("builtins and the rest", ""),
)


# What an idle node's CPU goes to, by job: cumulative time of the function that does it
# ("file:function" substrings; a job's time includes what it calls, so jobs may nest).
IDLE_JOBS = (
    ("frames read: open, decode, core, answer (Connection._read_loop)", "connection.py:_read_loop"),
    ("  of which the core and carrying out (Runtime._on_frames)", "runtime.py:_on_frames"),
    ("timers fired (Runtime._timer_loop)", "runtime.py:_timer_loop"),
    ("  of which the core's timer handling (NodeState._on_timer)", "proto/node.py:_on_timer"),
    ("  of which pings to neighbours (Membership._ping_active)", "membership.py:_ping_active"),
    ("  of which passive probes (PassiveView.probe)", "passive.py:probe"),
    ("  of which stabilisation (Membership._stabilize)", "membership.py:_stabilize"),
    ("  of which optimisation (Membership._optimize)", "membership.py:_optimize"),
    ("  of which shuffles (PassiveView.start_shuffle)", "passive.py:start_shuffle"),
    ("  of which the connection sweep (Network.sweep)", "network.py:sweep"),
    ("dials and their handshakes (Network._dial)", "network.py:_dial"),
    ("accepted connections' handshakes (Network._on_inbound)", "network.py:_on_inbound"),
    ("catch-ups of links that came up (catchup.py _catch_up)", "catchup.py:_catch_up"),
)


def summarize_idle(paths: list[Path]) -> dict[str, Any]:
    """Every idle node's profile summed (idle_cpu.py --profile): time by area and by job,
    as % of the profiled CPU, and the GC's share (profiled_node.py's OUT.gc.json)."""
    stats = pstats.Stats(*(str(p) for p in paths))
    total = stats.total_tt  # type: ignore[attr-defined]
    jobs = {}
    for job, key in IDLE_JOBS:
        file_part, name = key.split(":")
        jobs[job] = sum(
            ct
            for (file, _line, fn), (_cc, _nc, _tt, ct, _callers) in stats.stats.items()  # type: ignore[attr-defined]
            if file.endswith(file_part) and fn == name
        )
    loop = sum(
        ct
        for (file, _line, fn), (_cc, _nc, _tt, ct, _callers) in stats.stats.items()  # type: ignore[attr-defined]
        if file.endswith("_run.py") and fn == "unrolled_run"
    )
    tasks = sum(
        ct
        for (file, _line, fn), (_cc, _nc, _tt, ct, _callers) in stats.stats.items()  # type: ignore[attr-defined]
        if fn == "<method 'run' of '_contextvars.Context' objects>"
    )
    gc_files = [Path(str(p) + ".gc.json") for p in paths]
    gc = [json.loads(f.read_text()) for f in gc_files if f.exists()]
    return {
        "profiles": len(paths),
        "profiled_cpu_s": round(total, 3),
        "trio_loop_outside_tasks_pct": round(100 * (loop - tasks) / total, 1) if total else 0,
        "by_job_pct": {job: round(100 * t / total, 1) for job, t in jobs.items()},
        "by_area_pct": summarize_stats(stats, top=0)["by_area_pct_of_busy"],
        "gc_cpu_s": round(sum(g["cpu_s"] for g in gc), 4) if gc else None,
        "gc_collections": [sum(g["collections"][i] for g in gc) for i in range(3)] if gc else None,
    }


def summarize(path: Path, top: int) -> dict[str, Any]:
    return summarize_stats(pstats.Stats(str(path)), top)


def summarize_stats(stats: pstats.Stats, top: int) -> dict[str, Any]:
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
    p.add_argument("run", type=Path, nargs="?", help="the run's loopback.py --out JSON")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--out", type=Path)
    p.add_argument("--idle", action="store_true",
                   help="sum every nodeI.prof of an idle_cpu.py --profile DIR instead")  # fmt: skip
    args = p.parse_args()
    if args.idle:
        idle = summarize_idle(sorted(args.profiles.glob("node*.prof")))
        print(json.dumps(idle, indent=1))
        if args.out:
            args.out.write_text(json.dumps(idle, indent=1) + "\n")
        return
    if args.run is None:
        p.error("the run's JSON is needed (or --idle)")
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

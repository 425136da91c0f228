"""Soak run: N episub node processes on 127.0.0.1, steady publishing, one node SIGKILLed
and restarted every --kill-every seconds; RSS, delivery to live nodes, repair counters.

    .venv/bin/python benchmarks/soak.py --nodes 6 --minutes 1 --kill-every 15     # dev run
    flock /tmp/episub-heavy.lock .venv/bin/python benchmarks/soak.py --nodes 16 \\
        --minutes 10 --out benchmarks/results/soak.json                           # the run

Each node incarnation is one `benchmarks/soak_peer.py` process (a plain `episub.Node`,
the protocol's defaults, sealed frames on), listening on its slot's fixed port, so a
restarted node comes back at the same address under a new peer id, as a restarted service
would. Nodes 0..P-1 publish (--rate msg/s in all, split evenly, --size bytes each, on a
fixed grid) and are never killed; the others are killed in turn, in an order shuffled by
--seed, the i-th kill at i x --kill-every seconds after publishing starts, each restarted
--restart-delay seconds after its kill with every other node's address as bootstrap list.

How each figure is defined (the pure functions below compute them; tests/test_soak_figures.py
checks them):

- Times are CLOCK_MONOTONIC ns, one clock for every process of the host.
- An incarnation is *up* from the moment it reported READY (listening, joined, a first
  neighbour) until it was SIGKILLed, or until the driver sent SIGTERM at the end.
- A message published at t *counts* for node n (n not its publisher) when one incarnation
  of n was up at t and stayed up until t + --grace. It is *delivered* when that
  incarnation's subscription got it (its .recv log, written line by line, so a killed
  incarnation's records up to the kill are there). Delivery ratio = delivered / counted,
  exact; every miss is listed (node, incarnation, publisher, seq, publish time).
- RSS: VmRSS of every node process from /proc/PID/status every --rss-interval s. Per
  incarnation, the baseline is the first sample at least --warmup s after it was up and
  publishing had started; the figure is max(samples after it) - baseline. The bound is
  --rss-bound-mib for every incarnation observed past its warm-up.
- Counters: each incarnation's `node.stats()` (summed over its topics by the node), the
  last sample it wrote: every --stats-interval s, and a final one on its graceful exit.
  So a killed incarnation's counters stop at most --stats-interval s before its kill;
  the JSON says which incarnations are final and which are samples.

Every child is killed by PID when the script ends, on an exception or Ctrl-C included; a
child also exits when its stdin closes (the driver is gone) and after a hard --deadline.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import os
import platform
import random
import select
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common
from _common import free_ports, process_cpu_s, rss_kib

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PEER = HERE / "soak_peer.py"
NS = 1_000_000_000
MIB = 1024  # KiB per MiB: RSS is sampled in KiB
MAX_UNEXPECTED_EXITS = 20  # nodes that died on their own and were started again, at most
# Counters shown in the summary (all counters go to the JSON): repair, pruning, loss.
REPAIR_COUNTERS = (
    "gossip_received",
    "duplicates_received",
    "prunes_sent",
    "grafts_sent",
    "graft_ids_sent",
    "ihave_ids_sent",
    "pulls_sent",
    "recovered",
    "data_lost",
    "optimizations",
    "optimize_swaps",
    "evictions",
    "peers_lost",
    "dial_failures",
    "handshake_failures",
    "queue_overflows",
    "subscriber_dropped",
)

# -- figures (pure; tests/test_soak_figures.py) ---------------------------------------------


@dataclass(frozen=True, slots=True)
class Life:
    """One incarnation of a node: up from `up_ns` (None: never got up) to `end_ns`."""

    node: int
    incarnation: int
    up_ns: int | None
    end_ns: int


@dataclass(frozen=True, slots=True)
class Miss:
    node: int
    incarnation: int
    publisher: int
    seq: int
    published_ns: int


def live_delivery(
    published: Iterable[tuple[int, int, int]],
    lives: Sequence[Life],
    received: Mapping[tuple[int, int], set[tuple[int, int]]],
    grace_ns: int,
) -> dict[str, Any]:
    """Delivery to nodes alive for a message's whole lifetime (see the module docstring).

    published: (publisher node, seq, publish ns); received: (node, incarnation) -> the
    (publisher, seq) its subscription got."""
    counted = delivered = 0
    misses: list[Miss] = []
    for publisher, seq, t in published:
        for life in lives:
            if life.node == publisher or life.up_ns is None:
                continue
            if not life.up_ns <= t <= life.end_ns - grace_ns:
                continue
            counted += 1
            if (publisher, seq) in received.get((life.node, life.incarnation), ()):
                delivered += 1
            else:
                misses.append(Miss(life.node, life.incarnation, publisher, seq, t))
    return {
        "counted": counted,
        "delivered": delivered,
        "ratio": delivered / counted if counted else None,
        "misses": misses,
    }


def rss_growth(
    samples: Sequence[tuple[int, int]], since_ns: int, warmup_ns: int
) -> dict[str, Any] | None:
    """Baseline = first sample at or after since + warm-up; growth = max after it - baseline.

    samples: (ns, KiB) in time order. None when no sample falls after the warm-up."""
    after = [(t, kib) for t, kib in samples if t >= since_ns + warmup_ns]
    if not after:
        return None
    base_t, base = after[0]
    peak = max(kib for _, kib in after)
    return {
        "after_warmup_kib": base,
        "after_warmup_at_ns": base_t,
        "max_kib": peak,
        "growth_kib": peak - base,
        "last_kib": after[-1][1],
        "observed_s": (after[-1][0] - base_t) / NS,
    }


def rss_bound(growths: Mapping[str, dict[str, Any] | None], bound_kib: int) -> dict[str, Any]:
    """Did every incarnation observed past its warm-up grow by at most bound_kib?"""
    judged = {name: g for name, g in growths.items() if g is not None}
    over = sorted(name for name, g in judged.items() if g["growth_kib"] > bound_kib)
    return {
        "bound_kib": bound_kib,
        "judged": len(judged),
        "not_judged": sorted(name for name, g in growths.items() if g is None),
        "over": over,
        "held": bool(judged) and not over,
        "max_growth_kib": max((g["growth_kib"] for g in judged.values()), default=None),
    }


def sum_counters(samples: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """The integer counters of several stats samples, summed by name."""
    out: dict[str, int] = {}
    for stats in samples:
        for name, value in stats.items():
            if isinstance(value, int) and not isinstance(value, bool):
                out[name] = out.get(name, 0) + value
    return dict(sorted(out.items()))


def counter_rates(
    series: Iterable[Sequence[tuple[int, Mapping[str, Any]]]],
    t0_ns: int,
    bucket_ns: int,
    names: Sequence[str],
) -> list[dict[str, Any]]:
    """Counter increments of all incarnations by time bucket: each increment between two
    consecutive samples of one incarnation goes to the bucket of the later sample.

    series: per incarnation, its (ns, stats) samples in time order."""
    buckets: dict[int, dict[str, int]] = {}
    for samples in series:
        for (_, before), (t, after) in itertools.pairwise(samples):
            sums = buckets.setdefault((t - t0_ns) // bucket_ns, dict.fromkeys(names, 0))
            for name in names:
                sums[name] += after.get(name, 0) - before.get(name, 0)
    return [{"t_s": b * bucket_ns / NS, **buckets[b]} for b in sorted(buckets)]


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest rank; None for no values."""
    return _common.percentile(values, p) if values else None


# -- processes --------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process so far, None once it is gone."""
    try:
        return process_cpu_s(pid)
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class Incarnation:
    node: int
    number: int
    popen: subprocess.Popen[bytes]
    started_ns: int
    up_ns: int | None = None
    end_ns: int | None = None
    peer_id: str | None = None
    how_ended: str | None = None  # "killed", "stopped", "exited N"
    published: int | None = None  # PUBLISHED count (publishers)
    rss: list[tuple[int, int]] = field(default_factory=list)
    cpu_s: float | None = None
    _buffer: bytes = b""

    @property
    def name(self) -> str:
        return f"n{self.node}.{self.number}"

    def lines(self) -> list[str]:
        """Complete stdout lines available now, without blocking."""
        assert self.popen.stdout is not None
        fd = self.popen.stdout.fileno()
        while select.select([fd], [], [], 0)[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            self._buffer += chunk
        *done, self._buffer = self._buffer.split(b"\n")
        return [line.decode(errors="replace") for line in done]


class Cluster:
    """The node processes of one run; `close` kills every one still running, by PID."""

    def __init__(self, args: argparse.Namespace, workdir: Path, env: dict[str, str]) -> None:
        self.args = args
        self.dir = workdir
        self.env = env
        self.ports = free_ports(args.nodes)
        self.current: dict[int, Incarnation] = {}
        self.all: list[Incarnation] = []
        self.unexpected_exits: list[str] = []

    def address(self, node: int) -> str:
        return f"127.0.0.1:{self.ports[node]}"

    def start(self, node: int, bootstrap: Sequence[int]) -> Incarnation:
        number = sum(1 for inc in self.all if inc.node == node)
        command = [
            sys.executable,
            str(PEER),
            "--index",
            str(node),
            "--incarnation",
            str(number),
            "--listen",
            self.address(node),
            "--dir",
            str(self.dir),
            "--size",
            str(self.args.size),
            "--stats-interval",
            str(self.args.stats_interval),
            "--deadline",
            str(self.args.node_deadline),
        ]
        for other in bootstrap:
            command += ["--bootstrap", self.address(other)]
        if self.args.config:
            command += ["--config", self.args.config]
        if self.args.retention_age is not None:
            command += ["--retention-age", str(self.args.retention_age)]
        with open(self.dir / f"n{node}.{number}.stderr", "wb") as err:
            popen = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=self.env
            )
        inc = Incarnation(node, number, popen, time.monotonic_ns())
        self.current[node] = inc
        self.all.append(inc)
        return inc

    def poll(self) -> None:
        """Read READY/PUBLISHED lines; notice incarnations that ended on their own."""
        for inc in list(self.current.values()):
            for line in inc.lines():
                words = line.split()
                if words[:1] == ["READY"] and len(words) == 4:
                    inc.peer_id, inc.up_ns = words[1], int(words[3])
                elif words[:1] == ["PUBLISHED"]:
                    inc.published = int(words[1])
            status = inc.popen.poll()
            if status is not None and inc.end_ns is None:
                inc.end_ns, inc.how_ended = time.monotonic_ns(), f"exited {status}"
                self.unexpected_exits.append(inc.name)
                del self.current[inc.node]

    def wait_up(self, inc: Incarnation, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while inc.up_ns is None:
            self.poll()
            if inc.end_ns is not None:
                raise RuntimeError(f"{inc.name} exited before READY; see {self.dir}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{inc.name} not READY within {timeout} s; see {self.dir}")
            time.sleep(0.05)

    def kill(self, node: int) -> Incarnation:
        inc = self.current.pop(node)
        inc.end_ns = time.monotonic_ns()  # before the signal: it was up until here at least
        inc.cpu_s = cpu_seconds(inc.popen.pid)
        os.kill(inc.popen.pid, signal.SIGKILL)
        inc.popen.wait(10)
        inc.how_ended = "killed"
        return inc

    def sample_rss(self) -> None:
        for inc in self.current.values():
            kib = rss_kib(inc.popen.pid)
            if kib is not None:
                inc.rss.append((time.monotonic_ns(), kib))

    def stop(self, timeout: float) -> None:
        """SIGTERM every running node (each writes its final stats), then reap them."""
        now = time.monotonic_ns()
        for inc in self.current.values():
            inc.cpu_s = cpu_seconds(inc.popen.pid)
            inc.end_ns, inc.how_ended = now, "stopped"
            with contextlib.suppress(ProcessLookupError):
                os.kill(inc.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for inc in self.current.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                inc.popen.wait(max(0.1, deadline - time.monotonic()))
        self.current.clear()

    def close(self) -> None:
        """Kill, by PID, every incarnation still running; close every pipe."""
        for inc in self.all:
            if inc.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(inc.popen.pid, signal.SIGKILL)
        for inc in self.all:
            with contextlib.suppress(subprocess.TimeoutExpired):
                inc.popen.wait(10)
            for stream in (inc.popen.stdin, inc.popen.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()


def kill_order(candidates: Sequence[int], kills: int, seed: int) -> list[int]:
    """Round-robin over the candidates, in an order shuffled once by `seed`."""
    order = list(candidates)
    random.Random(seed).shuffle(order)
    return [order[i % len(order)] for i in range(kills)] if order else []


# -- the run ----------------------------------------------------------------------------------


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    source = source_state()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)])}
    env.setdefault("EPISUB_KEY", os.urandom(32).hex())  # the deployment key; never recorded
    publishers = list(range(args.publishers))
    duration = args.minutes * 60.0
    per_publisher = round(duration * args.rate / args.publishers)
    kills = int((duration - 1e-9) // args.kill_every) if args.kill_every > 0 else 0
    order = kill_order(range(args.publishers, args.nodes), kills, args.seed)
    load: list[tuple[float, tuple[float, float, float]]] = [(0.0, os.getloadavg())]
    cluster = Cluster(args, workdir, env)
    events: list[dict[str, Any]] = []
    try:
        for node in range(args.nodes):  # one by one: each joins through those before it
            cluster.wait_up(cluster.start(node, range(node)), args.ready_timeout)
        time.sleep(args.settle)  # let the views fill and the RTT probes run (default 10 s)
        rate = args.rate / args.publishers
        t0 = time.monotonic_ns()
        for node in publishers:
            inc = cluster.current[node]
            assert inc.popen.stdin is not None
            inc.popen.stdin.write(f"START {per_publisher} {rate}\n".encode())
            inc.popen.stdin.flush()
        kill_at = [t0 + round((i + 1) * args.kill_every * NS) for i in range(len(order))]
        restart: tuple[int, int] | None = None  # (node, when)
        next_rss = next_load = time.monotonic_ns()
        end = t0 + round((duration + args.drain) * NS)  # the loop's bound
        while time.monotonic_ns() < end:
            now = time.monotonic_ns()
            cluster.poll()
            if now >= next_rss:
                cluster.sample_rss()
                next_rss += round(args.rss_interval * NS)
            if now >= next_load:
                load.append(((now - t0) / NS, os.getloadavg()))
                next_load += 10 * NS
            if kill_at and now >= kill_at[0]:
                kill_at.pop(0)
                victim = order[len(order) - len(kill_at) - 1]
                if victim in cluster.current:
                    inc = cluster.kill(victim)
                    events.append({"kill": inc.name, "t_s": (inc.end_ns - t0) / NS})
                    restart = (victim, inc.end_ns + round(args.restart_delay * NS))
            if restart is not None and now >= restart[1]:
                node = restart[0]
                restart = None
                inc = cluster.start(node, [n for n in range(args.nodes) if n != node])
                events.append({"start": inc.name, "t_s": (inc.started_ns - t0) / NS})
            for node in range(args.nodes):  # a node that died on its own comes back too,
                if (  # a bounded number of times
                    node not in cluster.current
                    and (restart is None or restart[0] != node)
                    and len(cluster.unexpected_exits) <= MAX_UNEXPECTED_EXITS
                ):
                    inc = cluster.start(node, [n for n in range(args.nodes) if n != node])
                    events.append({"start": inc.name, "t_s": (inc.started_ns - t0) / NS})
            time.sleep(0.1)
        cluster.poll()
        cluster.sample_rss()
        cluster.stop(args.stop_timeout)
        load.append(((time.monotonic_ns() - t0) / NS, os.getloadavg()))
    finally:
        cluster.close()
    return analyse(args, cluster, t0, events, load, source)


def read_received(path: Path) -> tuple[set[tuple[int, int]], int, list[str], list[int]]:
    """(publisher, seq) delivered, duplicates, lost/lagged lines, latencies (ns)."""
    got: set[tuple[int, int]] = set()
    duplicates = 0
    notes: list[str] = []
    latency: list[int] = []
    if not path.exists():
        return got, 0, notes, latency
    for line in path.read_text().splitlines():
        words = line.split()
        if len(words) == 4 and words[0].isdigit():
            key = (int(words[0]), int(words[1]))
            if key in got:
                duplicates += 1
            got.add(key)
            latency.append(int(words[3]) - int(words[2]))
        elif words:
            notes.append(line)
    return got, duplicates, notes, latency


def read_stats(path: Path) -> list[dict[str, Any]]:
    """An incarnation's stats samples; a line cut short by a SIGKILL is left out."""
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def analyse(
    args: argparse.Namespace,
    cluster: Cluster,
    t0: int,
    events: list[dict[str, Any]],
    load: list[Any],
    source: dict[str, Any],
) -> dict[str, Any]:
    workdir = cluster.dir
    published: list[tuple[int, int, int]] = []
    for node in range(args.publishers):
        path = workdir / f"n{node}.pub"
        for line in path.read_text().splitlines() if path.exists() else []:
            seq, t = map(int, line.split())
            published.append((node, seq, t))
    lives, received, per_inc = [], {}, {}
    latencies: list[int] = []
    counters_final, counters_sampled = [], []
    series: list[list[tuple[int, dict[str, Any]]]] = []
    warmup = round(args.warmup * NS)
    growths = {}
    for inc in cluster.all:
        assert inc.end_ns is not None
        lives.append(Life(inc.node, inc.number, inc.up_ns, inc.end_ns))
        got, dups, notes, lat = read_received(workdir / f"{inc.name}.recv")
        received[(inc.node, inc.number)] = got
        latencies += lat
        samples = read_stats(workdir / f"{inc.name}.stats")
        series.append([(sample["t"], sample["stats"]) for sample in samples])
        stats = samples[-1] if samples else None
        if stats is not None:
            (counters_final if stats["final"] else counters_sampled).append(stats["stats"])
        growth = None
        if inc.up_ns is not None:
            growth = rss_growth(inc.rss, max(inc.up_ns, t0), warmup)
        growths[inc.name] = growth
        per_inc[inc.name] = {
            "node": inc.node,
            "incarnation": inc.number,
            "role": "publisher" if inc.node < args.publishers else "receiver",
            "peer_id": inc.peer_id,
            "started_s": (inc.started_ns - t0) / NS,
            "up_s": None if inc.up_ns is None else (inc.up_ns - t0) / NS,
            "end_s": (inc.end_ns - t0) / NS,
            "how_ended": inc.how_ended,
            "published": inc.published,
            "delivered": len(got),
            "duplicates": dups,
            "notes": notes[:50],
            "cpu_s": inc.cpu_s,
            "rss": growth,
            "rss_series": [[round((t - t0) / NS, 2), kib] for t, kib in inc.rss],
            "stats": stats,
        }
    delivery = live_delivery(published, lives, received, round(args.grace * NS))
    bound = rss_bound(growths, round(args.rss_bound_mib * MIB))
    counted_final = sum_counters(counters_final)
    counted_sampled = sum_counters(counters_sampled)
    totals = sum_counters([counted_final, counted_sampled])
    return {
        "command": shlex.join([sys.executable, *sys.argv]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "source": source,
        "parameters": {k: v for k, v in vars(args).items() if k not in ("out", "keep")},
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "loadavg": [[t, list(avg)] for t, avg in load],
        "published": {n: sum(1 for p in published if p[0] == n) for n in range(args.publishers)},
        "expected_per_publisher": round(args.minutes * 60.0 * args.rate / args.publishers),
        "events": events,
        "unexpected_exits": cluster.unexpected_exits,
        "delivery": {
            **{k: v for k, v in delivery.items() if k != "misses"},
            "grace_s": args.grace,
            "misses": [
                {
                    "node": m.node,
                    "incarnation": m.incarnation,
                    "publisher": m.publisher,
                    "seq": m.seq,
                    "published_s": (m.published_ns - t0) / NS,
                }
                for m in delivery["misses"]
            ],
            "duplicates": sum(i["duplicates"] for i in per_inc.values()),
            "latency_ms": {
                "p50": _ms(percentile(latencies, 50)),
                "p99": _ms(percentile(latencies, 99)),
                "max": _ms(max(latencies, default=None)),
            },
        },
        "rss": {"warmup_s": args.warmup, **bound},
        "counters": {
            "what": "sum over incarnations of each one's last stats sample: final (written "
            "at its graceful exit) for incarnations alive at the end, else the periodic "
            f"sample at most {args.stats_interval} s before its kill",
            "incarnations_final": len(counters_final),
            "incarnations_sampled_before_kill": len(counters_sampled),
            "incarnations_without_sample": len(cluster.all)
            - len(counters_final)
            - len(counters_sampled),
            "total": totals,
            "per_interval": counter_rates(
                series, t0, round(args.stats_interval * NS), REPAIR_COUNTERS
            ),
        },
        "incarnations": per_inc,
    }


def source_state() -> dict[str, Any]:
    """The commit the nodes run, and the files under episub/ and benchmarks/ that differ
    from it; read when the run starts (a commit made meanwhile is not what ran)."""

    def git(*words: str) -> str | None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            done = subprocess.run(
                ["git", "-C", str(ROOT), *words], capture_output=True, timeout=10, check=True
            )
            return done.stdout.decode()
        return None

    head = git("rev-parse", "HEAD")
    changed = git("status", "--porcelain", "--untracked-files=no", "--", "episub", "benchmarks")
    return {
        "commit": head.strip() if head else None,
        "changed": None if changed is None else changed.splitlines(),
    }


def _ms(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 1)


def summary(result: dict[str, Any]) -> str:
    d, r, c = result["delivery"], result["rss"], result["counters"]
    out = [f"soak: {result['command']}"]
    ratio = "n/a" if d["ratio"] is None else f"{d['ratio']:.6f}"
    out.append(
        f"published {sum(result['published'].values())} "
        f"(expected {result['expected_per_publisher']} per publisher); kills "
        f"{sum(1 for e in result['events'] if 'kill' in e)}; unexpected exits "
        f"{len(result['unexpected_exits'])}"
    )
    out.append(
        f"delivery to live nodes: {d['delivered']} / {d['counted']} = {ratio} "
        f"(grace {d['grace_s']} s); misses {len(d['misses'])}; duplicates {d['duplicates']}; "
        f"latency p50/p99/max {d['latency_ms']['p50']}/{d['latency_ms']['p99']}/"
        f"{d['latency_ms']['max']} ms"
    )
    for miss in d["misses"][:20]:
        out.append(f"  miss: {miss}")
    out.append("RSS per incarnation (MiB): after warm-up -> max (growth), observed s")
    for name, inc in result["incarnations"].items():
        g = inc["rss"]
        if g is None:
            out.append(f"  {name:8} ({inc['how_ended']}) not observed past warm-up")
            continue
        out.append(
            f"  {name:8} {g['after_warmup_kib'] / MIB:7.1f} -> {g['max_kib'] / MIB:7.1f} "
            f"(+{g['growth_kib'] / MIB:.1f}) over {g['observed_s']:.0f} s ({inc['how_ended']})"
        )
    held = "held" if r["held"] else "NOT held"
    out.append(
        f"RSS bound: growth <= {r['bound_kib'] / MIB:.1f} MiB after {r['warmup_s']} s warm-up: "
        f"{held} ({r['judged']} judged, max growth "
        f"{(r['max_growth_kib'] or 0) / MIB:.1f} MiB, over: {r['over']})"
    )
    totals = c["total"]
    out.append(
        f"counters ({c['incarnations_final']} final, {c['incarnations_sampled_before_kill']} "
        f"sampled before kill): "
        + ", ".join(f"{name}={totals.get(name, 0)}" for name in REPAIR_COUNTERS)
    )
    prefix = "handshake_failed_"
    reasons = {k[len(prefix) :]: n for k, n in totals.items() if k.startswith(prefix) and n}
    out.append(
        "handshake failures by reason: "
        + (", ".join(f"{why}={n}" for why, n in reasons.items()) or "none")
    )
    out.append(f"load average: {result['loadavg'][0][1]} -> {result['loadavg'][-1][1]}")
    return "\n".join(out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = p.add_argument
    add("--nodes", type=int, default=16, help="node processes (default 16)")
    add("--minutes", type=float, default=10.0, help="publishing time (default 10)")
    add("--rate", type=float, default=20.0, help="msg/s from all publishers together (20)")
    add("--publishers", type=int, default=2, help="nodes 0..P-1 publish, never killed (2)")
    add("--size", type=int, default=256, help="payload bytes (256)")
    add("--kill-every", type=float, default=30.0, help="seconds between kills; 0: none (30)")
    add("--restart-delay", type=float, default=1.0, help="kill to restart, seconds (1)")
    add("--grace", type=float, default=5.0, help="a message counts for nodes up this long (5)")
    add("--warmup", type=float, default=60.0, help="RSS baseline this long after up (60)")
    add(
        "--rss-bound-mib",
        type=float,
        default=24.0,
        help="allowed RSS growth after warm-up, MiB (24: about twice what the default 600 s "
        "windows hold after 10 minutes at 20 msg/s, ~1 KiB a message)",
    )
    add("--rss-interval", type=float, default=2.0, help="RSS sampling period, seconds (2)")
    add("--stats-interval", type=float, default=5.0, help="stats sampling period, s (5)")
    add("--settle", type=float, default=10.0, help="after all are up, before publishing (10)")
    add("--drain", type=float, default=15.0, help="after the last publish, before stop (15)")
    add("--ready-timeout", type=float, default=60.0, help="wait for one node's READY (60)")
    add("--stop-timeout", type=float, default=15.0, help="graceful stop, then SIGKILL (15)")
    add("--seed", type=int, default=1, help="shuffles the kill order (1)")
    add("--config", help="node overrides (JSON, as `episub node --config`) for every node")
    add("--retention-age", type=float, help="seconds a node's replay store keeps a message")
    add("--out", default=str(HERE / "results" / "soak.json"), help="result JSON")
    add("--keep", action="store_true", help="keep the per-node logs (else deleted)")
    args = p.parse_args(argv)
    if args.nodes < args.publishers + 1 or args.publishers < 1:
        p.error("need at least one publisher and one more node")
    if args.drain < args.grace:
        p.error("--drain must be >= --grace (the last messages need their grace)")
    if 0 < args.kill_every <= args.restart_delay:
        p.error("--kill-every must exceed --restart-delay (one node down at a time)")
    if min(args.minutes, args.rate) <= 0:
        p.error("--minutes and --rate must be > 0")
    args.node_deadline = (
        args.nodes * args.ready_timeout + args.settle + args.minutes * 60 + args.drain + 300
    )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Both end the run through `finally`, which kills the nodes. SIGINT explicitly: a shell
    # starts background jobs with it ignored, and Python then leaves it so.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    workdir = Path(tempfile.mkdtemp(prefix="episub-soak-"))
    try:
        result = run(args, workdir)
    except BaseException:
        print(f"soak: failed; the nodes' logs are in {workdir}", file=sys.stderr)
        raise
    if not args.keep:
        for path in workdir.iterdir():
            path.unlink()
        workdir.rmdir()
    if args.keep:
        result["logs"] = str(workdir)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(summary(result))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

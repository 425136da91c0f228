"""Loopback pub/sub benchmark: N node processes on 127.0.0.1, episub or py-libp2p gossipsub.

    # py-libp2p gossipsub (needs PyPI libp2p in its own venv, see gossipsub_peer.py)
    .venv/bin/python benchmarks/loopback.py --system gossipsub \\
        --python /work/bench-venv/bin/python --nodes 8 --size 256 --messages 600 --rate 0 \\
        --wait-quiet 60 --out benchmarks/results/gossipsub_n8_256B_burst.json
    # episub, same workload (node script: benchmarks/episub_peer.py)
    .venv/bin/python benchmarks/loopback.py --system episub --nodes 8 --size 256 --messages 600
    # the same with signed publishing: every node signs and verifies (its CPU cost)
    .venv/bin/python benchmarks/loopback.py --system episub --signed --nodes 8 --size 256 \
        --messages 600

Each JSON in benchmarks/results/ records the exact command that produced it ("command").
py-libp2p needs ~10-25 ms of CPU per delivered message, so its runs use a few hundred
messages (burst) or 4 msg/s (paced) to stay under two minutes on two cores.

The harness only uses the standard library. It starts N node processes, each listening on
a free 127.0.0.1 port (--port 0: the kernel picks it and the node reports it), wires them
into one overlay, waits until every node says READY (no sleeps), tells nodes 0..K-1 to
publish M messages of S bytes each (paced at R msg/s each, or back to back with R=0), waits
for every node to say DONE under a hard deadline, sends STOP, collects each node's RESULT,
kills every child by PID in a finally block, and prints and writes (--out) the figures
below, with the exact command line, library versions and how much CPU other processes on
the machine took meanwhile (--wait-quiet waits for them first; a shared 2-core machine
skews msgs/s and latency, much less CPU per message).

Figures (over the data phase, START to STOP; "delivered" = distinct messages that reached
a subscriber other than their publisher, summed over nodes; expected = M x K at a pure
receiver, M x (K-1) at a publisher):
  msgs/s per receiver    distinct / (last receive - first receive) at each node with
                         expected > 0; median, min and max over those nodes
  latency p50/p99 ms     receive time - send time stamped in the payload, all samples pooled
  delivery ratio         sum distinct / sum expected
  copies per delivered   payload copies that arrived from the network (first copies plus
                         duplicates, as the node's router counts them) / delivered
  wire bytes/delivered   bytes all nodes wrote to their TCP sockets / delivered
  CPU s per delivered    user+system CPU seconds of all node processes / delivered

Per-process contract (benchmarks/gossipsub_peer.py and benchmarks/episub_peer.py; the
shared implementation is benchmarks/peer_common.py):
  command line  PYTHON PEER --index I --nodes N --port P --role {publisher,receiver}
                --publishers K --messages M --size S --rate R --topic T --deadline SEC
                [--phase SEC] [--out FILE]. Publishers are I = 0..K-1; a paced one
                publishes its first message --phase seconds after START (--phases
                independent: a point of the interval drawn for its index; --phases
                together: all at START, every interval's K messages at one instant);
                payload bytes 0..15 are
                struct "!IIQ" (publisher index, seq 0..M-1, time.time_ns() at publish).
  stdout        protocol lines only (logs go to stderr), in this order:
                  LISTENING <addr>  listening on 127.0.0.1:P; <addr> is what other peers
                                    of the same system dial (a multiaddr for libp2p)
                  READY             connected, subscribed, overlay around it usable
                  DONE              published all M (publisher) and received all expected
                  RESULT <json>     one line, after STOP or at the --deadline; then exit
  stdin         lines from the harness:
                  BOOTSTRAP <addr>...  the addresses of nodes 0..I-1 (none for node 0); a
                                       peer may dial all of them or just one as a contact
                  START                begin the data phase (publishers start publishing)
                  STOP                 end the data phase; EOF on stdin means the same
  RESULT fields system, index, role, expected, received (distinct + duplicates delivered
                to the application), distinct, duplicates, own_echo, first_recv_ns,
                last_recv_ns, latency_ns (one sample per distinct message), published,
                publish_start_ns, publish_end_ns, payload_copies (null if unknown),
                wire_bytes_read, wire_bytes_written (data phase; null if unknown),
                wire_bytes_written_total, cpu_s (data phase), cpu_total_s, maxrss_kb,
                timed_out, config (knobs and notes), versions.
  exit status   0 after RESULT; 3 = system not available (nothing measured).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import queue
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import busy_cpu_s, enter_loopback_namespace, only_loopback, wait_quiet
from loopback_report import aggregate, print_report

HERE = Path(__file__).resolve().parent
PEERS = {
    "gossipsub": HERE / "gossipsub_peer.py",
    "episub": HERE / "episub_peer.py",
    "iroh": HERE / "iroh_peer.py",
}
# Systems that would reach out to the Internet by themselves (iroh's relays): they run in a
# network namespace with nothing but loopback (--isolate, on for them whatever is asked).
NEEDS_ISOLATION = frozenset({"iroh"})
RESULTS_TIMEOUT_S = 60.0
SIGNED_ENV = "EPISUB_BENCH_SIGNED"  # --signed: episub_peer.py runs Node(sign=True)
# A burst's messages per Node.publish_many call (--publish batch): a Spark task's write or an
# application draining its queue hands over a few hundred records at a time.
PUBLISH_BATCH = 256


class RunFailed(Exception):
    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Child:
    index: int
    proc: subprocess.Popen[str]
    log: Path
    addr: str | None = None
    result: dict[str, Any] | None = None
    seen: set[str] = field(default_factory=set)
    exited: int | None = None

    def send(self, line: str) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass


def _pump(child: Child, lines: queue.Queue[tuple[int, str | None]]) -> None:
    assert child.proc.stdout is not None
    for line in child.proc.stdout:
        lines.put((child.index, line.rstrip("\n")))
    lines.put((child.index, None))


def log_tail(child: Child, n: int = 15) -> str:
    try:
        text = child.log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-n:])


def wait_until(
    children: list[Child],
    lines: queue.Queue[tuple[int, str | None]],
    what: str,
    timeout: float,
    tolerate_exit: bool = False,
) -> None:
    """Consume protocol lines until every child has reported ``what``, or fail.

    With ``tolerate_exit`` a child that exits without reporting is given up on instead.
    """
    deadline = time.monotonic() + timeout
    while not all(what in c.seen or c.exited is not None for c in children):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            missing = [c.index for c in children if what not in c.seen]
            raise RunFailed(f"timeout after {timeout:.0f}s waiting for {what} from {missing}")
        try:
            index, line = lines.get(timeout=remaining)
        except queue.Empty:
            continue
        child = children[index]
        if line is None:
            child.exited = status = child.proc.wait()
            if what in child.seen or tolerate_exit:
                if what not in child.seen:
                    print(f"node {index} exited ({status}) without {what}", file=sys.stderr)
                continue
            raise RunFailed(
                f"node {index} exited (status {status}) before {what}:\n{log_tail(child)}",
                status=3 if status == 3 else 1,
            )
        word, _, rest = line.partition(" ")
        child.seen.add(word)
        if word == "LISTENING":
            child.addr = rest.strip()
        elif word == "RESULT":
            child.result = json.loads(rest)


def publisher_phase(index: int, rate: float) -> float:
    """Where in its interval a paced publisher starts (--phases independent): a point drawn
    for its index, the same in every run, so that publishers meet by chance, as
    independent sources do, and not all in the same instant of every interval."""
    return random.Random(f"publisher {index}").random() / rate


def data_timeout(args: argparse.Namespace) -> float:
    if args.timeout:
        return args.timeout
    return 60.0 + (args.messages / args.rate * 1.5 if args.rate > 0 else 60.0)


def run(args: argparse.Namespace, logdir: Path, machine: dict[str, Any]) -> list[dict[str, Any]]:
    peer = PEERS[args.system]
    lifetime = args.startup_timeout + data_timeout(args) + args.drain + RESULTS_TIMEOUT_S + 30
    lines: queue.Queue[tuple[int, str | None]] = queue.Queue()
    children: list[Child] = []
    env = dict(os.environ)
    env.update(kv.split("=", 1) for kv in args.peer_env)
    if args.signed:
        env[SIGNED_ENV] = "1"
    try:
        for i in range(args.nodes):
            role = "publisher" if i < args.publishers else "receiver"
            argv = [
                args.python, str(peer), "--index", str(i), "--nodes", str(args.nodes),
                "--port", "0", "--role", role, "--publishers", str(args.publishers),
                "--messages", str(args.messages), "--size", str(args.size),
                "--rate", str(args.rate), "--topic", args.topic, "--deadline", str(lifetime),
            ]  # fmt: skip
            if args.rate > 0 and args.phases == "independent" and i < args.publishers:
                argv += ["--phase", str(publisher_phase(i, args.rate))]
            if args.system == "episub" and args.publish == "batch" and args.rate == 0:
                argv += ["--batch", str(PUBLISH_BATCH)]
            log = logdir / f"node{i}.stderr"
            with open(log, "w") as err:
                proc = subprocess.Popen(
                    argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                    text=True, bufsize=1, cwd=HERE.parent, env=env,
                )  # fmt: skip
            child = Child(i, proc, log)
            children.append(child)
            threading.Thread(target=_pump, args=(child, lines), daemon=True).start()
        t0 = time.monotonic()
        wait_until(children, lines, "LISTENING", args.startup_timeout)
        for c in children:
            c.send(" ".join(["BOOTSTRAP"] + [str(p.addr) for p in children[: c.index]]))
        wait_until(
            children, lines, "READY", max(1.0, args.startup_timeout - (time.monotonic() - t0))
        )
        print(f"overlay ready after {time.monotonic() - t0:.1f}s", file=sys.stderr)
        for c in children:
            c.send("START")
        t1, busy0 = time.monotonic(), busy_cpu_s()
        machine["loadavg_at_start"] = os.getloadavg()
        try:
            wait_until(children, lines, "DONE", data_timeout(args))
            print(f"all DONE after {time.monotonic() - t1:.1f}s", file=sys.stderr)
            machine["all_done"] = True
        except RunFailed as exc:
            machine["all_done"] = False
            if exc.status == 3:
                raise
            print(f"warning: {exc}; collecting results anyway", file=sys.stderr)
        time.sleep(args.drain)  # let in-flight duplicates land before counting stops
        for c in children:
            c.send("STOP")
        busy1 = busy_cpu_s()
        machine["data_phase_s"] = time.monotonic() - t1
        if busy0 is not None and busy1 is not None:
            machine["machine_busy_cpu_s"] = busy1 - busy0
        wait_until(children, lines, "RESULT", RESULTS_TIMEOUT_S, tolerate_exit=True)
        return [c.result for c in children if c.result is not None]
    finally:
        for c in children:
            if c.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(c.proc.pid, signal.SIGKILL)
            try:
                c.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                print(f"node {c.index} (pid {c.proc.pid}) did not exit", file=sys.stderr)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--system", choices=sorted(PEERS), required=True)
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--size", type=int, default=256, help="payload bytes (>= 16)")
    p.add_argument("--messages", type=int, default=2000, help="M per publisher")
    p.add_argument("--publishers", type=int, default=1, help="K, nodes 0..K-1 publish")
    p.add_argument("--rate", type=float, default=0.0, help="msg/s per publisher, 0 = burst")
    p.add_argument(
        "--publish",
        choices=("batch", "one"),
        default="batch",
        help="episub's burst: publish_many with PUBLISH_BATCH messages a call (as a user with "
        "a burst at hand would), or publish one message a call; paced runs publish one",
    )
    p.add_argument(
        "--phases",
        choices=("independent", "together"),
        default="independent",
        help="paced publishers: each starts at its own point of the interval (independent "
        "sources, as sink partitions and executors are), or all at START, so that every "
        "interval begins with one message from each publisher at the same instant",
    )
    p.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    p.add_argument("--python", default=sys.executable, help="interpreter for node processes")
    p.add_argument("--topic", default="episub-bench")
    p.add_argument("--startup-timeout", type=float, default=180.0, help="LISTENING+READY, s")
    p.add_argument("--timeout", type=float, default=None, help="data phase cap, s")
    p.add_argument("--drain", type=float, default=0.5, help="s between all DONE and STOP")
    p.add_argument(
        "--peer-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for node processes (system-specific ablation switches)",
    )
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SEC",
        help="first wait up to SEC for other processes to leave the CPUs idle",
    )
    p.add_argument(
        "--isolate",
        action="store_true",
        help="run the nodes in a new network namespace with only loopback (root; always "
        "for " + ", ".join(sorted(NEEDS_ISOLATION)) + ")",
    )
    p.add_argument("--keep-logs", action="store_true", help="keep node stderr logs")
    p.add_argument(
        "--signed",
        action="store_true",
        help="episub only: signed publishing on every node (Node(sign=True))",
    )
    args = p.parse_args()
    if not 1 <= args.publishers <= args.nodes or args.nodes < 2 or args.size < 16:
        p.error("need 2 <= N, 1 <= K <= N and --size >= 16")
    if any("=" not in kv for kv in args.peer_env):
        p.error("--peer-env takes KEY=VALUE")
    if args.signed and args.system != "episub":
        p.error("--signed is episub's signed publishing; gossipsub and iroh sign by default")
    if (args.isolate or args.system in NEEDS_ISOLATION) and not only_loopback():
        try:
            enter_loopback_namespace()
        except OSError as exc:
            print(f"loopback: cannot isolate the network for {args.system}: {exc}",
                  file=sys.stderr)  # fmt: skip
            return 3
        args.isolate = True
    logdir = Path(tempfile.mkdtemp(prefix=f"loopback-{args.system}-"))
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    machine: dict[str, Any] = {"cpus": os.cpu_count(), "platform": platform.platform()}
    if args.wait_quiet > 0:
        machine["busy_cores_before"] = wait_quiet(args.wait_quiet)
    try:
        results = run(args, logdir, machine)
    except RunFailed as exc:
        print(f"loopback: {exc}\n(node logs in {logdir})", file=sys.stderr)
        return exc.status
    summary, nodes = aggregate(results)
    if "machine_busy_cpu_s" in machine:
        # CPU burnt by anything but the nodes (other jobs, the harness): contamination.
        machine["other_cpu_s"] = machine["machine_busy_cpu_s"] - summary["cpu_s_total"]
    print_report(args, summary, nodes, machine)
    if len(results) < args.nodes:
        print(f"warning: only {len(results)} of {args.nodes} results", file=sys.stderr)
    versions = dict(results[0]["versions"]) if results else {}
    versions["harness_python"] = platform.python_version()
    report = {
        "command": shlex.join(sys.orig_argv),
        "started_utc": started,
        "system": args.system,
        "params": {k: v for k, v in vars(args).items() if k not in ("out", "keep_logs")},
        "machine": machine,
        "versions": versions,
        "peer_config": results[0]["config"] if results else None,
        "summary": summary,
        "nodes": nodes,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
        print(f"wrote {args.out}")
    if args.keep_logs:
        print(f"node logs in {logdir}", file=sys.stderr)
    else:
        for f in logdir.iterdir():
            f.unlink()
        logdir.rmdir()
    return 0 if len(results) == args.nodes else 1


if __name__ == "__main__":
    sys.exit(main())

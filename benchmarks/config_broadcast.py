"""Live configuration: time from a write to visible on every reader node, four ways.

    PY=/work/main/.venv/bin/python
    $PY benchmarks/config_broadcast.py --system episub --nodes 32 \\
        --out benchmarks/results/config_episub_n32.json
    $PY benchmarks/config_broadcast.py --system redis --nodes 32 \\
        --out benchmarks/results/config_redis_n32.json
    $PY benchmarks/config_broadcast.py --system spark-episub --nodes 2 \\
        --out benchmarks/results/config_spark-episub_n2.json
    $PY benchmarks/config_broadcast.py --system spark-broadcast --nodes 2 \\
        --out benchmarks/results/config_spark-broadcast_n2.json

Systems (every process on this host; `--nodes` readers, plus one writer):
  episub           N reader processes, each a Node + ConfigReplica following versions with
                   `wait_for`; one writer process (Node + ConfigReplica, the topic's first
                   node, every reader joins through it) calls `replica.write` per update.
  redis            Debian's redis-server on a free 127.0.0.1 port, started here; N
                   subscriber processes (redis-py, SUBSCRIBE); one writer process PUBLISHes
                   the value with its version.
  spark-episub     local-cluster[N,1,1024]; the driver calls `cfg.set` per update while a
                   UDF on each executor follows versions with `config.wait_for`.
  spark-broadcast  local-cluster[N,1,1024]; per update the driver makes a new broadcast
                   variable and runs a job with one task per executor reading `bv.value`.
  episub-blocking  a design measurement, not the product: writer and N readers are nodes
                   of benchmarks/blocking_follower.py, the same core and codec pumped by
                   the application's thread over epoll instead of trio (what the runtime
                   costs).
  episub-thread    the same, with each reader's node in a thread of its own and its
                   application waiting on a lock (a product's shape of that design).

Clock: every process reads time.monotonic_ns() (CLOCK_MONOTONIC, one clock for the whole
host on Linux). Per update: latency = max over readers of (the first time that reader held
that version or a later one - the time the writer started the write). For spark-broadcast
the "reader time" is the end of the job (collect returned on the driver); the time each
task had read the value is recorded too (`in_task_ms`).

Updates are paced (--interval-ms apart, on a fixed grid; a late write is never followed by
a burst), the first --warmup ones are not counted. Every wait is bounded by --deadline;
child processes are killed by pid in a `finally`. Readers report on stdout, one line each:
`READY <addr>` once following, `RESULT <json>` once they hold the last version (or at the
deadline); they exit on `STOP` (or EOF) on stdin, so a reader that is done keeps
forwarding to the others until everyone is.
"""

from __future__ import annotations

import argparse
import bisect
import cProfile
import gc
import json
import os
import platform
import queue
import resource
import select
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _common import free_port, percentile, process_cpu_s, wakeups
from _common import self_cpu_s as cpu_s

ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = ("episub", "redis", "spark-episub", "spark-broadcast", "episub-blocking",
           "episub-thread")  # fmt: skip
ROLES = ("episub-writer", "episub-reader", "redis-writer", "redis-reader",
         "episub-blocking-reader", "episub-thread-reader",
         "episub-blocking-writer")  # fmt: skip
PROTOTYPES = ("episub-blocking", "episub-thread")  # readers of benchmarks/blocking_follower.py
KEY = bytes(range(32))  # the run's shared episub key
CONFIG_NAME = "default"  # the configuration every system's writer updates
REDIS_CHANNEL = "config.default"
MS = 1_000_000  # ns


# -- figures ----------------------------------------------------------------------------------


def first_seen(seen: Sequence[tuple[int, int]], version: int) -> int | None:
    """When a reader first held `version` or a later one, from its (version, time_ns) records
    (versions rising); None if it never did."""
    versions = [v for v, _ in seen]
    i = bisect.bisect_left(versions, version)
    return seen[i][1] if i < len(seen) else None


def update_latencies(
    sets: Sequence[tuple[int, int]], readers: Sequence[Sequence[tuple[int, int]]]
) -> list[int | None]:
    """Per write (version, start_ns): the latest reader's first sight of it minus its start,
    in ns; None when some reader never held it."""
    out: list[int | None] = []
    for version, start in sets:
        times = [first_seen(seen, version) for seen in readers]
        out.append(None if None in times else max(times) - start)  # type: ignore[type-var]
    return out


def summary(latencies_ns: Sequence[int | None]) -> dict[str, Any]:
    got = [v / MS for v in latencies_ns if v is not None]
    figures: dict[str, Any] = {"count": len(latencies_ns), "seen_everywhere": len(got)}
    if got:
        figures |= {
            "p50_ms": round(percentile(got, 50), 3),
            "p99_ms": round(percentile(got, 99), 3),
            "max_ms": round(max(got), 3),
            "mean_ms": round(sum(got) / len(got), 3),
        }
    return figures


# -- child processes ---------------------------------------------------------------------------


class Child:
    """A child process whose stdout lines a thread queues; stderr goes to a log file."""

    def __init__(self, argv: list[str], name: str, logdir: str, env: dict[str, str]) -> None:
        self.name = name
        self.log_path = os.path.join(logdir, f"{name}.log")
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in kill())
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
            env=env, cwd=ROOT,
        )  # fmt: skip
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, word: str, deadline: float) -> str:
        """The rest of the next stdout line starting with `word`; raises past `deadline`."""
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise SystemExit(f"{self.name}: no {word} before the deadline") from None
            if line is None:
                raise SystemExit(f"{self.name} exited ({self.proc.wait()}) before {word}; "
                                 f"its log:\n{self.tail()}")  # fmt: skip
            if line.split(" ", 1)[0] == word:
                return line[len(word) + 1 :]

    def send(self, line: str) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # it exited already: its RESULT (or absence) says the rest

    def tail(self, lines: int = 20) -> str:
        self._log.flush()
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._log.close()


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


def say(word: str, rest: str = "") -> None:
    print(f"{word} {rest}".rstrip(), flush=True)


# -- episub and redis: processes ----------------------------------------------------------------


def run_processes(args: argparse.Namespace, logdir: str) -> dict[str, Any]:
    """A writer child and `--nodes` reader children; returns the raw records."""
    final = args.warmup + args.updates
    children: list[Child] = []
    extra: dict[str, Any] = {}
    deadline = time.monotonic() + args.deadline
    base = [sys.executable, str(Path(__file__).resolve()), "--final", str(final),
            "--warmup", str(args.warmup),
            "--interval-ms", str(args.interval_ms), "--deadline", str(args.deadline)]  # fmt: skip
    redis_server: subprocess.Popen[bytes] | None = None
    try:
        if args.system == "redis":
            port = free_port()
            redis_server = subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            wait_for_port(port, deadline)
            extra["redis_version"] = redis_server_version()
            contact = str(port)
        writer_role = (
            "episub-blocking-writer" if args.system in PROTOTYPES else f"{args.system}-writer"
        )
        writer = Child(base + ["--role", writer_role]
                       + (["--contact", contact] if args.system == "redis" else []),
                       "writer", logdir, child_env())  # fmt: skip
        children.append(writer)
        ready = writer.expect("READY", deadline)
        if args.system in ("episub", *PROTOTYPES):
            contact = ready  # the writer's node address: every reader joins through it
        for i in range(args.nodes):
            argv = [*base, "--role", f"{args.system}-reader", "--contact", contact]
            children.append(Child(argv, f"reader{i}", logdir, child_env()))
        for child in children[1:]:
            child.expect("READY", deadline)
        time.sleep(args.settle)  # the overlay's first optimisation rounds (episub)
        load_before = os.getloadavg()
        server_cpu = process_cpu_s(redis_server.pid) if redis_server is not None else 0.0
        writer.send("START")  # the warm-up writes: every reader hears the writer once
        for child in children[1:]:
            child.expect("WARM", deadline)
        writer.send("GO")  # the measured writes
        written = json.loads(writer.expect("RESULT", deadline))
        readers = [json.loads(c.expect("RESULT", deadline)) for c in children[1:]]
        load_after = os.getloadavg()
        if redis_server is not None:
            extra["redis_server_cpu_s"] = process_cpu_s(redis_server.pid) - server_cpu
        for child in children:
            child.send("STOP")
        return {"written": written, "readers": readers, "loadavg": [load_before, load_after],
                **extra}  # fmt: skip
    finally:
        for child in children:
            child.kill()
        if redis_server is not None:
            redis_server.kill()
            redis_server.wait()


def wait_for_port(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.05)  # the server is starting: there is nothing to await
    raise SystemExit(f"redis-server did not listen on {port} before the deadline")


def redis_server_version() -> str:
    out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True)
    return out.stdout.strip()


def paced(
    first: int,
    last: int,
    interval_s: float,
    deadline: float,
    wait: Callable[[float], object] = time.sleep,
) -> Any:
    """Yields first..last, i at start + (i - first) * interval (no burst after a late one);
    `wait(s)` spends the time until the next is due (a sleep, or a node's pump, which may
    return sooner)."""
    start = time.monotonic()
    for i in range(first, last + 1):
        due = start + (i - first) * interval_s
        while (now := time.monotonic()) < due and now <= deadline:
            wait(due - now)
        if now > deadline:
            return
        yield i


def expect_line(word: str, line: str) -> None:
    if line.strip() != word:
        raise SystemExit(f"expected {word} on stdin, got {line!r}")


def value_for(i: int) -> dict[str, Any]:
    return {"threshold": i / 1000, "n": i}


async def episub_node(args: argparse.Namespace, writer: bool) -> None:
    import trio

    from episub import Node
    from episub.config import ConfigReplica

    async def stdin_line() -> str:
        return await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)

    async with Node(key=KEY, listen="127.0.0.1:0") as node, trio.open_nursery() as nursery:
        replica = ConfigReplica(node, CONFIG_NAME, bootstrap=[] if writer else [args.contact])
        await nursery.start(replica.run)
        with trio.fail_after(args.deadline):
            await replica.synced.wait()
        say("READY", node.address)
        deadline = trio.current_time() + args.deadline
        if writer:
            sets: list[tuple[int, int]] = []

            async def write(first: int, last: int) -> None:
                start = trio.current_time()
                for i in range(first, last + 1):
                    await trio.sleep_until(start + (i - first) * args.interval_ms / 1000)
                    if trio.current_time() > deadline:
                        break
                    t0 = time.monotonic_ns()
                    sets.append((await replica.write(value_for(i)), t0))

            expect_line("START", await stdin_line())
            await write(1, args.warmup)
            expect_line("GO", await stdin_line())
            profiler = start_profile()
            cpu_go, stats_go, woken, kernel = cpu_s(), node.stats(), wakeups(), sys_cpu_s()
            await write(args.warmup + 1, args.final)
            cpu_go, woken, kernel = cpu_s() - cpu_go, _since(woken), sys_cpu_s() - kernel
            stop_profile(profiler, "writer")
            stats = {k: v - stats_go.get(k, 0) for k, v in node.stats().items()}
            say("RESULT", json.dumps({"sets": sets, "cpu_s": cpu_go, "sys_cpu_s": kernel,
                                      "wakeups": woken, "stats": stats}))  # fmt: skip
        else:
            seen: list[tuple[int, int]] = []
            version = replica.state.version
            cpu_warm, stats_warm, woken, kernel = cpu_s(), node.stats(), wakeups(), sys_cpu_s()
            collector = GcClock()
            profiler = None
            if args.warmup == 0:
                say("WARM")
            while version < args.final and trio.current_time() < deadline:
                if await replica.wait_for(version + 1, timeout=1.0):
                    seen.append((replica.state.version, time.monotonic_ns()))
                    if version < args.warmup <= replica.state.version:
                        say("WARM")
                        profiler = start_profile()
                        cpu_warm, stats_warm, woken = cpu_s(), node.stats(), wakeups()
                        kernel = sys_cpu_s()
                        collector.reset()
                    version = replica.state.version
            stop_profile(profiler, "reader")
            stats = {k: v - stats_warm.get(k, 0) for k, v in node.stats().items()}
            say("RESULT", json.dumps({"seen": seen, "counters": replica.counters,
                                      "cpu_s": cpu_s() - cpu_warm, "stats": stats,
                                      "sys_cpu_s": sys_cpu_s() - kernel,
                                      "wakeups": _since(woken),
                                      "gc": collector.report(),
                                      "address": node.address,
                                      "rtts_ms": [n.rtt_ms for n in
                                                  node.neighbors(replica.topic)]}))  # fmt: skip
        with trio.move_on_after(args.deadline):
            await stdin_line()  # STOP, or EOF: keep forwarding until then
        nursery.cancel_scope.cancel()


class GcClock:
    """The cyclic garbage collector's passes in this process from `reset()` on: how many,
    their total and their longest time (a pause the process makes between two wakeups,
    which a reader's latency takes in full)."""

    def __init__(self) -> None:
        self.reset()
        self._started = 0.0
        gc.callbacks.append(self._on_gc)

    def reset(self) -> None:
        self.passes, self.total_s, self.longest_s = 0, 0.0, 0.0
        self.by_generation = [0, 0, 0]  # passes that collected generation 0, 1, 2
        self.over_1ms = 0

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        self.passes += 1
        self.total_s += took
        self.longest_s = max(self.longest_s, took)
        self.by_generation[info["generation"]] += 1
        self.over_1ms += took >= 0.001

    def report(self) -> dict[str, float]:
        return {"passes": self.passes, "total_ms": round(1000 * self.total_s, 3),
                "longest_ms": round(1000 * self.longest_s, 3), "over_1ms": self.over_1ms,
                "by_generation": self.by_generation}  # fmt: skip


def sys_cpu_s() -> float:
    """System (kernel) CPU seconds of this process so far: the part of cpu_s spent in
    system calls (socket reads and writes, epoll) rather than Python."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def start_profile() -> cProfile.Profile | None:
    """BENCH_PROFILE_DIR=DIR: cProfile (CPU time) of this process's measured updates."""
    if not os.environ.get("BENCH_PROFILE_DIR"):
        return None
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    return profiler


def stop_profile(profiler: cProfile.Profile | None, role: str) -> None:
    """...written to DIR/<role><pid>.prof."""
    if profiler is not None:
        profiler.disable()
        path = os.path.join(os.environ["BENCH_PROFILE_DIR"], f"{role}{os.getpid()}.prof")
        profiler.dump_stats(path)


def _since(woken: int | None) -> int | None:
    now = wakeups()
    return None if now is None or woken is None else now - woken


def blocking_reader(args: argparse.Namespace, threaded: bool) -> None:
    """A reader of the prototype without trio (blocking_follower.py): the same core and
    codec pumped by one thread over epoll; it follows versions as `episub` readers do.
    `threaded`: the node pumps in a thread of its own, this one waits on a lock."""
    from blocking_follower import BlockingFollower

    from episub.config.replica import config_topic

    follower = BlockingFollower(KEY, config_topic(CONFIG_NAME), args.contact)
    deadline = time.monotonic() + args.deadline
    while not follower.neighbors:  # joined: a neighbour accepted us
        if time.monotonic() > deadline:
            raise SystemExit("no neighbour before the deadline")
        follower.step(0.1)
    say("READY", follower.me.decode())
    cpu_warm, woken, kernel = cpu_s(), wakeups(), sys_cpu_s()
    if args.warmup == 0:
        say("WARM")
    seen: list[tuple[int, int]] = []
    version = 0
    state = follower.state
    profiler = None
    if threaded:
        threading.Thread(target=follower.serve, daemon=True).start()
    while version < args.final and time.monotonic() < deadline:
        if threaded:
            follower.wait_for(version + 1, 1.0)
        else:
            follower.step(1.0)
        if state.version > version:
            seen.append((state.version, time.monotonic_ns()))
            if version < args.warmup <= state.version:
                say("WARM")
                profiler = start_profile()
                cpu_warm, woken, kernel = cpu_s(), wakeups(), sys_cpu_s()
            version = state.version
    stop_profile(profiler, "blocking-reader")
    say("RESULT", json.dumps({"seen": seen, "cpu_s": cpu_s() - cpu_warm,
                              "sys_cpu_s": sys_cpu_s() - kernel,
                              "wakeups": _since(woken),
                              "malformed": follower.malformed}))  # fmt: skip
    stop = time.monotonic() + args.deadline
    stdin = sys.stdin.fileno()
    if threaded:  # the node's thread forwards until STOP (or EOF)
        select.select([stdin], [], [], args.deadline)
        follower.stop()
    while not threaded and time.monotonic() < stop:  # keep forwarding until STOP (or EOF)
        follower.step(0.05)
        if select.select([stdin], [], [], 0)[0]:
            break
    follower.close()


def blocking_writer(args: argparse.Namespace) -> None:
    """The prototype's writer (blocking_follower.py): the topic's first node, every reader
    joins through it; it pumps between its paced writes and while it waits for a line."""
    from blocking_follower import BlockingFollower

    from episub.config.replica import config_topic

    node = BlockingFollower(KEY, config_topic(CONFIG_NAME), None)
    say("READY", node.address)
    stdin = sys.stdin.fileno()
    deadline = time.monotonic() + args.deadline

    def next_line() -> str:
        while time.monotonic() < deadline:
            node.step(0.02)
            if select.select([stdin], [], [], 0)[0]:
                return sys.stdin.readline()
        raise SystemExit("no line on stdin before the deadline")

    sets: list[tuple[int, int]] = []

    def write(first: int, last: int) -> None:
        for i in paced(first, last, args.interval_ms / 1000, deadline, node.step):
            t0 = time.monotonic_ns()
            sets.append((node.write(value_for(i)), t0))

    expect_line("START", next_line())
    write(1, args.warmup)
    expect_line("GO", next_line())
    cpu_go, woken, kernel = cpu_s(), wakeups(), sys_cpu_s()
    write(args.warmup + 1, args.final)
    say("RESULT", json.dumps({"sets": sets, "cpu_s": cpu_s() - cpu_go,
                              "sys_cpu_s": sys_cpu_s() - kernel,
                              "wakeups": _since(woken)}))  # fmt: skip
    next_line()  # STOP, or EOF: keep forwarding until then
    node.close()


def redis_writer(args: argparse.Namespace) -> None:
    import redis

    client = redis.Redis(host="127.0.0.1", port=int(args.contact))
    client.ping()
    say("READY", args.contact)
    deadline = time.monotonic() + args.deadline
    sets, receivers = [], []

    def write(first: int, last: int) -> None:
        for i in paced(first, last, args.interval_ms / 1000, deadline):
            t0 = time.monotonic_ns()
            message = json.dumps({"version": i, "values": value_for(i)})
            receivers.append(client.publish(REDIS_CHANNEL, message))
            sets.append((i, t0))

    expect_line("START", sys.stdin.readline())
    write(1, args.warmup)
    expect_line("GO", sys.stdin.readline())
    cpu_go, woken, kernel = cpu_s(), wakeups(), sys_cpu_s()
    write(args.warmup + 1, args.final)
    say("RESULT", json.dumps({"sets": sets, "receivers_min": min(receivers, default=0),
                              "cpu_s": cpu_s() - cpu_go, "sys_cpu_s": sys_cpu_s() - kernel,
                              "wakeups": _since(woken)}))  # fmt: skip
    sys.stdin.readline()


def redis_reader(args: argparse.Namespace) -> None:
    import redis

    client = redis.Redis(host="127.0.0.1", port=int(args.contact))
    sub = client.pubsub()
    sub.subscribe(REDIS_CHANNEL)
    deadline = time.monotonic() + args.deadline
    while (m := sub.get_message(timeout=1.0)) is None or m["type"] != "subscribe":
        if time.monotonic() > deadline:
            raise SystemExit("no subscribe confirmation")
    say("READY", args.contact)
    cpu_warm, woken, kernel = cpu_s(), wakeups(), sys_cpu_s()
    if args.warmup == 0:
        say("WARM")
    seen: list[tuple[int, int]] = []
    version = 0
    while version < args.final and time.monotonic() < deadline:
        m = sub.get_message(timeout=1.0)
        if m is not None and m["type"] == "message":
            t = time.monotonic_ns()
            got = json.loads(m["data"])["version"]
            if got > version:
                seen.append((got, t))
                if version < args.warmup <= got:
                    say("WARM")
                    cpu_warm, woken, kernel = cpu_s(), wakeups(), sys_cpu_s()
                version = got
    say("RESULT", json.dumps({"seen": seen, "cpu_s": cpu_s() - cpu_warm,
                              "sys_cpu_s": sys_cpu_s() - kernel,
                              "wakeups": _since(woken)}))  # fmt: skip
    sys.stdin.readline()


# -- Spark ------------------------------------------------------------------------------------


def spark_session(executors: int) -> Any:
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    return (
        SparkSession.builder.master(f"local-cluster[{executors},1,1024]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.executorEnv.PYTHONPATH", str(ROOT))
        .config("spark.locality.wait", "0")  # one task per executor, no waiting for one
        .getOrCreate()
    )


def wait_until(condition: Any, deadline: float, what: str) -> None:
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)  # other processes' state: there is no event to await


def run_spark_episub(args: argparse.Namespace, logdir: str) -> dict[str, Any]:
    from pyspark.sql.functions import col, udf

    import spark_connector
    from spark_connector.config import cluster_config
    from spark_connector.deployment import driver_client

    final, limit, n, warmup = args.warmup + args.updates, args.deadline, args.nodes, args.warmup
    deadline = time.monotonic() + limit
    markers = Path(logdir)
    spark = spark_session(n)
    try:
        deployment = spark_connector.register(spark, key=KEY)
        cfg = cluster_config(spark, CONFIG_NAME)
        sc = spark.sparkContext
        wait_until(lambda: sc._jsc.sc().getExecutorMemoryStatus().size() == n + 1, deadline,
                   "the executors")  # fmt: skip

        @udf("string")
        def follow(_: int) -> str:
            from spark_connector import config
            from spark_connector.deployment import executor_owner

            version = config.version(CONFIG_NAME)
            (markers / f"ready-{executor_owner()}").touch()
            seen = []
            stop = time.monotonic() + limit
            while version < final and time.monotonic() < stop:
                if config.wait_for(version + 1, timeout=1.0, name=CONFIG_NAME):
                    seen.append((version + 1, time.monotonic_ns()))
                    now = config.version(CONFIG_NAME)  # may be later still
                    if now > version + 1:
                        seen.append((now, time.monotonic_ns()))
                    if version < warmup <= now:
                        (markers / f"warm-{executor_owner()}").touch()
                    version = now
            return json.dumps({"owner": executor_owner(), "seen": seen})

        out: dict[str, Any] = {}

        def write() -> None:
            try:
                with driver_client(deployment) as client:
                    topic = f"_episub.config.{CONFIG_NAME}"
                    wait_until(lambda: len(client.inspect().topics.get(topic, [])) >= min(n, 2)
                               and len(list(markers.glob("ready-*"))) == n, deadline,
                               "every executor's UDF")  # fmt: skip
                time.sleep(args.settle)
                out["loadavg_before"] = os.getloadavg()
                sets = out["sets"] = []
                for i in paced(1, warmup, args.interval_ms / 1000, deadline):
                    t0 = time.monotonic_ns()
                    sets.append((cfg.set("n", i), t0))
                wait_until(lambda: len(list(markers.glob("warm-*"))) == n, deadline,
                           "every executor to see the warm-up writes")  # fmt: skip
                for i in paced(warmup + 1, final, args.interval_ms / 1000, deadline):
                    t0 = time.monotonic_ns()
                    sets.append((cfg.set("n", i), t0))
            except BaseException as exc:
                out["error"] = exc

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        rows = spark.range(0, n, 1, n).select(follow(col("id")).alias("r")).collect()
        writer.join(timeout=max(0.0, deadline - time.monotonic()))
        if "error" in out:
            raise SystemExit(f"the driver's writer failed: {out['error']!r}")
        followed = [json.loads(r.r) for r in rows]
        owners = {f["owner"] for f in followed}
        if len(owners) != n:
            raise SystemExit(f"the UDF ran on {len(owners)} executors, not {n}")
        return {
            "written": {"sets": out["sets"]},
            "readers": followed,
            "loadavg": [out["loadavg_before"], os.getloadavg()],
        }
    finally:
        spark.stop()


def run_spark_broadcast(args: argparse.Namespace, logdir: str) -> dict[str, Any]:
    final, n = args.warmup + args.updates, args.nodes
    deadline = time.monotonic() + args.deadline
    spark = spark_session(n)
    try:
        sc = spark.sparkContext
        wait_until(lambda: sc._jsc.sc().getExecutorMemoryStatus().size() == n + 1, deadline,
                   "the executors")  # fmt: skip
        time.sleep(args.settle)
        load_before = os.getloadavg()
        sets, ends, in_task, on_all = [], [], [], []
        previous = None
        for i in paced(1, final, args.interval_ms / 1000, deadline):
            t0 = time.monotonic_ns()
            bv = sc.broadcast(value_for(i))

            def read(_: Any, bv: Any = bv) -> Any:
                from spark_connector.deployment import executor_owner

                n_read = bv.value["n"]
                yield (executor_owner(), n_read, time.monotonic_ns())

            rows = sc.parallelize(range(n), n).mapPartitions(read).collect()
            t1 = time.monotonic_ns()
            if previous is not None:
                previous.unpersist()
            previous = bv
            if any(r[1] != i for r in rows):
                raise SystemExit(f"update {i}: a task read {rows}")
            sets.append((i, t0))
            ends.append(t1)
            in_task.append(max(r[2] for r in rows))
            on_all.append(len({r[0] for r in rows}) == n)
        return {
            "written": {"sets": sets},
            "job_end_ns": ends,
            "in_task_ns": in_task,
            "on_every_executor": on_all,
            "loadavg": [load_before, os.getloadavg()],
        }
    finally:
        spark.stop()


# -- report ------------------------------------------------------------------------------------


def report(args: argparse.Namespace, raw: dict[str, Any], command: str) -> dict[str, Any]:
    sets = [tuple(s) for s in raw["written"]["sets"]]
    final = args.warmup + args.updates
    counted = sets[args.warmup :]
    result: dict[str, Any] = {
        "system": args.system,
        "nodes": args.nodes,
        "updates": args.updates,
        "warmup": args.warmup,
        "interval_ms": args.interval_ms,
        "command": command,
        "written": len(sets),
    }
    if args.system == "spark-broadcast":
        ends = raw["job_end_ns"][args.warmup :]
        result["latency"] = summary([t1 - t0 for (_, t0), t1 in zip(counted, ends, strict=True)])
        in_task = raw["in_task_ns"][args.warmup :]
        result["in_task"] = summary([t - t0 for (_, t0), t in zip(counted, in_task, strict=True)])
        result["jobs_on_every_executor"] = sum(raw["on_every_executor"][args.warmup :])
        result["delivered"] = len(sets) == final and all(raw["on_every_executor"])
        per_update = [t1 - t0 for (_, t0), t1 in zip(counted, ends, strict=True)]
    else:
        seen = [[tuple(s) for s in r["seen"]] for r in raw["readers"]]
        per_update = update_latencies(counted, seen)
        result["latency"] = summary(per_update)
        if args.warmup:  # the first write after the readers joined: a cold start
            [first] = update_latencies(sets[:1], seen)
            result["first_write_ms"] = None if first is None else round(first / MS, 3)
        last = [s[-1][0] if s else 0 for s in seen]
        result["readers_with_final"] = sum(v >= final for v in last)
        result["delivered"] = len(sets) == final and all(v >= final for v in last)
        for field in ("counters", "stats"):
            if field in raw["readers"][0]:
                totals: dict[str, int] = {}
                for r in raw["readers"]:
                    for k, v in r[field].items():
                        totals[k] = totals.get(k, 0) + v
                result[f"reader_{field}"] = totals
    if "cpu_s" in raw["written"]:
        readers_cpu = sum(r["cpu_s"] for r in raw["readers"])
        result["cpu_s"] = {
            "readers": round(readers_cpu, 3),
            "writer": round(raw["written"]["cpu_s"], 3),
            **({"redis_server": round(raw["redis_server_cpu_s"], 3)}
               if "redis_server_cpu_s" in raw else {}),
        }  # fmt: skip
        result["cpu_ms_per_update"] = round(
            1000 * sum(result["cpu_s"].values()) / max(1, len(sets)), 3
        )
        if "sys_cpu_s" in raw["written"]:  # the kernel's part (system calls)
            result["sys_cpu_s"] = {
                "readers": round(sum(r["sys_cpu_s"] for r in raw["readers"]), 3),
                "writer": round(raw["written"]["sys_cpu_s"], 3),
            }
    woken = [r.get("wakeups") for r in raw["readers"]]
    if None not in woken and sets:
        # Times a reader process blocked and was woken (voluntary context switches), per
        # reader per update: Redis's readers wake once per update.
        result["reader_wakeups_per_update"] = round(sum(woken) / len(woken) / len(sets), 2)  # type: ignore[arg-type]
    collected = [r["gc"] for r in raw["readers"] if "gc" in r]
    if collected and sets:
        # The collector's passes in the readers while writes flowed: each is a pause.
        result["reader_gc"] = {
            "passes_per_reader_per_update": round(
                sum(c["passes"] for c in collected) / len(collected) / len(sets), 3
            ),
            "ms_per_reader_per_update": round(
                sum(c["total_ms"] for c in collected) / len(collected) / len(sets), 4
            ),
            "longest_ms": max(c["longest_ms"] for c in collected),
            "passes_over_1ms": sum(c["over_1ms"] for c in collected),
            "passes_by_generation": [sum(c["by_generation"][g] for c in collected)
                                     for g in range(3)],
        }  # fmt: skip
    if "receivers_min" in raw["written"]:
        result["redis_receivers_min"] = raw["written"]["receivers_min"]
    result["per_update_ms"] = [None if v is None else round(v / MS, 3) for v in per_update]
    result["machine"] = {
        "cpus": os.cpu_count(),
        "loadavg_before_after": raw["loadavg"],
        "python": platform.python_version(),
        "platform": platform.platform(),
        **({"redis_server": raw["redis_version"]} if "redis_version" in raw else {}),
    }
    return result


def print_report(result: dict[str, Any]) -> None:
    lat = result["latency"]
    print(f"{result['system']} nodes={result['nodes']} updates={result['updates']} "
          f"interval={result['interval_ms']} ms: p50 {lat.get('p50_ms')} ms, "
          f"p99 {lat.get('p99_ms')} ms, max {lat.get('max_ms')} ms; seen everywhere "
          f"{lat['seen_everywhere']}/{lat['count']}; delivered {result['delivered']}")  # fmt: skip
    if "cpu_s" in result:
        print(f"  CPU s (data phase) {result['cpu_s']}, {result['cpu_ms_per_update']} ms/update")
    if "sys_cpu_s" in result:
        print(f"  of which in the kernel (system calls) {result['sys_cpu_s']}")
    if "reader_wakeups_per_update" in result:
        print(f"  wakeups per reader per update {result['reader_wakeups_per_update']}")
    if "reader_gc" in result:
        print(f"  garbage collector in the readers {result['reader_gc']}")
    if "in_task" in result:
        t = result["in_task"]
        on_all = f"{result['jobs_on_every_executor']}/{result['updates']}"
        print(f"  read in every task: p50 {t.get('p50_ms')} ms, p99 {t.get('p99_ms')} ms; "
              f"jobs on every executor {on_all}")  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--system", choices=SYSTEMS)
    p.add_argument("--nodes", type=int, default=8, help="reader processes, or Spark executors")
    p.add_argument("--updates", type=int, default=200, help="updates measured")
    p.add_argument("--warmup", type=int, default=5, help="updates before them, not measured")
    p.add_argument("--interval-ms", type=float, default=20.0, help="between two updates")
    p.add_argument("--settle", type=float, default=10.0, help="s between ready and the writes")
    p.add_argument("--deadline", type=float, default=300.0, help="bound on every wait, s")
    p.add_argument("--out", default=None, help="also write the result JSON here")
    p.add_argument(
        "--raw-out",
        default=None,
        help="also write every process's raw records here (per-reader times, counters)",
    )
    # A child's own options (the harness passes them).
    p.add_argument("--role", choices=ROLES, help=argparse.SUPPRESS)
    p.add_argument("--contact", help=argparse.SUPPRESS)
    p.add_argument("--final", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.role is None and args.system is None:
        p.error("--system is required")
    if args.nodes < 1 or args.updates < 1 or args.warmup < 0 or args.interval_ms < 0:
        p.error("--nodes and --updates must be positive, --warmup and --interval-ms not negative")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.role in ("episub-writer", "episub-reader"):
        import trio

        trio.run(episub_node, args, args.role == "episub-writer")
        return
    if args.role == "episub-blocking-writer":
        return blocking_writer(args)
    if args.role in ("episub-blocking-reader", "episub-thread-reader"):
        return blocking_reader(args, threaded=args.role == "episub-thread-reader")
    if args.role == "redis-writer":
        return redis_writer(args)
    if args.role == "redis-reader":
        return redis_reader(args)
    command = shlex.join([Path(sys.executable).as_posix(), "benchmarks/config_broadcast.py",
                          *(sys.argv[1:] if argv is None else argv)])  # fmt: skip
    run = {"spark-episub": run_spark_episub, "spark-broadcast": run_spark_broadcast}.get(
        args.system, run_processes
    )
    with tempfile.TemporaryDirectory(prefix="config_broadcast.") as logdir:
        raw = run(args, logdir)
    result = report(args, raw, command)
    if args.raw_out:
        Path(args.raw_out).write_text(json.dumps(raw) + "\n")
    print_report(result)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

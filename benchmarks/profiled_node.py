"""`episub node` under cProfile for a window the caller chooses, by signal: SIGUSR1 starts
the profiler, SIGUSR2 stops it and writes the stats to PROFILE_FILE.

    python benchmarks/profiled_node.py PROFILE_FILE node --listen ... --topic ...

`idle_cpu.py --profile DIR` runs every node so, and signals them around its window: the
profile is of the idle upkeep only, not of start-up and joining. cProfile costs the node
several times its own CPU: the window's CPU figures of a profiled run are not figures.
"""

from __future__ import annotations

import cProfile
import gc
import json
import signal
import sys
import time
from pathlib import Path
from types import FrameType


def main() -> None:
    out, args = sys.argv[1], sys.argv[2:]
    # CPU time, not wall time: an idle node on a loaded machine is preempted inside its
    # system calls (a write to loopback wakes the reader), which wall time would charge it.
    profiler = cProfile.Profile(time.process_time)

    # Garbage collection runs inside whatever allocated last, so cProfile charges it to
    # that function: its own count and CPU are kept apart (gc.callbacks), in OUT.gc.json.
    collections = {"collections": [0, 0, 0], "cpu_s": 0.0}
    gc_started = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_started[0] = time.process_time()
        else:
            collections["collections"][info["generation"]] += 1  # type: ignore[index]
            collections["cpu_s"] += time.process_time() - gc_started[0]  # type: ignore[operator]

    def start(signum: int, frame: FrameType | None) -> None:
        gc.callbacks.append(on_gc)
        profiler.enable()

    def stop(signum: int, frame: FrameType | None) -> None:
        profiler.disable()
        gc.callbacks.remove(on_gc)
        Path(out + ".gc.json").write_text(json.dumps(collections))
        profiler.dump_stats(out)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    sys.argv = ["episub", *args]
    from episub.cli import main as episub_main

    sys.exit(episub_main())


if __name__ == "__main__":
    main()

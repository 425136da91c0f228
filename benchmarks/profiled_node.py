"""`episub node` under cProfile for a window the caller chooses, by signal: SIGUSR1 starts
the profiler, SIGUSR2 stops it and writes the stats to PROFILE_FILE.

    python benchmarks/profiled_node.py PROFILE_FILE node --listen ... --topic ...

`idle_cpu.py --profile DIR` runs every node so, and signals them around its window: the
profile is of the idle upkeep only, not of start-up and joining. cProfile costs the node
several times its own CPU: the window's CPU figures of a profiled run are not figures.
"""

from __future__ import annotations

import cProfile
import signal
import sys
from types import FrameType


def main() -> None:
    out, args = sys.argv[1], sys.argv[2:]
    profiler = cProfile.Profile()

    def start(signum: int, frame: FrameType | None) -> None:
        profiler.enable()

    def stop(signum: int, frame: FrameType | None) -> None:
        profiler.disable()
        profiler.dump_stats(out)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    sys.argv = ["episub", *args]
    from episub.cli import main as episub_main

    sys.exit(episub_main())


if __name__ == "__main__":
    main()

"""The plugin's own suite: inner sessions forked from the suite's zygote against subprocesses.

Runs in a plain Python process; every run is a whole ``pytest`` session over the given test files
of the plugin's suite (``tests/e2e/...``), in this checkout, with ``DISTRANK_TEST_ZYGOTE`` unset
(each inner session forked from a warm process that imported torch once, ``tests/zygote.py``) and
``=off`` (each a ``python -m pytest`` subprocess, as before), in turn (on off, off on, ...),
``--rounds`` times. It prints each run and the medians of wall and whole-tree CPU
(``RUSAGE_CHILDREN``), and their ratios. Bytecode is written in both (as ``.ci/run`` does).

    python bench/bench_zygote.py tests/e2e/test_outcomes.py tests/e2e/test_folders.py
    python bench/bench_zygote.py --rounds 3 tests/e2e/test_ecosystem.py
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = {"on": "", "off": "off"}


def cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def run(mode: str, files: list[str]) -> tuple[float, float]:
    """One whole session of ``files`` in ``mode``: (wall, CPU) seconds."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["DISTRANK_TEST_ZYGOTE"] = MODES[mode]
    started, used = time.monotonic(), cpu()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            *files,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall, spent = time.monotonic() - started, cpu() - used
    if done.returncode != 0:
        sys.exit(f"{mode}: pytest exited {done.returncode}:\n{done.stdout[-3000:]}")
    return wall, spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    for round_ in range(args.rounds):
        for mode in MODES if round_ % 2 == 0 else reversed(MODES):
            wall, spent = run(mode, args.files)
            results[mode].append((wall, spent))
            load = os.getloadavg()[0]
            said = f"round {round_ + 1} {mode:>3}: {wall:7.1f} s wall {spent:7.1f} s CPU"
            print(f"{said} (load {load:.1f})")
    medians = {
        mode: (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
        for mode, runs in results.items()
    }
    for mode, (wall, spent) in medians.items():
        print(f"median {mode:>3}: {wall:7.1f} s wall {spent:7.1f} s CPU")
    (on_wall, on_cpu), (off_wall, off_cpu) = medians["on"], medians["off"]
    print(f"on/off: wall {on_wall / off_wall:.2f}x, CPU {on_cpu / off_cpu:.2f}x")


if __name__ == "__main__":
    main()

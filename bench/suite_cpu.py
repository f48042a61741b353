"""Where the plugin's own suite spends its CPU: the files (and tests) that cost the most.

Runs in a plain Python process. It runs the README's test command (or the arguments given after
``--``) with ``DISTRANK_TEST_CPU_LOG`` set, so that each test of the suite appends its CPU
seconds (its xdist worker's, and those of the inner sessions it ran, forked or not: see
``tests/conftest.py``), then prints the files by CPU, the top tests, and the total beside the
whole run's CPU (what the workers spent outside tests, and xdist's controller, is the
difference). Issue #40's target for the whole command: at most 8 minutes of CPU.

    python bench/suite_cpu.py                 # pytest -n 3 --dist loadfile
    python bench/suite_cpu.py --top 30 -- tests/unit -n 2
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import subprocess
import sys
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=15, help="tests listed (default 15)")
    parser.add_argument("--log", help="keep the per-test log here (default: a temporary file)")
    parser.add_argument("args", nargs="*", help="pytest's (default: -n 3 --dist loadfile)")
    options = parser.parse_args()
    args = options.args or ["-n", "3", "--dist", "loadfile"]
    log = options.log or tempfile.mkstemp(prefix="suite-cpu-", suffix=".tsv")[1]
    open(log, "w").close()
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", *args],
                          env={**os.environ, "DISTRANK_TEST_CPU_LOG": log})  # fmt: skip
    wall = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    tests: dict[str, float] = {}
    with open(log) as lines:
        for line in lines:
            node, cpu = line.rstrip("\n").rsplit("\t", 1)
            tests[node] = tests.get(node, 0.0) + float(cpu)
    files: collections.Counter[str] = collections.Counter()
    for node, cpu in tests.items():
        files[node.split("::", 1)[0]] += cpu
    total = sum(tests.values())
    print(f"\n{'CPU s':>8}  {'share':>6}  file ({len(files)} files, {len(tests)} tests)")
    for file, cpu in files.most_common():
        print(f"{cpu:8.1f}  {cpu / total:6.1%}  {file}")
    print(f"\n{'CPU s':>8}  test (top {options.top})")
    for node, cpu in sorted(tests.items(), key=lambda kv: -kv[1])[: options.top]:
        print(f"{cpu:8.2f}  {node}")
    whole = usage.ru_utime + usage.ru_stime
    print(f"\ntests {total:.1f} s of CPU; the whole run {whole:.1f} s of CPU "
          f"({usage.ru_utime:.1f} user + {usage.ru_stime:.1f} sys), {wall:.1f} s wall; "
          f"exit code {done.returncode}; log {log}")  # fmt: skip
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()

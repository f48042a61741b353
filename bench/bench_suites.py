"""Existing test files: their own harness against pytest-distrank's warm pools, test by test.

Runs in a plain Python process; every measurement is a separate pytest session in a subprocess,
started in a fresh temporary folder. For each test file the script runs

  own harness   python -m pytest -p no:distrank FILE   (each test spawns its processes)
  distrank      python -m pytest -p distrank FILE      (the same file, unmodified, on warm pools)

alternately, ``--repeat`` times each, with ``--junitxml``, and compares the outcome of every
test between the two (passed, failed, error, skipped, xfailed). It prints per file the median
wall times, the ratio, the outcome counts and each test whose outcome differs; then the summary:
files with identical outcomes out of the files tried, tests with identical outcomes out of the
tests, and the total times (sums of the medians) over all files and over the identical ones.
It exits non-zero when any outcome differs. A run that outlives ``--timeout`` is killed with its
whole process group (the harness's children too) and its tests count as "timed out".

The files come from a manifest (``bench/suites.txt``: one file a line, relative to ``--root``,
with optional ``NAME=VALUE`` environment variables and an optional ``-k`` selection), or from
the command line. The files stay where they are; nothing is copied into the project.

Usage (from the repository root, with the project installed in the interpreter that runs it):

    python bench/bench_suites.py --root path/to/suites                 # every file of the manifest
    python bench/bench_suites.py --root path/to/suites test_dist2 rpc/ # manifest lines naming these
    python bench/bench_suites.py path/to/test_a.py path/to/test_b.py   # files without a manifest
    python bench/bench_suites.py --root path/to/suites --markdown table.md --keep runs/ --repeat 3
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
RUNS = {"own harness": ["-p", "no:distrank"], "distrank": ["-p", "distrank"]}
MANIFEST = Path(__file__).with_name("suites.txt")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
TIMED_OUT = "timed out"


@dataclass
class Entry:
    """One manifest line: a file, the environment of both runs, a -k selection."""

    path: str
    env: dict[str, str] = field(default_factory=dict)
    select: str | None = None

    @property
    def label(self) -> str:
        return self.path + (" (-k selection)" if self.select else "")


@dataclass
class Run:
    """One pytest session: its wall time, each test's outcome, and its summary line."""

    wall: float
    outcomes: dict[str, str]
    summary: str


def read_manifest(path: Path) -> list[Entry]:
    """The manifest's entries, in order."""
    entries = []
    for line in path.read_text().splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        entry = Entry(words[0])
        rest = words[1:]
        while rest and ENV_NAME.match(rest[0]):
            name, _, value = rest.pop(0).partition("=")
            entry.env[name] = value
        if rest[:1] == ["-k"] and len(rest) == 2:
            entry.select = rest[1]
        elif rest:
            sys.exit(f"{path}: cannot read {line!r} (FILE [NAME=VALUE ...] [-k EXPRESSION])")
        entries.append(entry)
    return entries


def junit_outcomes(xml_file: Path) -> dict[str, str]:
    """Each test's outcome in a junit file, by ``classname::name``."""
    outcomes = {}
    for case in ET.parse(xml_file).getroot().iter("testcase"):
        key = f"{case.get('classname')}::{case.get('name')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed" if child.tag == "failure" else "error"
            elif child.tag == "skipped":
                xfail = child.get("type") == "pytest.xfail"
                outcome = "xfailed" if xfail else "skipped"
        outcomes[key] = outcome
    return outcomes


def run(args: list[str], test_file: Path, entry: Entry, timeout: float, keep: Path | None) -> Run:
    """One pytest session in a fresh folder, bounded by ``timeout`` seconds; with ``keep``, its
    output and junit file are copied to that folder."""
    with tempfile.TemporaryDirectory(prefix="bench-suites-") as cwd:
        (Path(cwd) / "barrier").mkdir()
        env = dict(os.environ)
        env.update({name: value.replace("{tmp}", cwd) for name, value in entry.env.items()})
        select = ["-k", entry.select] if entry.select else []
        junit = Path(cwd) / "junit.xml"
        command = [*PYTEST, *args, f"--junitxml={junit}", *select, str(test_file)]
        start = time.perf_counter()
        # A session of its own: on a timeout the harness's children go with it.
        process = subprocess.Popen(
            command, cwd=cwd, env=env, text=True, start_new_session=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            return Run(time.perf_counter() - start, {}, f"{TIMED_OUT} after {timeout:.0f} s")
        wall = time.perf_counter() - start
        if keep is not None:
            harness = "own" if "no:distrank" in args else "distrank"
            stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", entry.label) + f".{harness}"
            (keep / f"{stem}.txt").write_text(stdout + stderr)
            if junit.exists():
                shutil.copyfile(junit, keep / f"{stem}.xml")
        if process.returncode not in (0, 1) or not junit.exists():
            sys.exit(
                f"pytest {' '.join(args)} {test_file} ended with {process.returncode}:\n"
                f"{stdout[-3000:]}\n{stderr[-3000:]}"
            )
        lines = [line for line in stdout.splitlines() if line.strip()]
        return Run(wall, junit_outcomes(junit), lines[-1] if lines else "")


def counts(outcomes: dict[str, str]) -> str:
    """``3 passed, 1 skipped``."""
    tally: dict[str, int] = {}
    for outcome in outcomes.values():
        tally[outcome] = tally.get(outcome, 0) + 1
    return ", ".join(f"{n} {kind}" for kind, n in sorted(tally.items())) or "no tests"


@dataclass
class Row:
    """One file's result: median walls and the outcomes of both harnesses."""

    entry: Entry
    walls: dict[str, float]
    outcomes: dict[str, dict[str, str]]

    def differences(self) -> list[str]:
        """``test: own harness OUTCOME, distrank OUTCOME`` for each test that differs."""
        own, ours = self.outcomes["own harness"], self.outcomes["distrank"]
        return [
            f"{test}: own harness {own.get(test, TIMED_OUT if not own else 'absent')}, "
            f"distrank {ours.get(test, TIMED_OUT if not ours else 'absent')}"
            for test in sorted(own.keys() | ours.keys())
            if own.get(test) != ours.get(test)
        ]

    @property
    def tests(self) -> int:
        return len(self.outcomes["own harness"].keys() | self.outcomes["distrank"].keys())

    @property
    def ratio(self) -> float:
        return self.walls["own harness"] / self.walls["distrank"]


def measure(entry: Entry, test_file: Path, repeat: int, timeout: float, keep: Path | None) -> Row:
    """Both harnesses on one file, ``repeat`` times each, alternately."""
    walls: dict[str, list[float]] = {name: [] for name in RUNS}
    outcomes: dict[str, dict[str, str]] = {}
    for _ in range(repeat):
        for name, args in RUNS.items():
            done = run(args, test_file, entry, timeout, keep)
            walls[name].append(done.wall)
            outcomes[name] = done.outcomes
            print(f"  {entry.label} [{name}] {done.summary} ({done.wall:.1f} s)", flush=True)
    return Row(entry, {name: statistics.median(w) for name, w in walls.items()}, outcomes)


def markdown(rows: list[Row], summary: list[str]) -> str:
    """The table of docs/existing-suites.md."""
    lines = [
        "| file | own harness | pytest-distrank | ratio | outcomes, own harness | "
        "outcomes, pytest-distrank | tests the same |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        same = row.tests - len(row.differences())
        lines.append(
            f"| `{row.entry.label}` | {row.walls['own harness']:.1f} s | "
            f"{row.walls['distrank']:.1f} s | {row.ratio:.1f}x | "
            f"{counts(row.outcomes['own harness'])} | {counts(row.outcomes['distrank'])} | "
            f"{same} of {row.tests} |"
        )
    return "\n".join([*lines, "", *summary, ""])


def summarize(rows: list[Row]) -> list[str]:
    """Files and tests with identical outcomes, and the total times."""
    same_rows = [row for row in rows if not row.differences()]
    tests = sum(row.tests for row in rows)
    same_tests = sum(row.tests - len(row.differences()) for row in rows)

    def total(subset: list[Row]) -> str:
        own = sum(row.walls["own harness"] for row in subset)
        ours = sum(row.walls["distrank"] for row in subset)
        ratio = own / ours if ours else 0.0
        return f"own harness {own:.1f} s, pytest-distrank {ours:.1f} s ({ratio:.1f}x)"

    return [
        f"files with identical outcomes: {len(same_rows)} of {len(rows)}; "
        f"tests with identical outcomes: {same_tests} of {tests}",
        f"all files: {total(rows)}",
        f"files with identical outcomes: {total(same_rows)}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "files", nargs="*",
        help="with --root: run the manifest lines whose path contains one of these; "
        "without: these test files",
    )  # fmt: skip
    parser.add_argument("--root", type=Path, help="the folder the manifest's paths start from")
    parser.add_argument("--manifest", type=Path, default=MANIFEST)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per pytest run")
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    parser.add_argument("--keep", type=Path, help="keep each run's output and junit file here")
    opts = parser.parse_args()
    if opts.root is not None:
        chosen = [
            (entry, opts.root / entry.path)
            for entry in read_manifest(opts.manifest)
            if not opts.files or any(part in entry.path for part in opts.files)
        ]
    elif opts.files:
        chosen = [(Entry(name), Path(name)) for name in opts.files]
    else:
        parser.error("give --root (and the manifest) or test files")
    if opts.keep is not None:
        opts.keep.mkdir(parents=True, exist_ok=True)
    rows = []
    for entry, test_file in chosen:
        rows.append(measure(entry, test_file.resolve(), opts.repeat, opts.timeout, opts.keep))
    print()
    print(f"{'file':60} {'own harness':>12} {'distrank':>9} {'ratio':>7}  outcomes")
    for row in rows:
        print(
            f"{row.entry.label:60} {row.walls['own harness']:10.1f} s "
            f"{row.walls['distrank']:7.1f} s {row.ratio:6.1f}x  {counts(row.outcomes['distrank'])}"
        )
        for difference in row.differences():
            print(f"    differs: {difference}")
    summary = summarize(rows)
    print(*summary, sep="\n")
    print(f"(medians of {opts.repeat} run(s) each; python {sys.version.split()[0]})")
    if opts.markdown:
        opts.markdown.write_text(markdown(rows, summary))
    if any(row.differences() for row in rows):
        sys.exit("the outcomes differ between the two harnesses")


if __name__ == "__main__":
    main()

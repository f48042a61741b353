"""Fixtures at another world size, the controller's side: run each producer once, before the
first test that requests it, and hand its folder (or its failure) to every test that does.

Runs in the controller (pool mode). The decorator, the producer items and the fixtures are in
:mod:`pytest_distrank.planning.crossize`. A producer runs as its own pytest item on a pool of
its own world size (an isolated key: started for it, stopped after it), through the controller's
ordinary ``_execute`` (deadline, failure grace, merge), whose reports are judged here and never
logged: a passing producer adds no test to the counts (it is no test: its line in the
``distrank`` summary says that it ran, for how long and where its folder is); a failing one
fails every test that requests it, with its whole report.

Under pytest-xdist a producer runs once per session, not once per worker: its folder is in the
run's shared basetemp (the workers' basetemps' parent), and the first worker that needs it runs
it behind a file lock and writes its outcome beside the folder, with xdist's run id; the other
workers wait on the lock and read that outcome.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pytest import TestReport

from .. import _compat
from ..outcome.records import RunTest
from ..outcome.reports import error_reports, skipped_reports
from ..planning.capabilities import gpu_plan, too_many_ranks
from ..planning.crossize import RUNNER, Producer, producer_item, producers_of
from ..planning.gpuplan import GpuPolicy
from ..planning.spec import DistSpec
from ..settings import Value, item_timeout
from .pools.poolkey import PoolKey
from .pools.poolset import START_TIMEOUT

#: Runs a producer item on a pool of ``key`` with its deadline: the controller's ``_execute``.
Execute = Callable[[pytest.Function, DistSpec, PoolKey, Value[float]], list[TestReport]]
#: Producers' pools are isolated keys below this (fresh-rank tests use -1, -2, ...).
ISOLATED_BASE = -(10**9)
#: The report section that says how to rerun a test: a producer is rerun through its users.
RERUN_SECTION = "distrank: rerun just this test"


@dataclasses.dataclass
class Outcome:
    """How a producer's one run ended: ``passed``, ``failed`` or ``skipped``, and why."""

    kind: str
    folder: str
    text: str = ""
    seconds: float = 0.0
    #: Where it ran: "" (here), or the xdist worker that ran it.
    worker: str = ""


class CrossSize:
    """The controller's producers: their outcomes, and the folders each test is sent with."""

    def __init__(
        self,
        config: pytest.Config,
        session_timeout: Value[float],
        default_backend: str,
        gpu_policy: GpuPolicy,
        execute: Execute,
        notes: list[str],
    ) -> None:
        self.config = config
        self.session_timeout = session_timeout
        self.default_backend = default_backend
        self.gpu_policy = gpu_policy
        self.execute = execute
        self.notes = notes
        self.outcomes: dict[Producer, Outcome] = {}
        #: Producers running now (a producer that requests another waits for it): a cycle.
        self.running: list[Producer] = []
        #: Per test node id: the folders of the producers it requests (RunTest.fixtures).
        self.folders: dict[str, tuple[tuple[str, str], ...]] = {}
        #: Per producer item's node id: its folder (its RunTest's shared_dir).
        self.outputs: dict[str, str] = {}
        config.stash[RUNNER] = self

    # -- what the controller asks --------------------------------------------------------------

    def prepare(self, item: pytest.Item) -> list[TestReport] | None:
        """Before a distributed test runs: its producers have run, or the reports that say why
        it cannot (an error naming the producer that failed, or a skip)."""
        producers = producers_of(item)
        if not producers:
            return None
        pairs = []
        for producer in producers:
            outcome = self.ensure(producer, item)
            if outcome.kind == "failed":
                return error_reports(item.nodeid, item.location, f"{item.nodeid}: {outcome.text}")
            if outcome.kind == "skipped":
                return skipped_reports(item.nodeid, item.location, str(item.path), outcome.text)
            pairs.append((producer.key, outcome.folder))
        self.folders[item.nodeid] = tuple(pairs)
        return None

    def amend(self, item: pytest.Item, test: RunTest) -> RunTest:
        """The message that runs ``item``, with its producers' folders (a producer: its own)."""
        output = self.outputs.get(item.nodeid)
        if output is not None:
            test = dataclasses.replace(test, shared_dir=output)
        pairs = self.folders.get(item.nodeid)
        return dataclasses.replace(test, fixtures=pairs) if pairs else test

    def value(self, producer: Producer, item: pytest.Item) -> Path:
        """An ordinary test's fixture value (planning.crossize.Runner)."""
        outcome = self.ensure(producer, item)
        if outcome.kind == "failed":
            pytest.fail(f"{item.nodeid}: {outcome.text}", pytrace=False)
        if outcome.kind == "skipped":
            pytest.skip(outcome.text)
        return Path(outcome.folder)

    # -- running a producer once ---------------------------------------------------------------

    def ensure(self, producer: Producer, item: pytest.Item) -> Outcome:
        """The producer's outcome: run it now (once) if it has not run."""
        known = self.outcomes.get(producer)
        if known is not None:
            return known
        if producer in self.running:
            chain = " -> ".join(p.name for p in [*self.running, producer])
            return Outcome("failed", "", f"{producer.describe()} requests itself: {chain}.")
        self.running.append(producer)
        try:
            outcome = self._first_run(producer, item)
        finally:
            self.running.remove(producer)
        self.outcomes[producer] = outcome
        return outcome

    def _first_run(self, producer: Producer, item: pytest.Item) -> Outcome:
        problem = producer.problem()
        if problem is not None:
            return Outcome("failed", "", problem)
        size = producer.world_size
        too_many = too_many_ranks(size)
        if too_many is not None:
            return Outcome("failed", "", f"{producer.describe()} cannot run: {too_many}")
        backend = str(producer.backend or self.default_backend)
        spec = DistSpec(size, backend, True, False, 0)
        gpus = gpu_plan(spec, self.gpu_policy)
        if isinstance(gpus, str):
            return Outcome("skipped", "", f"{producer.describe()} cannot run here: {gpus}")
        module = item.getparent(pytest.Module)
        root = self._root()
        if module is None or root is None:
            where = "a Python test module" if module is None else "pytest's tmp_path plugin"
            return Outcome("failed", "", f"{producer.describe()} needs {where}.")
        pitem = producer_item(module, producer)
        try:
            timeout = item_timeout(pitem, self.session_timeout)
        except ValueError as exc:
            return Outcome("failed", "", f"{producer.describe()}: {exc}")
        folder = root / producer.folder_name
        self.outputs[pitem.nodeid] = str(folder)
        key = PoolKey(
            size,
            gpus.backend,
            True,
            isolated=ISOLATED_BASE - len(self.outputs),
            gpus=gpus.gpus,
            gpu_share=gpus.shared,
        )

        def run() -> Outcome:
            started = time.monotonic()
            reports = self.execute(pitem, spec, key, timeout)
            outcome = judge(producer, reports, str(folder), item.nodeid)
            outcome.seconds = time.monotonic() - started
            return outcome

        outcome = self._once_per_run(producer, folder, timeout.value, run)
        ran = f"ran in {outcome.worker or f'{outcome.seconds:.2f} s'}"
        self.notes.append(
            f"{producer.describe()} {outcome.kind} ({ran}, before {item.nodeid}); "
            f"its folder: {folder}"
        )
        return outcome

    def _root(self) -> Path | None:
        """Where producers' folders go: the basetemp, under xdist the run's (shared) one."""
        try:
            base = _compat.getbasetemp(self.config)
        except OSError:
            return None
        if base is None:
            return None
        if self._xdist_run() is not None:
            base = base.parent  # a worker's basetemp is <the run's basetemp>/popen-gw<N>
        return base / "distrank-fixtures"

    def _xdist_run(self) -> str | None:
        workerinput = getattr(self.config, "workerinput", None)
        return None if workerinput is None else str(workerinput.get("testrunuid", ""))

    def _once_per_run(
        self, producer: Producer, folder: Path, timeout: float, run: Callable[[], Outcome]
    ) -> Outcome:
        """Run it; under pytest-xdist once per run, behind a file lock, in the first worker
        that needs it."""
        run_id = self._xdist_run()
        if run_id is None:
            return run()
        from filelock import FileLock, Timeout

        folder.parent.mkdir(parents=True, exist_ok=True)
        result = folder.with_name(folder.name + ".json")
        wait = timeout + START_TIMEOUT + 60.0
        try:
            with FileLock(str(folder.with_name(folder.name + ".lock")), timeout=wait):
                if result.exists():
                    data = json.loads(result.read_text())
                    if data.get("run") == run_id:
                        return Outcome(**data["outcome"])
                outcome = run()
                worker = os.environ.get("PYTEST_XDIST_WORKER", "another xdist worker")
                shared = dataclasses.replace(outcome, worker=f"xdist worker {worker}")
                data = {"run": run_id, "outcome": dataclasses.asdict(shared)}
                result.write_text(json.dumps(data))
                return outcome
        except Timeout:
            return Outcome(
                "failed",
                str(folder),
                f"{producer.describe()}: waited {wait:.0f} s for the xdist worker that runs it "
                f"(its lock: {folder.name}.lock); it did not finish.",
            )


def judge(producer: Producer, reports: list[TestReport], folder: str, first: str) -> Outcome:
    """The producer's outcome from its merged reports."""
    failed = [r for r in reports if r.failed]
    if failed:
        return Outcome("failed", folder, failure_text(producer, failed, first))
    skipped = [r for r in reports if r.skipped]
    if skipped:
        longrepr: Any = skipped[0].longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        return Outcome("skipped", folder, f"{producer.describe()} was skipped: {reason}")
    return Outcome("passed", folder)


def failure_text(producer: Producer, failed: list[TestReport], first: str) -> str:
    """What every test that requests a failed producer says: which, where, what to do."""
    phases = ", ".join(dict.fromkeys(r.when for r in failed))
    heads = "; ".join(dict.fromkeys(_head(r) for r in failed))
    reports = "\n\n".join(_text(r) for r in failed)
    return (
        f"{producer.describe()} failed in its {phases}: {heads}\n"
        f"It ran once, before {first}, on {producer.world_size} ranks of its own; every test "
        "that requests it errors with this report, and it is not run again in this session.\n"
        f"What to do: fix {producer.name!r} (its report follows), then rerun any test that "
        "requests it.\n"
        f"{'-' * 20} the report of {producer.name!r} {'-' * 20}\n{reports}"
    )


def _head(report: TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    message = str(getattr(crash, "message", "") or "")
    return message.splitlines()[0] if message else f"failed in {report.when}"


def _text(report: TestReport) -> str:
    longrepr = report.longrepr
    sections = getattr(longrepr, "sections", None)
    if isinstance(sections, list):
        sections[:] = [s for s in sections if s[0] != RERUN_SECTION]
    return report.longreprtext.rstrip()

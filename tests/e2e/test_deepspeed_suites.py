"""End-to-end: test files written for DeepSpeed's ``DistributedTest`` harness run unmodified on
warm pools (docs/deepspeed.md).

DeepSpeed is not installed here, and its harness lives in its source tree's tests, not in its
package: the inner session carries a small look-alike of it, written for these tests, with the
same dispatch (a ``conftest.py`` hook that calls ``item.cls()(item._request)``; a
``DistributedExec`` base whose ``_launch_with_file_store`` / ``_launch_procs`` start a
multiprocessing pool whose workers run ``_dist_run``: the rank's variables, a group over a file
store, the test). Each inner test notes the process that ran it on each rank, so that warm pools
and the harness's own processes are told apart.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ..helpers import SharedSession, failure_section

#: DeepSpeed's conftest hooks, as its ``tests/conftest.py`` has them.
CONFTEST = """
import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    if getattr(item.cls, "is_dist_test", False):
        dist_test_class = item.cls()
        dist_test_class(item._request)
        item.runtest = lambda: True


def pytest_runtest_teardown(item, nextitem):
    if getattr(item.cls, "reuse_dist_env", False) and not nextitem:
        test = item.cls()
        for num_procs, pool in test._pool_cache.items():
            test._close_pool(pool, num_procs, force=True)
"""

#: A small stand-in for DeepSpeed's ``tests/unit/common.py`` (torch.distributed for
#: ``deepspeed.comm``), with its method names and its parent/child split.
COMMON = """
import inspect, os, time
import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from _pytest.outcomes import Skipped
from _pytest.fixtures import FixtureLookupError


class DistributedExec:
    world_size = 2
    backend = "gloo"
    init_distributed = True
    set_dist_env = True
    reuse_dist_env = False
    non_daemonic_procs = False
    _pool_cache = {}

    def _get_fixture_kwargs(self, request, func):
        kwargs = {}
        params = inspect.getfullargspec(func).args
        params.remove("self")
        for p in params:
            try:
                kwargs[p] = request.getfixturevalue(p)
            except FixtureLookupError:
                pass
        return kwargs

    def _launch_daemonic_procs(self, num_procs, init_method):
        pool = mp.Pool(processes=num_procs)
        args = [(rank, num_procs, "29511", init_method) for rank in range(num_procs)]
        try:
            skip_msgs = pool.starmap_async(self._dist_run, args).get(120)
        finally:
            self._close_pool(pool, num_procs)
        if any(skip_msgs):
            pytest.skip(skip_msgs[0])

    def _launch_non_daemonic_procs(self, num_procs, init_method):
        raise NotImplementedError

    def _launch_procs(self, num_procs, init_method):
        mp.set_start_method("forkserver", force=True)
        self._launch_daemonic_procs(num_procs, init_method)

    def _dist_run(self, local_rank, num_procs, master_port, init_method, skip_msg=""):
        if self.set_dist_env:
            os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(local_rank)
            os.environ["WORLD_SIZE"] = os.environ["LOCAL_SIZE"] = str(num_procs)
        if self.init_distributed:
            dist.init_process_group(
                self.backend, init_method=init_method, rank=local_rank, world_size=num_procs
            )
            dist.barrier()
        try:
            self.run(**self._fixture_kwargs)
        except Skipped as e:
            skip_msg = e.msg
        return skip_msg

    def _launch_with_file_store(self, request, world_size):
        tmpdir = request.getfixturevalue("tmpdir")
        for procs in [world_size] if isinstance(world_size, int) else world_size:
            self._launch_procs(procs, f"file://{tmpdir}/filestore-{procs}")
            time.sleep(0.5)

    def _dist_destroy(self):
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()

    def _close_pool(self, pool, num_procs, force=False):
        if force or not self.reuse_dist_env:
            pool.starmap(self._dist_destroy, [() for _ in range(num_procs)])
            pool.close()
            pool.join()


class DistributedTest(DistributedExec):
    is_dist_test = True

    @pytest.fixture(autouse=True, scope="class")
    def class_tmpdir(self, tmpdir_factory):
        return tmpdir_factory.mktemp(self.__class__.__name__)

    def run(self, **fixture_kwargs):
        self._current_test(**fixture_kwargs)

    def __call__(self, request):
        self._current_test = getattr(self, request.function.__name__)
        self._fixture_kwargs = self._get_fixture_kwargs(request, self._current_test)
        for mark in getattr(request.function, "pytestmark", []):
            if mark.name == "world_size":
                world_size = mark.args[0]
                break
        else:
            world_size = self._fixture_kwargs.get("world_size", self.world_size)
        self._launch_with_file_store(request, world_size)
"""

TESTS = """
import os, threading
import pytest
import torch
import torch.distributed as dist
from unit.common import DistributedTest


def note(name):
    with open(f"pid-{name}-{dist.get_rank()}-of-{dist.get_world_size()}", "w") as f:
        f.write(str(os.getpid()))


class TestWarm(DistributedTest):
    world_size = 2

    def test_all_reduce(self):
        note("all_reduce")
        t = torch.ones(1) * (dist.get_rank() + 1)
        dist.all_reduce(t)
        assert t.item() == 3

    def test_again(self):
        note("again")
        assert os.environ["LOCAL_SIZE"] == "2"

    @pytest.mark.world_size(1)
    def test_one_rank(self):
        note("one_rank")
        assert dist.get_world_size() == 1


@pytest.mark.parametrize("number", [7])
class TestFixtures(DistributedTest):
    world_size = 2

    def test_shared_tmpdir(self, number, tmpdir):
        # one tmpdir for every rank, as the harness hands its parent's to every process
        if dist.get_rank() == 0:
            tmpdir.join("written").write(str(number))
        dist.barrier()
        assert tmpdir.join("written").read() == "7"

    def test_skipped(self, number):
        pytest.skip(f"nothing to do for {number}")

    def test_fails_on_rank_1(self, number):
        assert dist.get_rank() == 0, "rank 1 disagrees"


@pytest.fixture
def lock():
    return threading.Lock()


class TestUnpicklable(DistributedTest):
    world_size = 2

    def test_lock(self, lock):
        pass


class TestSizes(DistributedTest):
    world_size = [1, 2]

    def test_each_size(self):
        note("each_size")
"""


#: The folder the shared inner session ran in (the first test's), where its notes are.
_RAN_IN: list[Path] = []


def write_ds(folder: Path, name: str = "test_ds.py", tests: str = TESTS) -> None:
    """DeepSpeed's conftest, its harness's stand-in and ``tests`` (as ``name``) in ``folder``."""
    if name == "test_ds.py":
        _RAN_IN.append(folder)
    (folder / "conftest.py").write_text(CONFTEST)
    (folder / "unit").mkdir()
    (folder / "unit" / "common.py").write_text(COMMON)
    (folder / name).write_text(tests)


def pool_outcomes(shared_session: SharedSession) -> dict[str, str]:
    """The outcome of each test of the shared pool session, by ``Class.test`` (junit)."""
    shared_session("deepspeed", write_ds, *DS_ARGS)
    found = {}
    for case in ET.parse(_RAN_IN[0] / "ds.xml").getroot().iter("testcase"):
        tags = {child.tag for child in case}
        outcome = next((t for t in ("failure", "error", "skipped") if t in tags), "passed")
        found[f"{str(case.get('classname')).split('.')[-1]}.{case.get('name')}"] = outcome
    return found


#: The shared pool session's arguments (test_subworlds.py compares a launched world's outcomes
#: with its junit file).
DS_ARGS = ("-rA", "-p", "no:cacheprovider", "--junitxml=ds.xml")


@pytest.fixture
def ds(shared_session: SharedSession) -> pytest.RunResult:
    return shared_session("deepspeed", write_ds, *DS_ARGS)


def _pids(name: str) -> dict[str, str]:
    return {p.name: p.read_text() for p in _RAN_IN[0].glob(f"pid-{name}-*")}


@pytest.mark.timeout(240)
def test_the_outcomes_are_the_harnesss(ds: pytest.RunResult) -> None:
    ds.assert_outcomes(passed=5, failed=2, skipped=1)
    out = ds.stdout.str()
    assert "SKIPPED [1] test_ds.py" in out and "nothing to do for 7" in out
    failed = failure_section(ds.outlines, "TestFixtures.test_fails_on_rank_1[7]").str()
    assert "AssertionError: rank 1 disagrees" in failed
    assert "root cause: rank 1/2" in failed


@pytest.mark.timeout(240)
def test_tests_of_one_size_share_a_warm_pool(ds: pytest.RunResult) -> None:
    first, again = _pids("all_reduce"), _pids("again")
    assert sorted(first) == ["pid-all_reduce-0-of-2", "pid-all_reduce-1-of-2"]
    assert sorted(first.values()) == sorted(again.values())  # the same two processes
    assert os.getpid() not in {int(p) for p in first.values()}
    assert list(_pids("one_rank")) == ["pid-one_rank-0-of-1"]  # its own mark
    assert "pools started: 1 at world size 1, 1 at world size 2" in ds.stdout.str()


@pytest.mark.timeout(240)
def test_fixture_values_are_rank_0s_and_must_pickle(ds: pytest.RunResult) -> None:
    out = ds.stdout.str()
    assert "PASSED test_ds.py::TestFixtures::test_shared_tmpdir[7]" in out
    section = failure_section(ds.outlines, "TestUnpicklable.test_lock").str()
    assert "the test's fixture values do not pickle on rank 0" in section
    assert "DeepSpeed's harness pickles them to its processes" in section


@pytest.mark.timeout(240)
def test_several_sizes_keep_the_harness(ds: pytest.RunResult) -> None:
    """``world_size = [1, 2]`` runs one size after the other: its harness runs it, in the
    pytest process, and no pool is started for it."""
    assert sorted(_pids("each_size")) == [
        "pid-each_size-0-of-1",
        "pid-each_size-0-of-2",
        "pid-each_size-1-of-2",
    ]
    assert "PASSED test_ds.py::TestSizes::test_each_size" in ds.stdout.str()
    assert "7 distributed tests" in ds.stdout.str()

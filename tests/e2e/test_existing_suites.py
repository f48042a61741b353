"""End-to-end: test files written for PyTorch's own harness run unmodified on warm pools.

Each inner file subclasses ``MultiProcessTestCase`` or ``MultiProcContinuousTest`` from
``torch.testing._internal.common_distributed`` as PyTorch's own suites do; the plugin runs each
test method on a pool of the class's world size instead of spawning fresh interpreters.

Every scenario is a file of its own in one inner session (``suites``); each test below checks its
scenario's lines. Each inner test notes which pool ran it (``note``: the rank's
``PYTEST_XDIST_WORKER``, ``distrank-pool<id>-rank<r>``, and its pid), so that a warm pool, a new
pool after a fault and fresh processes are told apart per class. ``--distrank-suites=own`` needs
a session of its own; the skips and errors decided before any rank starts run in-process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..helpers import RunPytest, SharedSession, failure_section

#: A two-rank MultiProcessTestCase over a FileStore, as PyTorch's c10d tests write it, and
#: ``note(test)``: the file ``pool-<Class>.<method>-<rank>`` holds the pool and pid that ran it.
PLAIN = """
import os, sys, threading, time, unittest
import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase, TEST_SKIPS


def note(test):
    # The rank process's name, not its environment: a harness test sees its child's.
    import multiprocessing
    pool = multiprocessing.current_process().name
    name = f"pool-{type(test).__name__}.{test._testMethodName}-{test.rank}"
    with open(name, "w") as f:
        f.write(f"{pool if pool.startswith('distrank-pool') else None} {os.getpid()}")


class Base(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def init(self):
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)
"""

#: A two-rank gloo MultiProcContinuousTest base, as PyTorch's DTensor suites write theirs.
CONTINUOUS = """
import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcContinuousTest


class ContinuousBase(MultiProcContinuousTest):
    world_size = 2

    @classmethod
    def backend_str(cls):
        return "gloo"

    @classmethod
    def device_type(cls):
        return "cpu"
"""

#: The scenarios of the shared session, one file each (``test_<name>.py``).
SCENARIOS = {
    "plain": PLAIN
    + """
class TestPlain(Base):
    def test_all_reduce(self):
        note(self)
        self.init()
        t = torch.ones(1) * (self.rank + 1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), 3)

    def test_same_processes_again(self):
        note(self)
        self.init()
        pids = [None, None]
        dist.all_gather_object(pids, os.getpid())
        self.assertEqual(len(set(pids)), 2)
""",
    "error": PLAIN
    + """
class TestError(Base):
    def test_rank_1_disagrees(self):
        self.init()
        dist.barrier()
        self.assertEqual(self.rank, 0, "rank 1 disagrees")

    def test_next_one_is_fine(self):
        self.init()
        dist.barrier()
""",
    "skips": PLAIN
    + """
from torch.testing._internal.common_distributed import skip_if_lt_x_gpu


class TestSkips(Base):
    def test_exit_code(self):
        sys.exit(TEST_SKIPS["multi-gpu-2"].exit_code)

    @skip_if_lt_x_gpu(2)
    def test_decorated(self):
        pass

    def test_skiptest_inside(self):
        self.skipTest("no widget on this rank")

    @unittest.skip("not today")
    def test_unittest_skip(self):
        pass
""",
    "codes": PLAIN
    + """
import functools


def decorated(fn):  # as PyTorch's requires_* decorators wrap tests
    @functools.wraps(fn)
    def wrapper(self):
        return fn(self)

    return wrapper


class TestCodes(Base):
    def setUp(self):
        super().setUp()
        self.special_return_code_checks = {self.test_exits_3.__wrapped__: 3}
        self.skip_return_code_checks = [self.test_any_code.__wrapped__]

    @decorated
    def test_exits_3(self):
        sys.exit(3)

    @decorated
    def test_any_code(self):
        sys.exit(41)

    @decorated
    def test_exits_4(self):
        sys.exit(4)


import signal


class TestAbort(MultiProcessTestCase):  # an NCCL abort test's check (docs/fault-tolerance.md)
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self.special_return_code_checks = {
            self.test_abort.__wrapped__: -signal.SIGABRT,
            self.test_abort_missing.__wrapped__: -signal.SIGABRT,
        }

    @decorated
    def test_abort(self):
        os.abort()

    @decorated
    def test_abort_missing(self):
        pass
""",
    "expected": PLAIN
    + """
class TestExpected(Base):
    @unittest.expectedFailure
    def test_known_bug(self):
        self.assertEqual(1, 2)

    @unittest.expectedFailure
    def test_fixed_bug(self):
        pass
""",
    "own_run": PLAIN
    + """
class TestOwnRun(Base):
    @classmethod
    def _run(cls, rank, test_name, file_name, pipe, **kwargs):
        dist.init_process_group(
            "gloo", init_method=f"file://{file_name}", rank=rank, world_size=2
        )
        self = cls(test_name)
        self.rank = rank
        self.file_name = file_name
        self.run_test(test_name, pipe)

    def test_group_is_ready(self):
        self.assertTrue(dist.is_initialized())
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), 2)
""",
    "with_comms": """
import torch
from torch.distributed.tensor import DTensor, Shard
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)


class TestShard(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    @with_comms
    def test_shard_and_gather(self):
        mesh = self.build_device_mesh()
        full = torch.arange(8.0).reshape(4, 2)
        dt = DTensor.from_local(full.chunk(2)[self.rank], mesh, [Shard(0)])
        self.assertEqual(dt.full_tensor(), full)
""",
    "continuous": PLAIN
    + CONTINUOUS
    + """
class TestContinuous(ContinuousBase):
    def test_a_fails_on_rank_1(self):
        note(self)
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(self.rank, 0)

    def test_b_runs_after_it(self):
        note(self)
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), 2)
""",
    # The harness runs setUpClass in its parent: a spawned child (_spawn_processes, a
    # continuous worker) never sees what it set, a forked one does, and what a child changes in
    # the class dies with it. Outcomes checked with -p no:distrank on torch 2.13 (whose harness
    # has no _fork_processes of its own: the class brings it, as torch < 2.9 had).
    "class_state": PLAIN
    + CONTINUOUS
    + """
class TestSpawned(Base):
    shared = None

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.shared = "from setUpClass"

    def setUp(self):
        assert self.shared == "from setUpClass"  # the parent's setUp has it
        super().setUp()

    def test_sees_class_state(self):
        self.assertEqual(self.shared, "from setUpClass")


class TestForked(TestSpawned):
    def _fork_processes(self):
        self._start_processes(torch.multiprocessing.get_context("fork").Process)

    def setUp(self):
        MultiProcessTestCase.setUp(self)
        self._fork_processes()

    def test_a_changes_the_class(self):
        self.assertEqual(self.shared, "from setUpClass")
        type(self).shared = "changed in a child"

    def test_b_sees_the_parents_class(self):
        self.assertEqual(self.shared, "from setUpClass")


class TestContinuousState(ContinuousBase):
    shared = None

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.shared = "from setUpClass"

    def test_sees_class_state(self):
        self.assertEqual(self.shared, "from setUpClass")
""",
    "leaks": PLAIN
    + """
class TestLeaks(Base):
    def test_a_leaks_a_thread(self):
        note(self)
        threading.Thread(target=time.sleep, args=(60,), name="leaky").start()

    def test_b_sets_a_variable(self):
        note(self)
        os.environ["LEAKED_BY_B"] = "1"

    def test_c_sees_a_clean_process(self):
        note(self)
        self.assertNotIn("LEAKED_BY_B", os.environ)
        self.assertNotIn("leaky", [t.name for t in threading.enumerate()])
""",
    # A harness test's environment is its child's: the controller's (the inner session's, whose
    # outer environment has no launcher variables: tests/conftest.py), nothing of the pool's.
    "childenv": PLAIN
    + CONTINUOUS
    + """
import subprocess

POOLS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
         "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_USE_AGENT_STORE",
         "TORCHELASTIC_RESTART_COUNT")


def seen():
    # DISTRANK_* that the inner session's own environment has (options) are the controller's.
    own = ("DISTRANK_RANK", "DISTRANK_POOL_TAG", "DISTRANK_MASTER_PORT", "DISTRANK_WORLD_SIZE")
    return sorted(k for k in os.environ if k in POOLS or k in own)


class TestChildEnv(Base):  # the issue's reproducer (its own harness: passed)
    def test_no_launcher_variables(self):
        leaked = [k for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "TORCHELASTIC_USE_AGENT_STORE")
                  if k in os.environ]
        self.assertEqual(leaked, [])

    def test_nothing_of_the_pools(self):
        self.assertEqual(seen(), [])
        with self.assertRaisesRegex(ValueError, "environment variable"):
            dist.init_process_group("gloo")  # env:// finds no MASTER_ADDR, as in the child
        os.environ["SET_BY_THE_CHILD"] = "1"

    def test_the_childs_variable_died_with_it(self):
        self.assertNotIn("SET_BY_THE_CHILD", os.environ)
        env = subprocess.run(["env"], capture_output=True, text=True, check=True).stdout
        self.assertNotIn("MASTER_ADDR=", env)
        import multiprocessing
        if multiprocessing.current_process().name.startswith("distrank-pool"):
            # What the test starts still carries the pool's tag (the reaper's), out of os.environ.
            self.assertIn("DISTRANK_POOL_TAG=", env)


class TestContinuousEnv(ContinuousBase):
    def test_a_worker(self):
        self.assertEqual(seen(), ["LOCAL_RANK"])  # _init_pg sets it in the worker
        os.environ["KEPT_BY_THE_WORKER"] = str(self.rank)

    def test_b_same_worker(self):
        self.assertEqual(os.environ.get("KEPT_BY_THE_WORKER"), str(self.rank))
        self.assertNotIn("MASTER_PORT", os.environ)
""",
    # A harness test sees the loggers its child has: no handler of pytest's or the plugin's
    # (test_c10d_logger.py's test_get_or_create_logger), yet records are still captured.
    "loggers": PLAIN
    + CONTINUOUS
    + """
import logging
from torch.distributed.c10d_logger import _c10d_logger


def foreign():
    found = []
    for lg in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        for h in getattr(lg, "handlers", []):
            if type(h).__module__.split(".")[0] in ("_pytest", "pytest_distrank"):
                found.append(f"{lg.name}: {type(h).__name__}")
    return found


class TestLoggers(Base):
    def test_get_or_create_logger(self):
        self.assertIsNotNone(_c10d_logger)
        self.assertEqual(1, len(_c10d_logger.handlers))
        self.assertIsInstance(_c10d_logger.handlers[0], logging.NullHandler)
        self.assertEqual(foreign(), [])
        _c10d_logger.warning("MARK-c10d-record-%d", self.rank)


class TestContinuousLoggers(ContinuousBase):
    def test_no_foreign_handler(self):
        self.assertEqual(foreign(), [])
        self.assertEqual(1, len(_c10d_logger.handlers))
"""
    + """
import pytest


@pytest.mark.world_size(2)
def test_plugin_test_still_captures(rank):
    logging.getLogger("some.library").warning("MARK-plugin-record")
""",
    # A warm pool never changes a harness test's outcome: state a test left in the module (its
    # harness's child would import it afresh) fails the next in a warm rank; it runs again on
    # fresh ranks at once, and its class stays on fresh ranks (pool/freshretry.py).
    "polluted": PLAIN
    + """
SEEN = []


class TestPolluted(Base):
    def test_a_pollutes(self):
        note(self)
        SEEN.append(self.rank)

    def test_b_fails_after_it(self):
        note(self)
        self.assertEqual(SEEN, [], "state of an earlier test")

    def test_c_fresh_from_here_on(self):
        note(self)
        self.assertEqual(SEEN, [])


class TestOwnFailure(Base):
    def test_a_runs(self):
        pass

    def test_b_fails_anyway(self):
        self.assertEqual(self.rank, 5, "fails in any process")
""",
    # As PyTorch's DistributedTest suite (TestDistBackend.setUp): the parent's setUp makes a
    # folder, hands it to its children in the environment, and its tearDown removes it; the
    # children meet at a file barrier there, and the harness sets a fresh port per test.
    "parent": PLAIN
    + """
import tempfile


class TestParentSetUp(Base):
    def setUp(self):
        self.folder = tempfile.TemporaryDirectory()
        os.environ["SUITE_TEMP_DIR"] = self.folder.name
        super().setUp()

    def tearDown(self):
        self.folder.cleanup()
        super().tearDown()

    def _file_barrier(self):
        folder = os.environ["SUITE_TEMP_DIR"]
        open(os.path.join(folder, str(self.rank)), "w").close()
        deadline = time.monotonic() + 20
        while len(os.listdir(folder)) < self.world_size:
            assert time.monotonic() < deadline, f"rank {self.rank}: alone in {folder}"
            time.sleep(0.01)

    def test_meet_in_the_parents_folder(self):
        note(self)
        self._file_barrier()
        self.assertTrue(os.path.isdir(os.environ["SUITE_TEMP_DIR"]))

    def test_meet_again(self):
        self._file_barrier()
""",
    # A class whose tests keep process-wide state a warm rank cannot give back, found by what it
    # is (a base named as RPC's test fixture): a pool of fresh ranks for each test.
    "rpc": PLAIN
    + """
class RpcAgentTestFixture:  # as torch.testing._internal.distributed.rpc's, by its name
    pass


AGENTS = []  # what init_rpc would leave in the process


class TestRpcLike(Base, RpcAgentTestFixture):
    def test_a_starts_an_agent(self):
        note(self)
        AGENTS.append(self.rank)
        self.assertEqual(AGENTS, [self.rank])

    def test_b_starts_an_agent(self):
        note(self)
        AGENTS.append(self.rank)
        self.assertEqual(AGENTS, [self.rank])
""",
    # pytest skips these by marker: no pool starts for them (world size 3 is no other test's).
    "skipped": """
import pytest


@pytest.mark.skip(reason="not today")
@pytest.mark.world_size(3)
def test_skipped(rank):
    raise AssertionError("never runs")


@pytest.mark.skipif(True, reason="condition holds")
@pytest.mark.world_size(3)
def test_skipped_if(rank):
    raise AssertionError("never runs")
""",
    "own": PLAIN
    + """
class TestOwn(Base):
    distrank_suites = "own"

    def test_spawned(self):
        note(self)
        self.init()
        dist.barrier()
""",
    "gpus": PLAIN
    + """
class TestGpus(Base):
    @property
    def world_size(self):
        return torch.cuda.device_count()

    def test_needs_gpus(self):
        pass
""",
    "marked": "import pytest\n"
    + PLAIN
    + """
@pytest.mark.world_size(2)
class TestMarked(Base):
    def test_x(self):
        pass
""",
    "fresh": PLAIN
    + """
class TestFresh(Base):
    distrank_isolate = True

    # A barrier after the group's init: without one, a rank whose side of gloo's connectFullMesh
    # finished first could end the test and close its sockets while its peer was still
    # connecting ("Connection closed by peer" on rank 1, seen under load).
    def test_one(self):
        note(self)
        self.init()
        dist.barrier()

    def test_two(self):
        note(self)
        self.init()
        dist.barrier()
""",
}

#: Where each shared session ran (its files, the ranks' notes), by name.
_FOLDERS: dict[str, Path] = {}


def _write(folder: Path) -> None:
    _FOLDERS["suites"] = folder
    for name, source in SCENARIOS.items():
        (folder / f"test_{name}.py").write_text(source)


@pytest.fixture
def suites(shared_session: SharedSession) -> pytest.RunResult:
    """The shared session: every scenario of :data:`SCENARIOS`, ``-v -rA``."""
    return shared_session("suites", _write, "-v", "-rA")


def _pools(test: str) -> list[tuple[str, str]]:
    """``(pool, pid)`` of each rank (rank 0 first) that ran ``Class.method`` (its notes)."""
    notes = [(_FOLDERS["suites"] / f"pool-{test}-{rank}").read_text() for rank in (0, 1)]
    return [(pool, pid) for pool, pid in (note.split() for note in notes)]


def test_a_file_store_test_case_runs_on_one_warm_pool(suites: pytest.RunResult) -> None:
    suites.stdout.fnmatch_lines_random(
        [
            "test_plain.py::TestPlain::test_all_reduce PASSED*",
            "test_plain.py::TestPlain::test_same_processes_again PASSED*",
        ]
    )
    first = _pools("TestPlain.test_all_reduce")
    second = _pools("TestPlain.test_same_processes_again")
    assert first == second, (first, second)  # the same pool, the same processes
    assert [pool.rsplit("-", 1)[1] for pool, _ in first] == ["rank0", "rank1"], first


def test_the_summary_counts_distributed_tests_and_pools(suites: pytest.RunResult) -> None:
    """Every test method taken over is a distributed test (not ``TestOwn``'s, nor one that a
    unittest decorator skips before any process); pools: the warm one, a new one after each fault
    (two failures in continuous classes, a thread left running, ``TestAbort``'s expected abort;
    a variable left set is restored), one per test of ``TestFresh`` and of ``TestRpcLike``, one
    for the plugin test beside the harness classes (its group is initialised), and one for each
    ``MultiProcessTestCase`` test that failed after others in a warm pool (run again on fresh
    ranks: six of them, and ``TestPolluted``'s last test on fresh ranks after that); none for the
    tests skipped by marker (at world size 3)."""
    suites.stdout.fnmatch_lines(["45 distributed tests; pools started: 17 at world size 2"])


def test_an_error_on_one_rank_shows_its_traceback(suites: pytest.RunResult) -> None:
    suites.stdout.fnmatch_lines_random(
        [
            "test_error.py::TestError::test_rank_1_disagrees FAILED*",
            "test_error.py::TestError::test_next_one_is_fine PASSED*",
        ]
    )
    failure_section(suites.stdout.lines, "TestError.test_rank_1_disagrees").fnmatch_lines(
        [
            "distrank: 1 of 2 ranks failed; root cause: rank 1/2",
            "*AssertionError: Scalars are not equal!",
            "*Traceback (most recent call last):*",
            '*self.assertEqual(self.rank, 0, "rank 1 disagrees")*',
            "*rank 1 disagrees*",
        ]
    )
    suites.stdout.fnmatch_lines(
        [
            "FAILED test_error.py::TestError::test_rank_1_disagrees - [[]rank 1/2[]] "
            "AssertionError: Scalars*"
        ]
    )
    assert "Caught exception" not in suites.stdout.str()


def test_skips_by_exit_code_skiptest_and_decorators_say_why(suites: pytest.RunResult) -> None:
    suites.stdout.fnmatch_lines_random(
        [
            f"test_skips.py::TestSkips::{name} SKIPPED*"
            for name in ("test_exit_code", "test_decorated", "test_skiptest_inside")
        ]
        + [
            "test_skips.py::TestSkips::test_unittest_skip SKIPPED*",
            "SKIPPED [[]1[]] test_skips.py:*: no widget on this rank",
            "SKIPPED [[]1[]] test_skips.py: not today",
        ]
    )
    cuda = [
        line
        for line in suites.stdout.lines
        if line.startswith("SKIPPED [1] test_skips.py:")
        and line.endswith(": Need at least 2 CUDA devices")
    ]
    assert len(cuda) == 2, cuda  # the exit code's and the decorator's


def test_the_parents_return_code_rules_apply(suites: pytest.RunResult) -> None:
    suites.stdout.fnmatch_lines_random(
        [
            "test_codes.py::TestCodes::test_any_code PASSED*",
            "test_codes.py::TestCodes::test_exits_3 PASSED*",
            "test_codes.py::TestCodes::test_exits_4 FAILED*",
        ]
    )
    failure_section(suites.stdout.lines, "TestCodes.test_exits_4").fnmatch_lines(
        ["*rank 0 exited with code 4, expected 0*"]
    )


def test_a_harness_class_expecting_a_signal(suites: pytest.RunResult) -> None:
    """A rank that ends with the expected ``-signal.SIGABRT`` passes; one that exits 0 where
    the abort was expected fails (moved from tests/e2e/test_fault_injection.py, whose session
    imported PyTorch's harness for it alone)."""
    suites.stdout.fnmatch_lines_random(
        [
            "test_codes.py::TestAbort::test_abort PASSED*",
            "test_codes.py::TestAbort::test_abort_missing FAILED*",
        ]
    )
    failure_section(suites.stdout.lines, "TestAbort.test_abort_missing").fnmatch_lines(
        ["*exited with code 0, expected -6*"]
    )


def test_expected_failures_follow_unittest(suites: pytest.RunResult) -> None:
    suites.stdout.fnmatch_lines_random(
        [
            "test_expected.py::TestExpected::test_known_bug XFAIL*",
            "test_expected.py::TestExpected::test_fixed_bug FAILED*",
        ]
    )
    failure_section(suites.stdout.lines, "TestExpected.test_fixed_bug").fnmatch_lines(
        ["*unexpected success on rank 0*"]
    )


def test_an_overridden_run_initialises_the_group(suites: pytest.RunResult) -> None:
    suites.stdout.fnmatch_lines(["test_own_run.py::TestOwnRun::test_group_is_ready PASSED*"])


def test_with_comms_dtensor_tests_run(suites: pytest.RunResult) -> None:
    suites.stdout.fnmatch_lines(["test_with_comms.py::TestShard::test_shard_and_gather PASSED*"])


def test_a_continuous_class_goes_on_after_a_failure(suites: pytest.RunResult) -> None:
    suites.stdout.fnmatch_lines_random(
        [
            "test_continuous.py::TestContinuous::test_a_fails_on_rank_1 FAILED*",
            "test_continuous.py::TestContinuous::test_b_runs_after_it PASSED*",
            "pool killed after a fault: *: test_continuous.py::TestContinuous::"
            "test_a_fails_on_rank_1 failed on rank 1 in MultiProcContinuousTest class "
            "TestContinuous: the class's process group may be out of step; its next test gets a "
            "new pool (and _init_pg)",
        ]
    )
    failed = _pools("TestContinuous.test_a_fails_on_rank_1")
    after = _pools("TestContinuous.test_b_runs_after_it")
    assert failed[0][0] != after[0][0], (failed, after)  # a new pool


def test_set_up_class_state_reaches_the_test_only_where_the_harness_child_has_it(
    suites: pytest.RunResult,
) -> None:
    """See the ``class_state`` scenario: a spawned or continuous child does not see what
    setUpClass set in the parent, a forked one does, and a child's change dies with it."""
    suites.stdout.fnmatch_lines_random(
        [
            "test_class_state.py::TestSpawned::test_sees_class_state FAILED*",
            "test_class_state.py::TestForked::test_sees_class_state PASSED*",
            "test_class_state.py::TestForked::test_a_changes_the_class PASSED*",
            "test_class_state.py::TestForked::test_b_sees_the_parents_class PASSED*",
            "test_class_state.py::TestContinuousState::test_sees_class_state FAILED*",
        ]
    )
    for title in ("TestSpawned.test_sees_class_state", "TestContinuousState.test_sees_class_state"):
        failure_section(suites.stdout.lines, title).fnmatch_lines(
            [
                # The test's own line, read from the child's traceback (not the plugin's raise).
                "distrank: all 2 ranks failed the same way (AssertionError at "
                "test_class_state.py:*)*",
                "*None mismatch: None is not from setUpClass*",
            ]
        )


def test_a_leaked_thread_replaces_the_pool_and_a_variable_is_restored(
    suites: pytest.RunResult,
) -> None:
    """Harness classes go through the same leftover checks as plain tests (rank/leftovers.py):
    a thread still running makes the pool unfit. A variable the test set was its child's
    environment (pool/worker/harnessenv.py): the rank's own comes back, and nothing is named."""
    suites.stdout.fnmatch_lines_random(
        [
            "test_leaks.py::TestLeaks::test_a_leaks_a_thread PASSED*",
            "test_leaks.py::TestLeaks::test_b_sets_a_variable PASSED*",
            "test_leaks.py::TestLeaks::test_c_sees_a_clean_process PASSED*",
            "pool killed after a fault: *: test_leaks.py::TestLeaks::test_a_leaks_a_thread left "
            "thread 'leaky' running (not a daemon: a fresh process would wait for it) on rank *",
        ]
    )
    assert "LEAKED_BY_B" not in suites.stdout.str()  # the child's environment: gone, unnamed
    names = ("test_a_leaks_a_thread", "test_b_sets_a_variable", "test_c_sees_a_clean_process")
    pools = [_pools(f"TestLeaks.{name}")[0][0] for name in names]
    assert pools[0] != pools[1] == pools[2], pools  # a new pool after the thread only


def test_a_harness_test_sees_its_childs_environment_not_the_pools(
    suites: pytest.RunResult,
) -> None:
    """The issue's reproducer (its own harness: 1 passed): no launcher variable, no DISTRANK_*,
    env:// finds nothing to meet at; what the child set dies with it; a continuous class's
    worker keeps its own from one test to the next; processes a test starts carry the tag."""
    suites.stdout.fnmatch_lines_random(
        [
            "test_childenv.py::TestChildEnv::test_no_launcher_variables PASSED*",
            "test_childenv.py::TestChildEnv::test_nothing_of_the_pools PASSED*",
            "test_childenv.py::TestChildEnv::test_the_childs_variable_died_with_it PASSED*",
            "test_childenv.py::TestContinuousEnv::test_a_worker PASSED*",
            "test_childenv.py::TestContinuousEnv::test_b_same_worker PASSED*",
        ]
    )
    assert "SET_BY_THE_CHILD" not in suites.stdout.str()  # never named a leftover
    # The continuous class's group (made by its first test) is the class's: its sockets too.
    assert "TestContinuousEnv::test_a_worker left" not in suites.stdout.str()


def test_a_harness_test_sees_no_handler_of_pytest_or_the_plugin(suites: pytest.RunResult) -> None:
    """test_c10d_logger.py's check passes with no option; what a non-propagating logger logs in
    a harness test is still captured (its record in the -rA section), and plugin tests' too."""
    suites.stdout.fnmatch_lines_random(
        [
            "test_loggers.py::TestLoggers::test_get_or_create_logger PASSED*",
            "test_loggers.py::TestContinuousLoggers::test_no_foreign_handler PASSED*",
            "test_loggers.py::test_plugin_test_still_captures*PASSED*",
            "*MARK-c10d-record-0*",
            "*MARK-plugin-record*",
        ]
    )


def test_a_harness_test_that_fails_in_a_warm_pool_gets_its_fresh_outcome(
    suites: pytest.RunResult,
) -> None:
    """Its harness gives every test new processes: a failure in a warm pool after other tests
    runs again at once on fresh ranks; the fresh outcome stands, the warm failure stays in the
    report, the class moves to fresh ranks; a failure on fresh ranks too stands as it is."""
    suites.stdout.fnmatch_lines_random(
        [
            "test_polluted.py::TestPolluted::test_a_pollutes PASSED*",
            "test_polluted.py::TestPolluted::test_b_fails_after_it PASSED*",
            "test_polluted.py::TestPolluted::test_c_fresh_from_here_on PASSED*",
            "test_polluted.py::TestOwnFailure::test_b_fails_anyway FAILED*",
            "TestPolluted: its tests run on fresh ranks from here on: test_b_fails_after_it "
            "failed in a warm pool after * earlier tests (the last: test_a_pollutes) "
            "([[]all 2 ranks[]] AssertionError: *) and passed on fresh ranks",
        ]
    )
    section = failure_section(suites.stdout.lines, "TestOwnFailure.test_b_fails_anyway")
    section.fnmatch_lines(
        [
            "*distrank: the warm pool's failure (then run again on fresh ranks)*",
            "test_b_fails_anyway failed in the warm pool (*AssertionError: Scalars*) and on fresh "
            "ranks too: the failure is the test's own under its harness's conditions*",
        ]
    )
    a, b, c = (
        _pools(f"TestPolluted.{n}")
        for n in ("test_a_pollutes", "test_b_fails_after_it", "test_c_fresh_from_here_on")
    )
    assert a != b != c and a != c, (a, b, c)  # b's note is its fresh run's; c a pool of its own


def test_the_parents_setup_runs_once_its_environment_reaches_every_rank(
    suites: pytest.RunResult,
) -> None:
    """PyTorch's DistributedTest suite hands the folder its setUp makes to the children in
    TEMP_DIR: every rank takes rank 0's (one folder, one barrier), what setUp set is never the
    test's leftover, and rank 0's tearDown removes the folder only after every rank finished."""
    suites.stdout.fnmatch_lines_random(
        [
            "test_parent.py::TestParentSetUp::test_meet_in_the_parents_folder PASSED*",
            "test_parent.py::TestParentSetUp::test_meet_again PASSED*",
        ]
    )
    assert "SUITE_TEMP_DIR" not in suites.stdout.str()  # no leftovers line names it


def test_a_class_whose_state_cannot_survive_gets_fresh_ranks_per_test(
    suites: pytest.RunResult,
) -> None:
    suites.stdout.fnmatch_lines_random(
        [
            "test_rpc.py::TestRpcLike::test_a_starts_an_agent PASSED*",
            "test_rpc.py::TestRpcLike::test_b_starts_an_agent PASSED*",
            "2 tests of TestRpcLike ran on fresh ranks: RPC state does not survive between tests "
            "(a pool each)",
        ]
    )
    pools = [
        _pools(f"TestRpcLike.{name}")[0][0]
        for name in ("test_a_starts_an_agent", "test_b_starts_an_agent")
    ]
    assert pools[0] != pools[1], pools


def test_tests_skipped_by_marker_start_no_pool(suites: pytest.RunResult) -> None:
    suites.stdout.fnmatch_lines_random(
        [
            "test_skipped.py::test_skipped SKIPPED (not today)*",
            "test_skipped.py::test_skipped_if SKIPPED (condition holds)*",
        ]
    )
    assert "world size 3" not in suites.stdout.str()


def test_the_class_attribute_leaves_the_class_to_its_own_harness(
    suites: pytest.RunResult,
) -> None:
    suites.stdout.fnmatch_lines(["test_own.py::TestOwn::test_spawned PASSED*"])
    # Its harness spawned the ranks: no pool's worker id in their environment.
    assert [pool for pool, _ in _pools("TestOwn.test_spawned")] == ["None", "None"]


def test_a_class_that_needs_fresh_processes_gets_them(suites: pytest.RunResult) -> None:
    # Once in a loaded CI run the PASSED line was missing and the output not shown: show it.
    fresh = [line for line in suites.stdout.lines if "TestFresh" in line or "test_fresh" in line]
    passed = [f"test_fresh.py::TestFresh::test_{n} PASSED" for n in ("one", "two")]
    assert all(any(line.startswith(p) for line in fresh) for p in passed), "\n".join(
        fresh or suites.stdout.lines
    )
    one, two = _pools("TestFresh.test_one"), _pools("TestFresh.test_two")
    assert one[0][0] != two[0][0] and one[0][1] != two[0][1], (one, two)


def test_the_option_leaves_every_class_to_its_own_harness(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        PLAIN
        + """
class TestOwn(Base):
    def test_spawned(self):
        self.init()
        dist.barrier()
"""
    )
    result = run_pytest("-v", "--distrank-suites=own")
    result.assert_outcomes(passed=1)
    assert "distributed test" not in result.stdout.str()


def test_a_class_world_size_of_zero_is_a_skip(suites: pytest.RunResult) -> None:
    """Decided at collection: no pool starts for it, and it is not counted as a distributed
    test (the summary's count, checked above)."""
    suites.stdout.fnmatch_lines(
        [
            "test_gpus.py::TestGpus::test_needs_gpus SKIPPED*",
            "SKIPPED [[]1[]] test_gpus.py:*TestGpus.world_size is 0 on this machine (it often "
            "counts GPUs*",
        ]
    )


def test_a_world_size_marker_on_such_a_class_is_an_error(suites: pytest.RunResult) -> None:
    suites.stdout.fnmatch_lines(["test_marked.py::TestMarked::test_x ERROR*"])
    failure_section(suites.stdout.lines, "ERROR at setup of TestMarked.test_x").fnmatch_lines(
        ["*@pytest.mark.world_size on TestMarked, a MultiProcessTestCase class*Remove the marker*"]
    )
    assert suites.ret != 0

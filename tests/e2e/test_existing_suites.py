"""End-to-end: test files written for PyTorch's own harness run unmodified on warm pools.

Each inner file subclasses ``MultiProcessTestCase`` or ``MultiProcContinuousTest`` from
``torch.testing._internal.common_distributed`` as PyTorch's own suites do; the plugin runs each
test method on a pool of the class's world size instead of spawning fresh interpreters.
"""

from __future__ import annotations

import pytest

from ..helpers import RunPytest

#: A two-rank MultiProcessTestCase over a FileStore, as PyTorch's c10d tests write it.
PLAIN = """
import os, sys, threading, time, unittest
import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase, TEST_SKIPS


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


def test_a_file_store_test_case_runs_on_one_warm_pool(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        PLAIN
        + """
class TestPlain(Base):
    def test_all_reduce(self):
        self.init()
        t = torch.ones(1) * (self.rank + 1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), 3)

    def test_same_processes_again(self):
        self.init()
        pids = [None, None]
        dist.all_gather_object(pids, os.getpid())
        self.assertEqual(len(set(pids)), 2)
"""
    )
    result = run_pytest("-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "*TestPlain::test_all_reduce PASSED*",
            "*TestPlain::test_same_processes_again PASSED*",
            "2 distributed tests; pools started: 1 at world size 2",
        ]
    )


def test_an_error_on_one_rank_shows_its_traceback(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        PLAIN
        + """
class TestError(Base):
    def test_rank_1_disagrees(self):
        self.init()
        dist.barrier()
        self.assertEqual(self.rank, 0, "rank 1 disagrees")

    def test_next_one_is_fine(self):
        self.init()
        dist.barrier()
"""
    )
    result = run_pytest()
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "distrank: 1 of 2 ranks failed; root cause: rank 1/2",
            "*AssertionError: Scalars are not equal!",
            "*Traceback (most recent call last):*",
            '*self.assertEqual(self.rank, 0, "rank 1 disagrees")*',
            "*rank 1 disagrees*",
            "FAILED *::test_rank_1_disagrees - [[]rank 1/2[]] Failed: AssertionError: Scalars*",
        ]
    )
    assert "Caught exception" not in result.stdout.str()


def test_skips_by_exit_code_skiptest_and_decorators_say_why(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        PLAIN
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
"""
    )
    result = run_pytest("-rs")
    result.assert_outcomes(skipped=4)
    result.stdout.fnmatch_lines_random(
        [
            "SKIPPED [[]1[]] *.py:*: Need at least 2 CUDA devices",
            "SKIPPED [[]1[]] *.py:*: Need at least 2 CUDA devices",
            "SKIPPED [[]1[]] *.py:*: no widget on this rank",
            "SKIPPED [[]1[]] *.py: not today",
        ]
    )


def test_the_parents_return_code_rules_apply(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        PLAIN
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
"""
    )
    result = run_pytest("-v")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_any_code PASSED*",
            "*test_exits_3 PASSED*",
            "*rank 0 exited with code 4, expected 0*",
        ]
    )


def test_expected_failures_follow_unittest(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        PLAIN
        + """
class TestExpected(Base):
    @unittest.expectedFailure
    def test_known_bug(self):
        self.assertEqual(1, 2)

    @unittest.expectedFailure
    def test_fixed_bug(self):
        pass
"""
    )
    result = run_pytest("-rxX")
    result.assert_outcomes(xfailed=1, failed=1)
    result.stdout.fnmatch_lines(["*unexpected success on rank 0*"])


def test_an_overridden_run_initialises_the_group(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        PLAIN
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
"""
    )
    result = run_pytest()
    result.assert_outcomes(passed=1)


def test_with_comms_dtensor_tests_run(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    pytester.makepyfile(
        """
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
        """
    )
    result = run_pytest()
    result.assert_outcomes(passed=1)


def test_a_continuous_class_goes_on_after_a_failure(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        CONTINUOUS
        + """
class TestContinuous(ContinuousBase):
    def test_a_fails_on_rank_1(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(self.rank, 0)

    def test_b_runs_after_it(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), 2)
"""
    )
    result = run_pytest("-v")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_a_fails_on_rank_1 FAILED*",
            "*test_b_runs_after_it PASSED*",
            "2 distributed tests; pools started: 2 at world size 2",
            "pool killed after a fault: *::TestContinuous::test_a_fails_on_rank_1 failed on rank "
            "1 in MultiProcContinuousTest class TestContinuous: the class's process group may be "
            "out of step; its next test gets a new pool (and _init_pg)",
        ]
    )


def test_set_up_class_state_reaches_the_test_only_where_the_harness_child_has_it(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    """The harness runs ``setUpClass`` in its parent: a spawned child (``_spawn_processes``,
    a continuous worker) never sees what it set, a forked one does, and what a child changes
    in the class dies with it. Outcomes checked with ``-p no:distrank`` on torch 2.13 (whose
    harness has no ``_fork_processes`` of its own: the class brings it, as torch < 2.9 had)."""
    pytester.makepyfile(
        PLAIN
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


class TestContinuous(ContinuousBase):
    shared = None

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.shared = "from setUpClass"

    def test_sees_class_state(self):
        self.assertEqual(self.shared, "from setUpClass")
"""
    )
    result = run_pytest("-v")
    result.assert_outcomes(failed=2, passed=3)
    result.stdout.fnmatch_lines_random(
        [
            "*TestSpawned::test_sees_class_state FAILED*",
            "*TestForked::test_sees_class_state PASSED*",
            "*TestForked::test_a_changes_the_class PASSED*",
            "*TestForked::test_b_sees_the_parents_class PASSED*",
            "*TestContinuous::test_sees_class_state FAILED*",
            "*None mismatch: None is not from setUpClass*",
        ]
    )


def test_leaked_threads_and_environment_replace_the_pool(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        PLAIN
        + """
class TestLeaks(Base):
    def test_a_leaks_a_thread(self):
        threading.Thread(target=time.sleep, args=(60,), name="leaky", daemon=True).start()

    def test_b_sets_a_variable(self):
        os.environ["DISTRANK_LEAKED"] = "1"

    def test_c_sees_a_clean_process(self):
        self.assertNotIn("DISTRANK_LEAKED", os.environ)
        self.assertNotIn("leaky", [t.name for t in threading.enumerate()])
"""
    )
    result = run_pytest("-v")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "3 distributed tests; pools started: 3 at world size 2",
            "pool killed after a fault: *::TestLeaks::test_a_leaks_a_thread left 1 thread "
            "running on rank * ('leaky')",
            "pool killed after a fault: *::TestLeaks::test_b_sets_a_variable changed "
            "environment variable(s) DISTRANK_LEAKED on rank *",
        ]
    )


def test_a_class_world_size_of_zero_is_a_skip(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        PLAIN
        + """
class TestGpus(Base):
    @property
    def world_size(self):
        return torch.cuda.device_count()

    def test_needs_gpus(self):
        pass
"""
    )
    result = run_pytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        ["SKIPPED *TestGpus.world_size is 0 on this machine (it often counts GPUs*"]
    )
    assert "distributed test" not in result.stdout.str()


def test_a_world_size_marker_on_such_a_class_is_an_error(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        "import pytest\n"
        + PLAIN
        + """
@pytest.mark.world_size(2)
class TestMarked(Base):
    def test_x(self):
        pass
"""
    )
    result = run_pytest()
    assert result.ret != 0
    result.stdout.fnmatch_lines(
        ["*@pytest.mark.world_size on TestMarked, a MultiProcessTestCase class*Remove the marker*"]
    )


@pytest.mark.parametrize("how", ["option", "class attribute"])
def test_opting_out_leaves_the_class_to_its_own_harness(
    pytester: pytest.Pytester, run_pytest: RunPytest, how: str
) -> None:
    attribute = "    distrank_suites = 'own'\n" if how == "class attribute" else ""
    pytester.makepyfile(
        PLAIN
        + f"""
class TestOwn(Base):
{attribute}
    def test_spawned(self):
        self.init()
        dist.barrier()
"""
    )
    args = ["--distrank-suites=own"] if how == "option" else []
    result = run_pytest("-v", *args)
    result.assert_outcomes(passed=1)
    assert "distributed test" not in result.stdout.str()


def test_a_class_that_needs_fresh_processes_gets_them(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        PLAIN
        + """
class TestFresh(Base):
    distrank_isolate = True

    def test_one(self):
        self.init()

    def test_two(self):
        self.init()
"""
    )
    result = run_pytest()
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["2 distributed tests; pools started: 2 at world size 2"])

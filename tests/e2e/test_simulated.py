"""End-to-end: ``@pytest.mark.simulate("fake", N)`` runs a test again in a simulated world of N
ranks, in one process, beside its real world sizes (ids ``ws<N>-fake``)."""

from __future__ import annotations

import pytest

from ..helpers import RunPytest


def test_fake_world_ids_run_beside_the_real_ones(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        test_plan="""
        import os, pytest, torch.distributed as dist

        @pytest.mark.world_size(2)
        @pytest.mark.simulate("fake", 1024)
        def test_world(rank, world_size, pg, device):
            assert dist.get_world_size() == world_size
            assert dist.get_rank() == rank
            assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == (str(rank), str(world_size))
            assert device.type == "cpu"
            with open(f"seen-{world_size}-{rank}-{dist.get_backend()}", "w"):
                pass
        """
    )
    result = run_pytest("-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "*::test_world[[]ws2[]] PASSED*",
            "*::test_world[[]ws1024-fake[]] PASSED*",
            "2 distributed tests; pools started: 1 at world size 2, "
            "1 at world size 1024 simulated (fake)",
        ]
    )
    seen = sorted(p.name for p in pytester.path.glob("seen-*"))
    assert seen == ["seen-1024-0-fake", "seen-2-0-gloo", "seen-2-1-gloo"]


def test_each_simulated_rank_is_a_test_of_its_own(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        test_ranks="""
        import pytest

        @pytest.mark.simulate("fake", 64, 1024, ranks=(0, 63))
        def test_rank(rank, world_size):
            with open(f"seen-{world_size}-{rank}", "w"):
                pass
        """
    )
    result = run_pytest("-v")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        [
            "*::test_rank[[]ws64-fake-r0[]] PASSED*",
            "*::test_rank[[]ws64-fake-r63[]] PASSED*",
            "*::test_rank[[]ws1024-fake-r0[]] PASSED*",
            "*::test_rank[[]ws1024-fake-r63[]] PASSED*",
        ]
    )
    seen = sorted(p.name for p in pytester.path.glob("seen-*"))
    assert seen == ["seen-1024-0", "seen-1024-63", "seen-64-0", "seen-64-63"]


def test_a_value_only_real_collectives_give_fails_saying_fake_moves_no_data(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        test_sum="""
        import pytest, torch, torch.distributed as dist

        @pytest.mark.world_size(2)
        @pytest.mark.simulate("fake", 1024)
        def test_sum(rank, world_size, pg):
            t = torch.ones(1)
            dist.all_reduce(t)
            assert t.item() == world_size
        """
    )
    result = run_pytest("-v", "-rf")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*::test_sum[[]ws2[]] PASSED*",
            "*::test_sum[[]ws1024-fake[]] FAILED*",
            "E       assert 1.0 == 1024",
            "*distrank: simulated world*",
            "world size 1024 simulated (fake, as rank 0), in one process. Fake mode moves no "
            "data: every collective returns at once with this rank's own input*",
            "FAILED test_sum.py::test_sum[[]ws1024-fake[]] - "
            "[[]simulated rank 0/1024[]] assert 1.0 == 1024",
        ]
    )


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        (
            'simulate("threads", 64)',
            "*simulate('threads', 64): mode 'threads' is not one of 'fake', 'local'; write e.g. "
            "@pytest.mark.simulate('fake', 1024).",
        ),
        (
            'simulate("local", 64, ranks=(3,))',
            "*simulate('local', 64, ranks=(3,)): local mode plays every rank at once*",
        ),
        (
            'simulate("fake", 8, ranks=(8,))',
            "*rank 8 is not a rank of a world of size 8 (0 to 7).",
        ),
        ('simulate("fake")', "*simulate('fake'): give the simulated world size(s)."),
    ],
    ids=["unknown-mode", "local-with-ranks", "rank-outside", "no-size"],
)
def test_a_bad_simulate_marker_errors_that_test_alone(
    pytester: pytest.Pytester, run_pytest: RunPytest, marker: str, message: str
) -> None:
    pytester.makepyfile(
        test_bad=f"""
        import pytest

        @pytest.mark.{marker}
        def test_bad(rank):
            pass

        def test_plain():
            pass
        """
    )
    result = run_pytest("-rE")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines([message])


def test_a_bare_world_size_beside_simulate_takes_the_default_size(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        test_bare="""
        import pytest

        @pytest.mark.world_size()
        @pytest.mark.simulate("fake", 256)
        def test_sizes(world_size):
            pass
        """
    )
    result = run_pytest("-v", "--distrank-world-size=3")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["*::test_sizes[[]ws3[]] PASSED*", "*::test_sizes[[]ws256-fake[]] PASSED*"]
    )


def test_meta_device_in_a_fake_world(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    pytester.makepyfile(
        test_meta="""
        import pytest, torch

        @pytest.mark.simulate("fake", 8192, device="meta")
        def test_huge(device, world_size):
            assert device.type == "meta"
            weights = torch.empty(world_size, 1 << 30, device=device)  # 32 TiB, never allocated
            assert weights.shape == (8192, 1 << 30)
        """
    )
    result = run_pytest("-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*::test_huge[[]ws8192-fake[]] PASSED*"])


#: A DTensor test with a numeric result: run for real at ws4 and in local mode at ws4 and ws64.
DTENSOR_TEST = """
import pytest, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

OFFSET = {offset}

@pytest.fixture
def scaled(rank):
    return torch.ones(2) * (rank + 1)  # a function-scoped fixture: each rank's own value

@pytest.mark.world_size(4)
@pytest.mark.simulate("local", 4, 64)
def test_sharded_sum(world_size, device, scaled):
    mesh = init_device_mesh(device.type, (world_size,))
    x = torch.arange(world_size * 4, dtype=torch.float32).reshape(world_size * 2, 2)
    sharded = distribute_tensor(x, mesh, [Shard(0)])
    assert sharded.to_local().shape == (2, 2)
    assert sharded.sum().full_tensor().item() == sum(range(world_size * 4)) + OFFSET
    ones = distribute_tensor(torch.ones(2, 3), mesh, [Replicate()])
    torch.testing.assert_close((sharded @ ones).full_tensor(), x @ torch.ones(2, 3))
    dist.all_reduce(scaled)
    assert scaled.tolist() == [world_size * (world_size + 1) // 2] * 2
"""


def test_local_mode_passes_the_numeric_test_the_real_run_passes(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(test_dtensor=DTENSOR_TEST.format(offset=0))
    result = run_pytest("-v")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "*::test_sharded_sum[[]ws4[]] PASSED*",
            "*::test_sharded_sum[[]ws4-local[]] PASSED*",
            "*::test_sharded_sum[[]ws64-local[]] PASSED*",
        ]
    )


def test_local_mode_fails_when_the_expected_value_changes(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(test_dtensor=DTENSOR_TEST.format(offset=1))
    result = run_pytest("-v", "-rf")
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(
        [
            "*distrank: ranks 0-63 of 64 (local) failed*",
            "E       AssertionError: assert 32640.0 == (32640 + 1)",
            "*distrank: simulated world*",
            "world size 64 simulated (local: every rank at once), in one process. Local mode "
            "runs the test once under LocalTensorMode*the numbers are those of a real run*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "FAILED test_dtensor.py::test_sharded_sum[[]ws4[]] - [[]rank ?/4[]] *assert 120.0 *",
            "FAILED test_dtensor.py::test_sharded_sum[[]ws4-local[]] - "
            "[[]ranks 0-3 of 4 (local)[]] *assert 120.0 == (120 + 1)",
            "FAILED test_dtensor.py::test_sharded_sum[[]ws64-local[]] - "
            "[[]ranks 0-63 of 64 (local)[]] *assert 32640.0 == (32640 + 1)",
        ]
    )


def test_an_op_local_mode_lacks_fails_naming_the_op(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        test_reduce="""
        import pytest, torch, torch.distributed as dist

        @pytest.mark.simulate("local", 4)
        def test_reduce(rank):
            t = torch.ones(1) * rank
            dist.reduce(t, dst=0)

        @pytest.mark.simulate("local", 4)
        def test_after(rank, world_size):
            t = torch.ones(1) * rank
            dist.all_reduce(t)
            assert t.item() == sum(range(world_size))
        """
    )
    result = run_pytest("-v", "-rf")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*::test_reduce[[]ws4-local[]] FAILED*",
            "*::test_after[[]ws4-local[]] PASSED*",
            "E*NotImplementedError: c10d.reduce_.default not implemented",
            "*distrank: simulated world*",
            "world size 4 simulated (local: every rank at once), in one process. "
            "LocalTensorMode does not implement c10d.reduce_.default, so this test cannot run in "
            "local mode*Drop 'local' from the test's simulate marker*",
        ]
    )


def test_rank_used_as_one_number_in_local_mode_is_explained(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        test_branch="""
        import pytest

        @pytest.mark.simulate("local", 4)
        def test_branch(rank):
            if rank > 0:
                pass
        """
    )
    result = run_pytest("-rf")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            ">       if rank > 0:",
            "*distrank: simulated world*",
            "*The test used `rank` as one number, which it is not in local mode*rank_map*",
        ]
    )

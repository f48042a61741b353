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
        ["*::test_world[[]ws2[]] PASSED*", "*::test_world[[]ws1024-fake[]] PASSED*"]
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
            "FAILED test_sum.py::test_sum[[]ws1024-fake[]] - *assert 1.0 == 1024",
        ]
    )


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        (
            'simulate("local", 64)',
            "*simulate('local', 64): mode 'local' is not one of 'fake'; write e.g. "
            "@pytest.mark.simulate('fake', 1024).",
        ),
        (
            'simulate("fake", 8, ranks=(8,))',
            "*rank 8 is not a rank of a world of size 8 (0 to 7).",
        ),
        ('simulate("fake")', "*simulate('fake'): give the simulated world size(s)."),
    ],
    ids=["unknown-mode", "rank-outside", "no-size"],
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

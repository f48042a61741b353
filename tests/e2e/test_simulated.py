"""End-to-end: ``@pytest.mark.simulate("fake", N)`` runs a test again in a simulated world of N
ranks, in one process, beside its real world sizes (ids ``ws<N>-fake``).

Every scenario is a file of its own in one inner session (``simulated``; ``--distrank-world-size=3``
is read by ``test_bare.py`` alone); each test below checks its scenario's lines, a failure's
explanation within that failure's section. The markers that cannot be honoured start no rank:
their session runs in-process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..helpers import RunPytest, SharedSession, failure_section

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


#: The scenarios of the shared session, one file each (``test_<name>.py``).
SCENARIOS = {
    "plan": """
import os, pytest, torch.distributed as dist

@pytest.mark.world_size(2)
@pytest.mark.simulate("fake", 1024)
def test_world(rank, world_size, pg, device):
    assert dist.get_world_size() == world_size
    assert dist.get_rank() == rank
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == (str(rank), str(world_size))
    assert device.type == "cpu"
    with open(f"seen-plan-{world_size}-{rank}-{dist.get_backend()}", "w"):
        pass
""",
    "ranks": """
import pytest

@pytest.mark.simulate("fake", 64, 1024, ranks=(0, 63))
def test_rank(rank, world_size):
    with open(f"seen-ranks-{world_size}-{rank}", "w"):
        pass
""",
    "sum": """
import pytest, torch, torch.distributed as dist

@pytest.mark.world_size(2)
@pytest.mark.simulate("fake", 1024)
def test_sum(rank, world_size, pg):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world_size
""",
    "bare": """
import pytest

@pytest.mark.world_size()
@pytest.mark.simulate("fake", 256)
def test_sizes(world_size):
    pass
""",
    "meta": """
import pytest, torch

@pytest.mark.simulate("fake", 8192, device="meta")
def test_huge(device, world_size):
    assert device.type == "meta"
    weights = torch.empty(world_size, 1 << 30, device=device)  # 32 TiB, never allocated
    assert weights.shape == (8192, 1 << 30)
""",
    "dtensor_passes": DTENSOR_TEST.format(offset=0),
    "dtensor_fails": DTENSOR_TEST.format(offset=1),
    "local": """
import pytest, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

pytestmark = pytest.mark.simulate("local", 4)

def test_reduce(rank):
    t = torch.ones(1) * rank
    dist.reduce(t, dst=0)

def test_pair_sum(rank):
    pair = dist.new_group([0, 1])  # ranks 2 and 3 are not members
    t = torch.ones(1) * (rank + 1)
    dist.all_reduce(t, group=pair)
    dist.all_reduce(t)
    assert t.item() == 20  # what LocalTensor computed; a real world gives 13

def test_without_rank_0(rank):
    trio = dist.new_group([1, 2, 3])
    t = torch.ones(1) * (rank + 1)
    dist.all_reduce(t, group=trio)

def test_world_and_mesh_dimensions(rank, world_size):
    t = torch.ones(1) * (rank + 1)
    dist.all_reduce(t, group=dist.new_group(list(range(world_size))))
    assert t.item() == 10
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    u = torch.ones(1) * (rank + 1)
    dist.all_reduce(u, group=mesh.get_group("tp"))  # rows: 1+2, 3+4
    dist.all_reduce(u, group=mesh.get_group("dp"))  # then columns: 3+7
    assert u.item() == 10
    dist.barrier(group=dist.new_group([1, 2]))  # moves no data: let through
""",
    "branch": """
import pytest

@pytest.mark.simulate("local", 4)
def test_branch(rank):
    if rank > 0:
        pass
""",
}

#: Where the shared session ran (its files, what the tests wrote).
_FOLDERS: dict[str, Path] = {}


def _write(folder: Path) -> None:
    _FOLDERS["simulated"] = folder
    for name, source in SCENARIOS.items():
        (folder / f"test_{name}.py").write_text(source)


@pytest.fixture
def simulated(shared_session: SharedSession) -> pytest.RunResult:
    return shared_session(
        "simulated", _write, "-v", "-rA", "--distrank-world-size=3", "-p", "no:warnings"
    )


def _seen(prefix: str) -> list[str]:
    return sorted(p.name for p in _FOLDERS["simulated"].glob(f"seen-{prefix}-*"))


def test_fake_world_ids_run_beside_the_real_ones(simulated: pytest.RunResult) -> None:
    simulated.stdout.fnmatch_lines(
        [
            "test_plan.py::test_world[[]ws2[]] PASSED*",
            "test_plan.py::test_world[[]ws1024-fake[]] PASSED*",
        ]
    )
    assert _seen("plan") == ["seen-plan-1024-0-fake", "seen-plan-2-0-gloo", "seen-plan-2-1-gloo"]


def test_the_summary_counts_simulated_worlds_as_pools(simulated: pytest.RunResult) -> None:
    """Simulated worlds are counted as pools of their size and mode, after the real sizes'."""
    simulated.stdout.fnmatch_lines(
        [
            "22 distributed tests; pools started: 1 at world size 2, 1 at world size 3, 1 at "
            "world size 4, 2 at world size 64 simulated (fake), 1 at world size 256 simulated "
            "(fake), 3 at world size 1024 simulated (fake), 1 at world size 8192 simulated (fake), "
            "1 at world size 4 simulated (local), 1 at world size 64 simulated (local)"
        ]
    )


def test_each_simulated_rank_is_a_test_of_its_own(simulated: pytest.RunResult) -> None:
    simulated.stdout.fnmatch_lines_random(
        [
            "test_ranks.py::test_rank[[]ws64-fake-r0[]] PASSED*",
            "test_ranks.py::test_rank[[]ws64-fake-r63[]] PASSED*",
            "test_ranks.py::test_rank[[]ws1024-fake-r0[]] PASSED*",
            "test_ranks.py::test_rank[[]ws1024-fake-r63[]] PASSED*",
        ]
    )
    assert _seen("ranks") == [
        "seen-ranks-1024-0",
        "seen-ranks-1024-63",
        "seen-ranks-64-0",
        "seen-ranks-64-63",
    ]


def test_a_value_only_real_collectives_give_fails_saying_fake_moves_no_data(
    simulated: pytest.RunResult,
) -> None:
    simulated.stdout.fnmatch_lines_random(
        [
            "test_sum.py::test_sum[[]ws2[]] PASSED*",
            "test_sum.py::test_sum[[]ws1024-fake[]] FAILED*",
            "FAILED test_sum.py::test_sum[[]ws1024-fake[]] - "
            "[[]simulated rank 0/1024[]] assert 1.0 == 1024",
        ]
    )
    failure_section(simulated.stdout.lines, "test_sum[ws1024-fake]").fnmatch_lines(
        [
            "E       assert 1.0 == 1024",
            "*distrank: simulated world*",
            "world size 1024 simulated (fake, as rank 0), in one process. Fake mode moves no "
            "data: every collective returns at once with this rank's own input*",
        ]
    )


#: Markers that cannot be honoured, one test each, in one session (no rank starts): each test
#: errors alone, naming the marker and the bad value; the plain test passes.
BAD_MARKERS = """
import pytest, torch.distributed as dist

@pytest.mark.simulate("threads", 64)
def test_unknown_mode(rank):
    pass

@pytest.mark.simulate("local", 64, ranks=(3,))
def test_local_with_ranks(rank):
    pass

@pytest.mark.simulate("fake", 8, ranks=(8,))
def test_rank_outside(rank):
    pass

@pytest.mark.simulate("fake")
def test_no_size(rank):
    pass

@pytest.mark.simulate("fake", 1024, ranks=())
def test_no_ranks():  # D3: ran in the controller, as an ordinary test, and passed
    pass

@pytest.mark.simulate("fake", 2**40)
def test_too_big(rank):  # D17: the pool's start failed with a bare TypeError
    pass

@pytest.mark.world_size(2, init_process_group=False)
@pytest.mark.simulate("fake", 8)
def test_own_group(rank, world_size):  # D13: "default process group twice!" in the fake world
    dist.init_process_group("gloo")
    dist.destroy_process_group()

@pytest.mark.world_size(2)
@pytest.mark.world_size(4)
def test_stacked(rank):  # D17: ran at one size, the other ignored without a word
    pass

@pytest.mark.world_size(2)
@pytest.mark.parametrize("n", [pytest.param(1, marks=pytest.mark.world_size(4))])
def test_param_size(rank, n):  # D17: the param's size was ignored without a word
    pass

def test_plain():
    pass
"""


def test_a_bad_marker_errors_that_test_alone_naming_it(
    pytester: pytest.Pytester, run_inprocess: RunPytest
) -> None:
    pytester.makepyfile(test_bad=BAD_MARKERS)
    result = run_inprocess("-rE")
    result.assert_outcomes(passed=1, errors=10)
    result.stdout.fnmatch_lines_random(
        [
            "*::test_unknown_mode*simulate('threads', 64): mode 'threads' is not one of 'fake', "
            "'local'; write e.g. @pytest.mark.simulate('fake', 1024).",
            "*::test_local_with_ranks*simulate('local', 64, ranks=(3,)): local mode plays every "
            "rank at once*",
            "*::test_rank_outside*rank 8 is not a rank of a world of size 8 (0 to 7).",
            "*::test_no_size*simulate('fake'): give the simulated world size(s).",
            "*::test_no_ranks: @pytest.mark.simulate('fake', 1024, ranks=()): ranks=() names no "
            "rank, so no simulated world would run*",
            f"*::test_too_big*: world size {2**40} is more than PyTorch's fake process group "
            f"takes: its size is a C int, at most {2**31 - 1}.",
            "*::test_own_group[[]ws2[]]: @pytest.mark.simulate beside "
            "@pytest.mark.world_size(2, init_process_group=False): a simulated world runs on "
            "PyTorch's fake process group*",
            "*::test_own_group[[]ws8-fake[]]: @pytest.mark.simulate beside*",
            "*::test_stacked: 2 world_size markers on the test itself: "
            "@pytest.mark.world_size(4) and @pytest.mark.world_size(2); *Keep one marker*",
            "*::test_param_size[[]1[]]: 2 world_size markers on the test itself: "
            "@pytest.mark.world_size(2) and @pytest.mark.world_size(4) (from its pytest.param)*",
        ]
    )
    result.stdout.no_fnmatch_line("*default process group twice*")


def test_a_bare_world_size_beside_simulate_takes_the_default_size(
    simulated: pytest.RunResult,
) -> None:
    simulated.stdout.fnmatch_lines_random(
        [
            "test_bare.py::test_sizes[[]ws3[]] PASSED*",
            "test_bare.py::test_sizes[[]ws256-fake[]] PASSED*",
        ]
    )


def test_meta_device_in_a_fake_world(simulated: pytest.RunResult) -> None:
    simulated.stdout.fnmatch_lines(["test_meta.py::test_huge[[]ws8192-fake[]] PASSED*"])


def test_local_mode_passes_the_numeric_test_the_real_run_passes(
    simulated: pytest.RunResult,
) -> None:
    simulated.stdout.fnmatch_lines_random(
        [
            "test_dtensor_passes.py::test_sharded_sum[[]ws4[]] PASSED*",
            "test_dtensor_passes.py::test_sharded_sum[[]ws4-local[]] PASSED*",
            "test_dtensor_passes.py::test_sharded_sum[[]ws64-local[]] PASSED*",
        ]
    )


def test_local_mode_fails_when_the_expected_value_changes(simulated: pytest.RunResult) -> None:
    failure_section(simulated.stdout.lines, "test_sharded_sum[ws64-local]").fnmatch_lines(
        [
            "*distrank: ranks 0-63 of 64 (local) failed*",
            "E       AssertionError: assert 32640.0 == (32640 + 1)",
            "*distrank: simulated world*",
            "world size 64 simulated (local: every rank at once), in one process. Local mode "
            "runs the test once under LocalTensorMode*the numbers are those of a real run*",
        ]
    )
    simulated.stdout.fnmatch_lines(
        [
            "FAILED test_dtensor_fails.py::test_sharded_sum[[]ws4[]] - [[]all 4 ranks[]] "
            "*assert 120.0 *",
            "FAILED test_dtensor_fails.py::test_sharded_sum[[]ws4-local[]] - "
            "[[]ranks 0-3 of 4 (local)[]] *assert 120.0 == (120 + 1)",
            "FAILED test_dtensor_fails.py::test_sharded_sum[[]ws64-local[]] - "
            "[[]ranks 0-63 of 64 (local)[]] *assert 32640.0 == (32640 + 1)",
        ]
    )


def test_what_local_mode_cannot_compute_fails_saying_why(simulated: pytest.RunResult) -> None:
    """An op LocalTensor lacks, and a collective on a group that is neither the world nor a
    DeviceMesh dimension (D5: a real world of 4 gives 13 for test_pair_sum's value, LocalTensor
    20, so asserting 20 passed), fail saying why; the next tests (the world, mesh dimensions,
    a barrier on a group without rank 0) compute exactly in the same pool."""
    simulated.stdout.fnmatch_lines(
        [
            "test_local.py::test_reduce[[]ws4-local[]] FAILED*",
            "test_local.py::test_pair_sum[[]ws4-local[]] FAILED*",
            "test_local.py::test_without_rank_0[[]ws4-local[]] FAILED*",
            "test_local.py::test_world_and_mesh_dimensions[[]ws4-local[]] PASSED*",
        ]
    )
    failure_section(simulated.stdout.lines, "test_reduce[ws4-local]").fnmatch_lines(
        [
            "E*NotImplementedError: c10d.reduce_.default not implemented",
            "*distrank: simulated world*",
            "world size 4 simulated (local: every rank at once), in one process. "
            "LocalTensorMode does not implement c10d.reduce_.default, so this test cannot run in "
            "local mode*Drop 'local' from the test's simulate marker*",
        ]
    )
    failure_section(simulated.stdout.lines, "test_pair_sum[ws4-local]").fnmatch_lines(
        [
            "E*LocalModeRefusal: all_reduce on the group of ranks 0, 1, which is not a DeviceMesh "
            "dimension: local mode cannot compute it exactly. In a real world ranks 2, 3 are not "
            "members*",
            "*distrank: simulated world*",
            "world size 4 simulated (local: every rank at once), in one process. Local mode "
            "refused a collective it cannot compute exactly*",
        ]
    )
    simulated.stdout.no_fnmatch_line("*assert 13*20*")
    failure_section(simulated.stdout.lines, "test_without_rank_0[ws4-local]").fnmatch_lines(
        ["E*LocalModeRefusal: all_reduce on a group without rank 0: local mode cannot*"]
    )


def test_rank_used_as_one_number_in_local_mode_is_explained(simulated: pytest.RunResult) -> None:
    simulated.stdout.fnmatch_lines(["test_branch.py::test_branch[[]ws4-local[]] FAILED*"])
    failure_section(simulated.stdout.lines, "test_branch[ws4-local]").fnmatch_lines(
        [
            ">       if rank > 0:",
            "*distrank: simulated world*",
            "*The test used `rank` as one number, which it is not in local mode*rank_map*",
        ]
    )

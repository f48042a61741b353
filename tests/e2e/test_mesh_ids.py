"""End-to-end: ``@pytest.mark.mesh`` and ``world_size(backend=(...))`` as test ids (issue #31,
item 4): ids ``ws4-dp2-tp2``, the ``mesh`` fixture (a named DeviceMesh, the same object for
every test of its pool and shape, never a leftover), one id per backend with the missing one
skipped, a simulated world with a mesh.

One inner session (``meshes``: pools at ws4, ws2 and a simulated ws1024, gloo on the CPU, under
``--distrank-leftovers=fail``) holds every scenario that runs ranks; the markers that cannot be
honoured start no rank, and their session runs in-process. Launcher mode's skip of a shape its
world does not fit is a unit test (tests/unit/test_meshes.py): a launched world costs ~10 s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_distrank.envvars import STATS_ENV

from ..helpers import RunPytest, SharedSession, failure_section

SCENARIOS = """
import pytest, torch, torch.distributed as dist
from torch.distributed.tensor import Shard, distribute_tensor

#: Per rank process: the mesh each shape's first test got (pools live across tests).
SEEN = {}


@pytest.mark.mesh({"dp": 2, "tp": 2}, {"dp": 2})
def test_mesh(rank, world_size, device, mesh):
    SEEN[mesh.mesh_dim_names] = mesh
    assert mesh.device_type == device.type == "cpu"
    assert mesh.size() == world_size and mesh.get_rank() == rank
    t = torch.ones(1) * (rank + 1)
    dist.all_reduce(t, group=mesh.get_group("dp"))
    x = distribute_tensor(torch.arange(16.0).reshape(4, 4), mesh, [Shard(0)] * mesh.ndim)
    assert x.full_tensor().sum().item() == 120
    with open(f"seen-{'x'.join(map(str, mesh.shape))}-{rank}-{t.item():g}", "w"):
        pass


@pytest.mark.mesh(dp=2, tp=2)
def test_same_mesh(mesh):
    assert mesh is SEEN[("dp", "tp")]  # made once per pool and shape
    assert mesh["tp"].size() == 2


@pytest.mark.world_size(2, backend=("gloo", "nccl"))
def test_backends(backend, device):
    assert (backend, device.type) == ("gloo", "cpu")


@pytest.mark.simulate("fake", ranks=(0, 1023))
@pytest.mark.mesh(dp=8, tp=128)
def test_simulated(rank, world_size, mesh):
    assert (world_size, mesh.shape, mesh.mesh_dim_names) == (1024, (8, 128), ("dp", "tp"))
    assert tuple(mesh.get_coordinate()) == (rank // 128, rank % 128)
"""


@pytest.fixture
def meshes(shared_session: SharedSession) -> pytest.RunResult:
    def write(folder: Path) -> None:
        (folder / "test_meshes.py").write_text(SCENARIOS)

    return shared_session(
        "meshes", write, "-v", "-rs", "-p", "no:randomly", "--distrank-leftovers=fail"
    )


def test_each_shape_is_an_id_and_the_mesh_fixture_is_its_named_mesh(
    meshes: pytest.RunResult, pytester: pytest.Pytester
) -> None:
    meshes.stdout.fnmatch_lines_random(
        [
            "*::test_mesh[[]ws4-dp2-tp2[]] PASSED*",
            "*::test_mesh[[]ws2-dp2[]] PASSED*",
            "*::test_same_mesh[[]ws4-dp2-tp2[]] PASSED*",
        ]
    )
    # all_reduce over "dp": ranks 0 and 2 (1 + 3), 1 and 3 (2 + 4) at 2x2; the world at 2.
    seen = sorted(p.name for p in pytester.path.glob("seen-*"))
    two = ["seen-2-0-3", "seen-2-1-3"]
    assert seen == [*two, "seen-2x2-0-4", "seen-2x2-1-6", "seen-2x2-2-4", "seen-2x2-3-6"]


def test_the_meshs_groups_are_not_the_tests_leftovers(meshes: pytest.RunResult) -> None:
    """--distrank-leftovers=fail fails a test that leaves a group; the mesh's are the pool's."""
    meshes.stdout.no_fnmatch_line("*left*group*")
    meshes.assert_outcomes(passed=6, skipped=1)


def test_each_backend_is_an_id_skipped_on_its_own(meshes: pytest.RunResult) -> None:
    meshes.stdout.fnmatch_lines_random(
        [
            "*::test_backends[[]ws2-gloo[]] PASSED*",
            "*::test_backends[[]ws2-nccl[]] SKIPPED*",
            "SKIPPED [[]1[]] test_meshes.py:*: backend 'nccl' is not available in this torch*",
        ]
    )


def test_a_simulated_world_takes_a_mesh(meshes: pytest.RunResult) -> None:
    meshes.stdout.fnmatch_lines_random(
        [
            "*::test_simulated[[]ws1024-dp8-tp128-fake-r0[]] PASSED*",
            "*::test_simulated[[]ws1024-dp8-tp128-fake-r1023[]] PASSED*",
        ]
    )


BAD = """
import pytest

@pytest.mark.mesh(dp=2, tp=0)
def test_zero(mesh):
    pass

@pytest.mark.mesh("dp2-dp2")
def test_dim_twice(mesh):
    pass

@pytest.mark.mesh({"dp": 2}, {"dp": 2})
def test_shape_twice(mesh):
    pass

@pytest.mark.world_size(2)
@pytest.mark.mesh(dp=2, tp=2)
def test_disagree(mesh):
    pass

@pytest.mark.world_size(2, backend=("gloo", "glo"))
def test_backend_typo(rank):
    pass

def test_plain():
    pass
"""


def test_bad_input_errors_that_test_alone_naming_what_is_wrong(
    pytester: pytest.Pytester, run_inprocess: RunPytest
) -> None:
    pytester.makepyfile(test_bad=BAD)
    result = run_inprocess("-rE", "-p", "no:randomly")
    result.assert_outcomes(passed=1, errors=5)
    result.stdout.fnmatch_lines_random(
        [
            "*::test_zero: @pytest.mark.mesh(dp=2, tp=0): shape {'dp': 2, 'tp': 0}: dimension "
            "'tp' has size 0, not a positive integer*",
            "*::test_dim_twice: @pytest.mark.mesh('dp2-dp2'): shape 'dp2-dp2': dimension 'dp' "
            "given twice.",
            "*::test_shape_twice: *: shape dp2 given twice.",
            "*::test_disagree: @pytest.mark.mesh(dp=2, tp=2) beside @pytest.mark.world_size(2): "
            "world size 2 fits no shape (dp2-tp2: 4 ranks).",
            "*::test_backend_typo: *: unknown backend 'glo'; expected one of*",
        ]
    )
    lines = result.stdout.lines
    failure_section(lines, "ERROR at setup of test_zero").no_fnmatch_line("*Traceback*")


def test_the_mesh_fixture_without_a_shape_names_the_marker(
    pytester: pytest.Pytester, run_inprocess: RunPytest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error before any rank starts (the controller's plan), not in every rank: no pool
    starts, so it runs in-process."""
    stats = pytester.path / "stats.json"
    monkeypatch.setenv(STATS_ENV, str(stats))
    pytester.makepyfile(
        test_no_shape="""
import pytest

@pytest.mark.world_size(2)
def test_no_shape(mesh):
    pass
"""
    )
    result = run_inprocess("--distrank-replay=off", "-p", "no:randomly")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*test_no_shape uses the fixture 'mesh', which needs a shape: add "
            "@pytest.mark.mesh(dp=2, tp=2)*"
        ]
    )
    assert json.loads(stats.read_text())["pools"] == []

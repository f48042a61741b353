"""Unit: what local mode refuses to compute (pool/simulate.py's ``refusal``), D5 of #24.

LocalTensor runs a subgroup collective on every copy of the group shifted across the world, as a
DeviceMesh dimension means; a ``new_group`` of some ranks run that way gives numbers no real world
gives (a real world of 4 reduces ``[1, 2, 3, 4]`` over ``new_group([0, 1])`` then the world to
13, LocalTensor to 20). The end-to-end refusal is in tests/e2e/test_simulated.py.
"""

from __future__ import annotations

import pytest

from pytest_distrank.pool.worker.simulate import refusal


@pytest.mark.parametrize(
    ("op", "ranks", "mesh_dim"),
    [
        ("all_reduce", [0, 1, 2, 3], False),  # the world, or a group of every rank
        ("all_reduce", [0, 1], True),  # a DeviceMesh dimension
        ("all_gather_into_tensor", [0, 2], True),
        ("barrier", None, False),  # moves no data: skipping it changes no number
        ("monitored_barrier", None, False),
    ],
)
def test_what_local_mode_computes_exactly_is_not_refused(
    op: str, ranks: list[int] | None, mesh_dim: bool
) -> None:
    assert refusal(op, ranks, 4, mesh_dim) == ""


def test_a_subgroup_that_is_no_mesh_dimension_is_refused_naming_it() -> None:
    why = refusal("all_reduce", [0, 1], 4, False)
    assert why.startswith(
        "all_reduce on the group of ranks 0, 1, which is not a DeviceMesh dimension: local mode "
        "cannot compute it exactly. In a real world ranks 2, 3 are not members: the collective "
        "is skipped there. LocalTensor would run it on them too"
    )
    assert why.endswith(
        "Check this test at a real world size (world_size marker), or make the group a "
        "DeviceMesh dimension."
    )


def test_a_group_without_the_process_rank_is_refused() -> None:
    why = refusal("all_reduce", None, 4, False)
    assert why.startswith(
        "all_reduce on a group without rank 0: local mode cannot compute it exactly. It plays "
        "every rank in one process, which is rank 0 to torch"
    )
    assert "GroupMember.NON_GROUP_MEMBER" in why

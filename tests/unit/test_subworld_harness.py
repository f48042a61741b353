"""Unit tests of PyTorch's harness classes under a launcher (launch/harness.py, the home sub-worlds
of launch/subworld.py and plan.place): where such a test runs, what is skipped and why, and the
environment its code sees.

Which ranks a harness test runs on decides its GPU (``set_device_index(rank)``) and whether its
peers find their rendezvous file: a property over random launched worlds, with local ranks in any
order on each node. tests/e2e/test_subworlds.py runs the classes on two torchrun agents.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from pytest_distrank.launch.env import Launch
from pytest_distrank.launch.harness import child_env
from pytest_distrank.launch.plan import Step, place
from pytest_distrank.launch.subworld import home_slots


@st.composite
def worlds(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    """A launched world: each rank's node and local rank (a node's local ranks are 0..n-1, in
    any order of launched ranks, and a node's ranks need not be contiguous)."""
    sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=4))
    ranks = [(node, local) for node, size in enumerate(sizes) for local in range(size)]
    ranks = draw(st.permutations(ranks))
    return [node for node, _ in ranks], [local for _, local in ranks]


def test_a_node_of_two_ranks_is_home_to_a_pair_and_to_a_single() -> None:
    nodes, local = [0, 0, 1, 1], [0, 1, 0, 1]
    assert home_slots(nodes, local, 2) == [(0, 1), (2, 3)]
    assert home_slots(nodes, local, 1) == [(0,), (2,)]  # local rank 0: cuda:0
    assert home_slots(nodes, local, 3) == []


def test_home_follows_local_ranks_not_the_launched_order() -> None:
    # A launcher that numbers node 1's ranks backwards: rank 3 is its local rank 0.
    assert home_slots([0, 0, 1, 1], [0, 1, 1, 0], 2) == [(0, 1), (3, 2)]


@given(worlds(), st.integers(1, 6))
def test_a_home_sub_world_is_one_nodes_local_ranks_from_0(
    world: tuple[list[int], list[int]], k: int
) -> None:
    nodes, local = world
    slots = home_slots(nodes, local, k)
    for slot in slots:
        assert len(slot) == k
        assert len({nodes[r] for r in slot}) == 1  # the rendezvous file is on its node
        assert [local[r] for r in slot] == list(range(k))  # rank i is cuda:i
    assert len({nodes[slot[0]] for slot in slots}) == len(slots)  # one per node: no GPU shared
    big_enough = {node for node in nodes if nodes.count(node) >= k}
    assert len(slots) == len(big_enough)  # every node that holds k ranks is used
    if slots and any(0 in slot for slot in slots):
        assert 0 in slots[0]  # the launched rank 0 runs a batch's first test


def test_place_puts_harness_tests_on_home_sub_worlds_and_skips_what_no_node_holds() -> None:
    steps = [
        Step("sub", backend="gloo", size=2, group="harness"),
        Step("sub", backend="gloo", size=2),
        Step("sub", backend="gloo", size=4, group="harness"),
        Step("sub", backend="gloo", size=2, group="harness"),
    ]
    nodes = [0, 0, 0, 0, 1, 1]
    placed, order = place(steps, nodes, [0, 1, 2, 3, 0, 1])
    assert order == [0, 3, 1, 2]  # the harness pairs together, apart from the plugin's pair
    worlds = [step.world for step in placed]
    assert worlds[0] is not None and worlds[3] is not None and worlds[1] is not None
    assert (worlds[0].members, worlds[3].members) == ((0, 1), (4, 5))  # two at once
    assert worlds[0].batch == worlds[3].batch != worlds[1].batch
    assert placed[2].world is not None and placed[2].world.members == (0, 1, 2, 3)
    placed, _ = place(steps, [0, 0, 1, 1], [0, 1, 0, 1])
    assert placed[2].kind == "skip"
    assert "of world size 4 runs on the ranks of one node" in placed[2].reason
    assert "at most 2 ranks" in placed[2].reason
    assert placed[1].world is not None and not placed[1].home


def _launch(variables: tuple[str, ...]) -> Launch:
    return Launch("slurm", 0, 4, 0, None, "h", 1, False, 0, variables)


def test_the_harness_child_sees_no_launcher_variable() -> None:
    env = {
        "RANK": "3", "LOCAL_RANK": "1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x",
        "GROUP_RANK": "1", "OMPI_COMM_WORLD_RANK": "3", "SLURM_PROCID": "3", "MY_FLAG": "1",
        "PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_ID": "7",
    }  # fmt: skip
    assert child_env(env, _launch(("SLURM_PROCID",))) == {
        "MY_FLAG": "1", "PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_ID": "7",
    }  # fmt: skip


def test_the_launchers_own_variables_go_whatever_their_names() -> None:
    launch = dataclasses.replace(_launch(("MY_RANK", "MY_SIZE")), launcher="mpi")
    assert child_env({"MY_RANK": "1", "MY_SIZE": "2", "KEEP": "k"}, launch) == {"KEEP": "k"}

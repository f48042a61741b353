"""Process sub-groups: new_group over a subset of ranks, new_subgroups, collectives inside them.

Rules these tests demonstrate:

* ``dist.new_group(ranks)`` is collective over the WORLD: every rank calls it, in the same order,
  even the ranks that are not in ``ranks``. Those get ``GroupMember.NON_GROUP_MEMBER`` back.
* A collective on a group involves only its members; a non-member that calls it gets a warning
  and nothing happens (the tensor is left as it was).
* ``src``/``dst`` are global ranks; ``group_src``/``group_dst`` are ranks inside the group.

Groups live as long as the process; the rank processes are reused across tests, so the
``new_group`` fixture below destroys the groups a test made when the test ends.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

WORLD_SIZES = (2, 3, 4)


def is_member(group) -> bool:
    return group is not None and group != dist.GroupMember.NON_GROUP_MEMBER


@pytest.fixture
def new_group(pg):
    """``dist.new_group`` that destroys, at teardown, the groups this rank is a member of."""
    made = []

    def make(ranks):
        group = dist.new_group(ranks=list(ranks))
        made.append(group)
        return group

    yield make
    for group in made:
        if is_member(group):
            dist.destroy_process_group(group)


@pytest.mark.world_size(*WORLD_SIZES)
def test_new_group_without_rank0(rank, world_size, new_group):
    """Group = ranks 1..n-1; rank 0 is outside it and must still call new_group."""
    members = list(range(1, world_size))
    group = new_group(members)
    t = torch.tensor([rank + 1.0])
    if rank == 0:
        assert group == dist.GroupMember.NON_GROUP_MEMBER
        assert dist.get_rank(group) == -1
    else:
        assert dist.get_rank(group) == rank - 1  # group ranks are 0..len-1, in order
        assert dist.get_world_size(group) == world_size - 1
        assert dist.get_process_group_ranks(group) == members
        dist.all_reduce(t, group=group)
        # sum of r + 1 over r = 1..n-1
        assert t.item() == world_size * (world_size + 1) / 2 - 1
    # the world still works for everybody afterwards, rank 0 included
    w = torch.tensor([1])
    dist.all_reduce(w)
    assert w.item() == world_size


@pytest.mark.world_size(*WORLD_SIZES)
def test_non_member_call_is_a_noop_with_warning(rank, world_size, new_group):
    """A rank outside the group that calls a collective on it: warning, no effect, no hang."""
    group = new_group([world_size - 1])  # a group of one: the last rank
    t = torch.tensor([float(rank)])
    if rank == world_size - 1:
        dist.all_reduce(t, group=group)  # a one-member all_reduce leaves the value as it is
        assert t.item() == world_size - 1
    else:
        with pytest.warns(UserWarning, match="does not belong to the given group"):
            work = dist.all_reduce(t, group=group)
        assert work is None
        assert t.item() == float(rank)


@pytest.mark.world_size(*WORLD_SIZES)
def test_even_and_odd_groups(rank, world_size, new_group):
    """Two disjoint groups, both created by every rank; each rank talks inside its own."""
    evens = new_group(range(0, world_size, 2))
    odds = new_group(range(1, world_size, 2))
    mine = evens if rank % 2 == 0 else odds
    other = odds if rank % 2 == 0 else evens
    assert is_member(mine)
    assert not is_member(other)

    t = torch.tensor([rank], dtype=torch.int64)
    dist.all_reduce(t, group=mine)
    assert t.item() == sum(range(rank % 2, world_size, 2))

    # group rank <-> global rank
    assert dist.get_group_rank(mine, rank) == rank // 2
    assert dist.get_global_rank(mine, 0) == rank % 2

    # broadcast from the group's first member, named by its group rank ...
    b = torch.tensor([100 + rank])
    dist.broadcast(b, group=mine, group_src=0)
    assert b.item() == 100 + rank % 2
    # ... and from the group's last member, named by its global rank
    last = max(range(rank % 2, world_size, 2))
    c = torch.tensor([rank * 7])
    dist.broadcast(c, src=last, group=mine)
    assert c.item() == last * 7


@pytest.mark.world_size(*WORLD_SIZES)
def test_collectives_inside_a_group(rank, world_size, new_group):
    """all_gather, gather and object collectives within the group {0, n-1}."""
    members = [0, world_size - 1]
    group = new_group(members)
    if rank not in members:
        assert not is_member(group)
        return
    out = [torch.zeros(2, dtype=torch.int64) for _ in members]
    dist.all_gather(out, torch.tensor([rank, rank * rank]), group=group)
    assert [o.tolist() for o in out] == [[0, 0], [world_size - 1, (world_size - 1) ** 2]]

    # gather to the group's second member (group rank 1 == global rank n-1)
    gathered = [torch.zeros(1) for _ in members] if rank == world_size - 1 else None
    dist.gather(torch.tensor([rank + 0.5]), gathered, group=group, group_dst=1)
    if rank == world_size - 1:
        assert [g.item() for g in gathered] == [0.5, world_size - 0.5]

    objects = [None, None]
    dist.all_gather_object(objects, f"hello from {rank}", group=group)
    assert objects == ["hello from 0", f"hello from {world_size - 1}"]


@pytest.mark.world_size(2, 4)
def test_new_subgroups_of_two(rank, world_size, pg):
    """new_subgroups(2) cuts the world into consecutive pairs {0,1}, {2,3}, ...

    The world size must be a multiple of the group size, hence no world size 3.
    """
    current, subgroups = dist.new_subgroups(group_size=2)
    try:
        assert len(subgroups) == world_size // 2
        first = 2 * (rank // 2)
        assert dist.get_process_group_ranks(current) == [first, first + 1]
        assert dist.get_rank(current) == rank % 2

        t = torch.tensor([rank + 1.0])
        dist.all_reduce(t, group=current)
        assert t.item() == (first + 1) + (first + 2)

        mx = torch.tensor([rank])
        dist.all_reduce(mx, op=dist.ReduceOp.MAX, group=current)
        assert mx.item() == first + 1
    finally:
        dist.destroy_process_group(current)


@pytest.mark.world_size(*WORLD_SIZES)
def test_new_subgroups_by_enumeration(rank, world_size, pg):
    """Mirror pairs {r, n-1-r}: {0,1} for n=2; {0,2},{1} for n=3; {0,3},{1,2} for n=4."""
    pairs = [sorted({r, world_size - 1 - r}) for r in range((world_size + 1) // 2)]
    current, subgroups = dist.new_subgroups_by_enumeration(ranks_per_subgroup_list=pairs)
    try:
        assert len(subgroups) == len(pairs)
        partner = world_size - 1 - rank
        assert dist.get_process_group_ranks(current) == sorted({rank, partner})
        t = torch.tensor([rank + 1])
        dist.all_reduce(t, group=current)
        # a pair sums to (r + 1) + (n - r) = n + 1; the middle rank of an odd world is alone
        assert t.item() == (rank + 1 if partner == rank else world_size + 1)
    finally:
        dist.destroy_process_group(current)


@pytest.mark.world_size(3, 4)
def test_interleaved_group_and_world_collectives(rank, world_size, new_group):
    """Collectives on different groups can alternate as long as each group's members agree."""
    head = new_group([0, 1])
    totals = []
    for step in range(3):
        if rank in (0, 1):
            h = torch.tensor([step * 10 + rank])
            dist.all_reduce(h, group=head)
            assert h.item() == 2 * step * 10 + 1
        w = torch.tensor([step + rank])
        dist.all_reduce(w)
        totals.append(w.item())
    n = world_size
    assert totals == [n * step + n * (n - 1) // 2 for step in range(3)]

"""The test files of the launched world of ``test_subworlds.py`` (texts only: no tests here).

Read by the outer pytest process of the e2e tests; the inner sessions run the files these texts
become. Each text says what it checks.
"""

from __future__ import annotations

from .test_existing_suites import CONTINUOUS
from .test_launch import HEADER

#: What an ordinary test (rank 0 alone) sees first in a file: the launcher's variables (read at
#: collection) and no default group; whatever sub-world test ran before it (hostile pass M1).
PLAIN = """
LAUNCHED = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                           "TORCHELASTIC_USE_AGENT_STORE")}

def _as_first_in_the_file():
    seen = {k: os.environ.get(k) for k in LAUNCHED}
    assert (seen, dist.is_initialized()) == (LAUNCHED, False), "a sub-world's leftovers"
"""

#: The sizes of the launched world: what runs on one rank, a node, more than a node, all; an
#: ordinary test after a sub-world's.
MIX = (
    HEADER
    + PLAIN
    + """
@pytest.mark.world_size(1)
@pytest.mark.parametrize("i", range(2))
def test_one(i, rank, world_size, pg):
    t = torch.ones(1)
    dist.all_reduce(t)  # the default group is the sub-world's
    assert (rank, world_size, dist.get_world_size(), t.item()) == (0, 1, 1, 1.0)
    assert os.environ["WORLD_SIZE"] == "1" and os.environ["RANK"] == "0"

@pytest.mark.world_size(3)
def test_three(rank, world_size, device):
    t = torch.ones(1, device=device)
    dist.all_reduce(t)
    assert (world_size, t.item()) == (3, 3.0)

def test_plain_after_three():
    _as_first_in_the_file()

@pytest.mark.world_size(4)
def test_four(rank, world_size, pg):
    t = torch.ones(1)
    dist.all_reduce(t, group=pg)
    assert (world_size, t.item(), os.environ["WORLD_SIZE"]) == (4, 4.0, "4")

def test_plain():
    pass

@pytest.mark.world_size(2)
def test_two(rank, world_size, dist_store):
    t = torch.ones(1) * (rank + 1)
    dist.all_reduce(t)
    assert (world_size, t.item()) == (2, 3.0)
    dist_store.set(f"k{rank}", "v")
    assert dist_store.get(f"k{1 - rank}") == b"v"  # the test's own key space, its own peer

@pytest.mark.world_size(2)
def test_two_fails_on_its_rank_1(rank):
    assert rank == 0, f"rank {rank} of the pair disagrees"
"""
)

#: Four tests of 2 ranks that sleep: two at a time in a launched world of 4.
SLEEP = 3.0
SLEEPERS = (
    HEADER
    + f"""
@pytest.mark.world_size(2)
@pytest.mark.parametrize("i", range(4))
def test_sleep(i, rank):
    start = time.time()
    time.sleep({SLEEP})
    here = os.path.dirname(__file__)
    with open(os.path.join(here, f"sleep{{i}}-{{rank}}.times"), "w") as out:
        out.write(f"{{start}} {{time.time()}}")
"""
)

#: The session seed of the launched world (``--distrank-seed``).
SEED = 4242

#: Two pairs at once; the second runs on launched ranks 2 and 3 and draws what a pool's ranks 0
#: and 1 draw (the seed is the sub-world rank's: the printed rerun puts it on ranks 0 and 1).
#: Then two pairs at once re-initialise their default group from the environment (env://).
SEEDED = (
    f"{HEADER}from pytest_distrank.rank.seeding import seed_of\n"
    + f"""
@pytest.mark.parametrize("i", [0, 1])
@pytest.mark.world_size(2)
def test_seeded_as_in_a_pool(i, rank, request):
    got = torch.randint(0, 2**30, (1,)).item()
    mine = torch.Generator().manual_seed(seed_of({SEED}, request.node.nodeid, rank, "call"))
    assert got == torch.randint(0, 2**30, (1,), generator=mine).item(), "another rank's seed"

@pytest.mark.world_size(2)
@pytest.mark.parametrize("val", [10, 1000])
def test_reinit_from_the_environment(val, rank):
    dist.destroy_process_group()
    dist.init_process_group("gloo")  # env://: each pair meets its own ranks only
    t = torch.tensor([float(val)])
    dist.all_reduce(t)
    assert (dist.get_world_size(), t.item()) == (2, 2.0 * val)
    dist.destroy_process_group()
"""
)

#: Tests that make their own group (``init_process_group=False``): no group of the plugin's, the
#: sub-world's RANK, WORLD_SIZE and MASTER_ADDR:MASTER_PORT (a port of its own per test: two pairs
#: at once, then a pair after a pair that left its group up), and at the launched size too (it
#: leaves its group up); an ordinary test after them.
OWN = (
    HEADER
    + PLAIN
    + """
def _own_world(rank, size):
    assert not dist.is_initialized()  # the plugin made no group
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == (str(rank), str(size))
    dist.init_process_group("gloo")  # env://
    t = torch.ones(1) * (rank + 1)
    dist.all_reduce(t)
    assert (dist.get_world_size(), t.item()) == (size, size * (size + 1) / 2)

@pytest.mark.world_size(2, init_process_group=False)
@pytest.mark.parametrize("i", range(2))
def test_own_pair(i, rank, world_size):
    _own_world(rank, world_size)
    dist.destroy_process_group()

@pytest.mark.world_size(2, init_process_group=False)
def test_own_left_up(rank):
    _own_world(rank, 2)  # the plugin destroys what the test left

@pytest.mark.world_size(2, init_process_group=False)
def test_own_fails_on_rank_1(rank):
    _own_world(rank, 2)
    assert rank == 0, f"rank {rank} of the own pair disagrees"

@pytest.mark.world_size(2, init_process_group=False)
def test_own_asks_for_pg(pg):
    pass

@pytest.mark.world_size(1, init_process_group=False)
def test_own_one(rank):
    _own_world(rank, 1)

@pytest.mark.world_size(4, init_process_group=False)
def test_own_four(rank):
    _own_world(rank, 4)

def test_plain_after_own():
    _as_first_in_the_file()
"""
)

#: A module fixture on the group whose teardown runs a collective keeps the module's sub-world
#: tests out (a sub-world would tear it down on some of its ranks only: a deadlock).
WIDE = (
    HEADER
    + """
@pytest.fixture(scope="module")
def modfix(rank):
    yield rank
    dist.barrier()

@pytest.mark.world_size(2)
def test_wide_two(modfix):
    pass
"""
)

#: A pair deadlocks (its rank 1 waits in a barrier its rank 0 never enters) beside a pair that
#: passes; the run ends after their batch: a rank stuck in its test cannot be taken out of it.
HANG = (
    HEADER
    + """
@pytest.mark.world_size(2)
@pytest.mark.timeout(60)
def test_z_deadlock(rank):
    if rank == 1:
        dist.barrier()

@pytest.mark.world_size(2)
def test_z_beside(rank):
    time.sleep(0.5)

@pytest.mark.world_size(4)
def test_z_after(rank):
    pass
"""
)


#: PyTorch's harness classes, unmodified: a MultiProcessTestCase, a MultiProcContinuousTest, a
#: DTensorTestBase and an FSDPTest of 2 ranks (each on one node's local ranks 0 and 1, two at a
#: time), and one of 4, which no node of 2 ranks can hold.
#: Collected first: the pairs of the other files, the deadlocked one among them, run as one run
#: of batches, after which the run ends.
HARNESS = (
    CONTINUOUS
    + """
import os
import unittest

from torch.distributed.tensor import Shard, distribute_tensor
from torch.testing._internal.common_distributed import MultiProcessTestCase
from torch.testing._internal.common_fsdp import FSDPTest
from torch.testing._internal.distributed._tensor.common_dtensor import DTensorTestBase, with_comms

LAUNCHER = ("RANK", "LOCAL_RANK", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GROUP_RANK")


class Pairs(MultiProcessTestCase):
    world_size = 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_sum(self):
        assert [name for name in LAUNCHER if name in os.environ] == []  # the harness's child's
        dist.init_process_group(
            "gloo", init_method=f"file://{self.file_name}", rank=self.rank, world_size=2
        )
        t = torch.ones(1) * (self.rank + 1)
        dist.all_reduce(t)
        dist.destroy_process_group()
        self.assertEqual(t.item(), 3.0)

    def test_fails_on_rank_1(self):
        self.assertEqual(self.rank, 0)

    def test_skips(self):
        raise unittest.SkipTest("not on this machine")


class Continuous(ContinuousBase):
    def test_a(self):
        t = torch.ones(1)
        dist.all_reduce(t)  # the class's own group, kept from its _init_pg
        self.assertEqual((t.item(), dist.get_world_size()), (2.0, 2))

    def test_b(self):
        dist.barrier()
        self.assertEqual(dist.get_rank(), self.rank)


class Mesh(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    @with_comms
    def test_shard(self):
        t = distribute_tensor(torch.arange(4.0), self.build_device_mesh(), [Shard(0)])
        self.assertEqual((t.to_local().numel(), t.full_tensor().sum().item()), (2, 6.0))


class Sharded(FSDPTest):  # on CPU its _run exits with the "multi-gpu-2" skip code
    @property
    def world_size(self):
        return 2

    def test_fully_shard(self):
        from torch.distributed.fsdp import fully_shard

        fully_shard(torch.nn.Linear(4, 4))(torch.ones(2, 4)).sum().backward()


class Quads(MultiProcessTestCase):
    world_size = 4

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_four(self):
        pass
"""
)

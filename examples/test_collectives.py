"""Tensor collectives and point-to-point communication on the default (world) group.

Every test runs on 2, 3 and 4 ranks of a gloo process group on CPU. Each rank builds its input
from its ``rank`` so that the expected result can be written down by hand (sums of ranks,
factorials, rank-dependent patterns), and asserts it exactly. The ``pg`` fixture is the default
group: the collectives below use it implicitly, and a test that asks for it documents that it
needs one.

Rank ``r`` of ``n`` contributes ``r + 1`` unless said otherwise, so a SUM is ``n (n + 1) / 2``, a
PRODUCT is ``n!``, a MIN is ``1`` and a MAX is ``n``.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

WORLD_SIZES = (2, 3, 4)
DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64]
DTYPE_IDS = ["float32", "float64", "int32", "int64"]


def tri(n: int) -> int:
    """1 + 2 + ... + n."""
    return n * (n + 1) // 2


# -- the fixtures ----------------------------------------------------------------------------------


@pytest.mark.world_size(*WORLD_SIZES)
def test_fixtures_describe_this_rank(rank, world_size, local_rank, backend, device, pg):
    """What the plugin's fixtures hold, checked against torch.distributed itself."""
    assert 0 <= rank < world_size
    assert (dist.get_rank(), dist.get_world_size()) == (rank, world_size)
    assert local_rank == rank  # all ranks run on this one machine
    assert backend == dist.get_backend(pg) == "gloo"
    assert device == torch.device("cpu")
    assert pg is dist.group.WORLD
    everyone = [None] * world_size
    dist.all_gather_object(everyone, rank)
    assert everyone == list(range(world_size))  # every rank number exactly once


# -- all_reduce ------------------------------------------------------------------------------------


@pytest.mark.world_size(*WORLD_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_all_reduce_sum(rank, world_size, pg, dtype):
    t = torch.tensor([rank + 1, 10 * (rank + 1), -(rank + 1)], dtype=dtype)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    n = tri(world_size)
    assert t.dtype == dtype
    assert t.tolist() == [n, 10 * n, -n]


@pytest.mark.world_size(*WORLD_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_all_reduce_product(rank, world_size, pg, dtype):
    t = torch.tensor([rank + 1, -1], dtype=dtype)
    dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
    assert t.tolist() == [math.factorial(world_size), (-1) ** world_size]


@pytest.mark.world_size(*WORLD_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_all_reduce_min_max(rank, world_size, pg, dtype):
    values = [rank + 1, -(rank + 1), 7]
    low = torch.tensor(values, dtype=dtype)
    high = torch.tensor(values, dtype=dtype)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    assert low.tolist() == [1, -world_size, 7]
    assert high.tolist() == [world_size, -1, 7]


@pytest.mark.world_size(*WORLD_SIZES)
def test_all_reduce_avg(rank, world_size, pg, backend):
    """ReduceOp.AVG: NCCL has it; whether gloo does depends on the torch release (torch 2.13's
    gloo does). Where the backend refuses it, the test skips and says why.

    There is no separate probe: the call is the real collective. An unsupported op is refused
    by every rank before any communication, so all ranks skip together.
    """
    t = torch.tensor([float(rank), 2.0 * rank + 1.0])
    try:
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
    except (RuntimeError, ValueError) as exc:
        if "AVG" not in str(exc) and "not supported" not in str(exc).lower():
            raise
        pytest.skip(
            f"ReduceOp.AVG is not supported by the {backend!r} backend in torch "
            f"{torch.__version__}: {str(exc).splitlines()[0]}"
        )
    # mean of 0..n-1 is (n - 1) / 2, mean of 1, 3, ..., 2n - 1 is n
    assert t.tolist() == [(world_size - 1) / 2, float(world_size)]


@pytest.mark.world_size(*WORLD_SIZES)
def test_all_reduce_bitwise(rank, world_size, pg):
    """BAND/BOR/BXOR on integers: rank r contributes the bit 1 << r, plus bit 4 for BAND."""
    bit = 1 << rank
    t_or = torch.tensor([bit], dtype=torch.int64)
    t_and = torch.tensor([bit | 0b10000], dtype=torch.int64)
    t_xor = torch.tensor([0b1], dtype=torch.int64)
    dist.all_reduce(t_or, op=dist.ReduceOp.BOR)
    dist.all_reduce(t_and, op=dist.ReduceOp.BAND)
    dist.all_reduce(t_xor, op=dist.ReduceOp.BXOR)
    assert t_or.item() == (1 << world_size) - 1  # every rank's bit
    assert t_and.item() == 0b10000  # only the bit all ranks share
    assert t_xor.item() == world_size % 2  # 1 xor 1 xor ... (n times)


# -- one-to-all and all-to-one ---------------------------------------------------------------------


@pytest.mark.world_size(*WORLD_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_broadcast_from_every_rank(rank, world_size, pg, dtype):
    for src in range(world_size):
        t = torch.tensor([100 * rank + 1, rank], dtype=dtype)
        dist.broadcast(t, src=src)
        assert t.tolist() == [100 * src + 1, src]


@pytest.mark.world_size(*WORLD_SIZES)
def test_reduce_to_last_rank(rank, world_size, pg):
    """Only the destination's tensor is defined after reduce; other ranks must not read theirs."""
    dst = world_size - 1
    t = torch.tensor([rank + 1.0, 1.0])
    dist.reduce(t, dst=dst, op=dist.ReduceOp.SUM)
    if rank == dst:
        assert t.tolist() == [tri(world_size), world_size]


@pytest.mark.world_size(*WORLD_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_all_gather(rank, world_size, pg, dtype):
    mine = torch.tensor([rank, rank * rank], dtype=dtype)
    out = [torch.full((2,), -1, dtype=dtype) for _ in range(world_size)]
    dist.all_gather(out, mine)
    assert [o.tolist() for o in out] == [[r, r * r] for r in range(world_size)]


@pytest.mark.world_size(*WORLD_SIZES)
def test_all_gather_single(rank, world_size, pg):
    """One flat output tensor instead of a list: rank r's block is at [2r, 2r + 2)."""
    # torch 2.13 deprecates all_gather_into_tensor in favour of all_gather_single.
    gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    mine = torch.tensor([rank, -rank], dtype=torch.int64)
    out = torch.empty(2 * world_size, dtype=torch.int64)
    gather_single(out, mine)
    assert out.tolist() == [v for r in range(world_size) for v in (r, -r)]


@pytest.mark.world_size(*WORLD_SIZES)
def test_all_gather_into_tensor_deprecated_name(rank, world_size, pg):
    """The old name still works, with a FutureWarning; a (world_size, 2) view of the flat
    output gives one row per rank.

    (The "stacked" output form, an output of shape (world_size, *shape), is NCCL-only: gloo
    raises "invalid tensor size". Gathering into a flat buffer and viewing it works everywhere.)
    """
    mine = torch.tensor([rank, rank + 10], dtype=torch.float64)
    flat = torch.empty(2 * world_size, dtype=torch.float64)
    if hasattr(dist, "all_gather_single"):
        with pytest.warns(FutureWarning, match="all_gather_into_tensor"):
            dist.all_gather_into_tensor(flat, mine)
    else:
        dist.all_gather_into_tensor(flat, mine)
    assert flat.view(world_size, 2).tolist() == [[float(r), r + 10.0] for r in range(world_size)]


@pytest.mark.world_size(*WORLD_SIZES)
def test_gather_to_rank0(rank, world_size, pg):
    """Only the destination passes a gather_list; the others pass None."""
    mine = torch.tensor([rank * 3, rank * 3 + 1], dtype=torch.int32)
    gather_list = (
        [torch.zeros(2, dtype=torch.int32) for _ in range(world_size)] if rank == 0 else None
    )
    dist.gather(mine, gather_list, dst=0)
    if rank == 0:
        assert [g.tolist() for g in gather_list] == [[3 * r, 3 * r + 1] for r in range(world_size)]


@pytest.mark.world_size(*WORLD_SIZES)
def test_scatter_from_last_rank(rank, world_size, pg):
    src = world_size - 1
    out = torch.full((3,), -1.0)
    scatter_list = (
        [torch.tensor([float(r), r * 0.5, 42.0]) for r in range(world_size)]
        if rank == src
        else None
    )
    dist.scatter(out, scatter_list, src=src)
    assert out.tolist() == [float(rank), rank * 0.5, 42.0]


# -- reduce-scatter and all-to-all -----------------------------------------------------------------


@pytest.mark.world_size(*WORLD_SIZES)
def test_reduce_scatter(rank, world_size, pg):
    """Rank s sends 10 s + d to rank d; rank d receives the sum over s: 10 n(n-1)/2 + n d."""
    inputs = [torch.tensor([10 * rank + d, 1], dtype=torch.int64) for d in range(world_size)]
    out = torch.zeros(2, dtype=torch.int64)
    try:
        dist.reduce_scatter(out, inputs, op=dist.ReduceOp.SUM)
    except RuntimeError as exc:
        if "reduce_scatter" not in str(exc):
            raise
        pytest.skip(f"reduce_scatter is not supported by this backend: {exc}")
    n = world_size
    assert out.tolist() == [10 * n * (n - 1) // 2 + n * rank, n]


@pytest.mark.world_size(*WORLD_SIZES)
def test_reduce_scatter_single(rank, world_size, pg):
    """Flat form: rank d receives the SUM of block d of every rank's input."""
    # torch 2.13 deprecates reduce_scatter_tensor in favour of reduce_scatter_single.
    rs_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    # block d of rank s holds [s, d]
    inp = torch.tensor([v for d in range(world_size) for v in (rank, d)], dtype=torch.float32)
    out = torch.zeros(2)
    rs_single(out, inp, op=dist.ReduceOp.SUM)
    assert out.tolist() == [world_size * (world_size - 1) / 2, float(world_size * rank)]


@pytest.mark.world_size(*WORLD_SIZES)
def test_reduce_scatter_max(rank, world_size, pg):
    """Any reduce op works: MAX of (s + d) % n over s is n - 1 for every d."""
    inputs = [torch.tensor([float((rank + d) % world_size)]) for d in range(world_size)]
    out = torch.zeros(1)
    dist.reduce_scatter(out, inputs, op=dist.ReduceOp.MAX)
    assert out.item() == world_size - 1


@pytest.mark.world_size(*WORLD_SIZES)
def test_all_to_all_list(rank, world_size, pg):
    """Rank s sends 10 s + d to rank d, so rank d receives [10 s + d for s in ranks]."""
    inputs = [torch.tensor([10 * rank + d]) for d in range(world_size)]
    outputs = [torch.tensor([-1]) for _ in range(world_size)]
    dist.all_to_all(outputs, inputs)
    assert [o.item() for o in outputs] == [10 * s + rank for s in range(world_size)]


@pytest.mark.world_size(*WORLD_SIZES)
def test_all_to_all_list_unequal_sizes(rank, world_size, pg, backend):
    """all_to_all's tensors may differ in size on NCCL: rank s sends s + 1 copies of s to each.

    gloo's alltoall insists on equal sizes and refuses (on every rank, before communicating);
    the test then skips and says so. The next test shows the portable way.
    """
    inputs = [torch.full((rank + 1,), float(rank)) for _ in range(world_size)]
    outputs = [torch.empty(s + 1) for s in range(world_size)]
    try:
        dist.all_to_all(outputs, inputs)
    except RuntimeError as exc:
        if "invalid tensor size" not in str(exc):
            raise
        pytest.skip(
            f"the {backend!r} backend's all_to_all needs equal-sized tensors "
            f"(torch {torch.__version__}): {str(exc).splitlines()[0]}"
        )
    assert [o.tolist() for o in outputs] == [[float(s)] * (s + 1) for s in range(world_size)]


@pytest.mark.world_size(*WORLD_SIZES)
def test_all_to_all_unequal_sizes_portable(rank, world_size, pg):
    """Uneven all_to_all on any backend: all_to_all_single with split sizes on a flat buffer.

    Same exchange as above: rank s sends s + 1 copies of s to every rank.
    """
    in_splits = [rank + 1] * world_size
    out_splits = [s + 1 for s in range(world_size)]
    inp = torch.full((sum(in_splits),), float(rank))
    out = torch.empty(sum(out_splits))
    dist.all_to_all_single(out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits)
    pieces = out.split(out_splits)
    assert [p.tolist() for p in pieces] == [[float(s)] * (s + 1) for s in range(world_size)]


@pytest.mark.world_size(*WORLD_SIZES)
def test_all_to_all_single_equal_splits(rank, world_size, pg):
    """Without split sizes the first dimension is cut in world_size equal parts (2 rows here)."""
    inp = torch.tensor([[100 * rank + d, k] for d in range(world_size) for k in (0, 1)])
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp)
    assert out.tolist() == [[100 * s + rank, k] for s in range(world_size) for k in (0, 1)]


@pytest.mark.world_size(*WORLD_SIZES)
def test_all_to_all_single_unequal_splits(rank, world_size, pg):
    """Rank s sends s + d + 1 elements of value 100 s + d to rank d.

    So rank d receives, from each s in order, s + d + 1 copies of 100 s + d; both sides must
    agree on the sizes (input_split_sizes on the sender, output_split_sizes on the receiver).
    """
    in_splits = [rank + d + 1 for d in range(world_size)]
    out_splits = [s + rank + 1 for s in range(world_size)]
    inp = torch.cat([torch.full((k,), 100 * rank + d) for d, k in enumerate(in_splits)])
    out = torch.full((sum(out_splits),), -1)
    dist.all_to_all_single(out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits)
    expected = []
    for s in range(world_size):
        expected += [100 * s + rank] * (s + rank + 1)
    assert out.tolist() == expected
    assert len(expected) == world_size * rank + tri(world_size)


# -- synchronisation -------------------------------------------------------------------------------


@pytest.mark.world_size(*WORLD_SIZES)
def test_barrier_orders_side_effects(rank, world_size, pg, dist_store):
    """After a barrier, every rank sees what every other rank did before it.

    Each rank writes a key to the shared store, then waits at the barrier; no key may be missing
    afterwards. ``check`` does not wait, so it would fail without the barrier if a peer were slow.
    """
    dist_store.set(f"arrived/{rank}", str(rank * rank))
    dist.barrier()
    keys = [f"arrived/{r}" for r in range(world_size)]
    assert dist_store.check(keys)
    assert [int(dist_store.get(k)) for k in keys] == [r * r for r in range(world_size)]


@pytest.mark.world_size(*WORLD_SIZES)
def test_monitored_barrier(rank, world_size, pg, dist_store):
    """gloo's monitored_barrier: a barrier that, on timeout, names the ranks that never came
    (all of them with wait_all_ranks=True) instead of hanging. Here everyone arrives."""
    from datetime import timedelta

    dist_store.set(f"before/{rank}", "1")
    dist.monitored_barrier(timeout=timedelta(seconds=30), wait_all_ranks=True)
    assert dist_store.check([f"before/{r}" for r in range(world_size)])


# -- point to point --------------------------------------------------------------------------------


@pytest.mark.world_size(*WORLD_SIZES)
def test_send_recv_ring(rank, world_size, pg):
    """Blocking send/recv around a ring; even ranks send first, odd ranks receive first."""
    nxt, prv = (rank + 1) % world_size, (rank - 1) % world_size
    out = torch.tensor([rank * 2 + 1, rank], dtype=torch.int64)
    got = torch.zeros(2, dtype=torch.int64)
    if rank % 2 == 0:
        dist.send(out, dst=nxt)
        dist.recv(got, src=prv)
    else:
        dist.recv(got, src=prv)
        dist.send(out, dst=nxt)
    assert got.tolist() == [prv * 2 + 1, prv]


@pytest.mark.world_size(*WORLD_SIZES)
def test_recv_from_any_source(rank, world_size, pg):
    """recv without src takes the next message from anyone and returns the sender's rank."""
    if rank == 0:
        seen = {}
        for _ in range(world_size - 1):
            t = torch.zeros(1, dtype=torch.int64)
            sender = dist.recv(t)
            seen[sender] = t.item()
        assert seen == {r: r * 1000 for r in range(1, world_size)}
    else:
        dist.send(torch.tensor([rank * 1000]), dst=0)


@pytest.mark.world_size(*WORLD_SIZES)
def test_isend_irecv(rank, world_size, pg):
    """Non-blocking: post both, then wait; no ordering needed to avoid a deadlock."""
    nxt, prv = (rank + 1) % world_size, (rank - 1) % world_size
    got = torch.zeros(3)
    reqs = [
        dist.isend(torch.tensor([rank, 0.5 * rank, 9.0]), dst=nxt),
        dist.irecv(got, src=prv),
    ]
    for req in reqs:
        req.wait()
    assert got.tolist() == [float(prv), 0.5 * prv, 9.0]


@pytest.mark.world_size(*WORLD_SIZES)
def test_batch_isend_irecv_ring(rank, world_size, pg):
    """Both directions of a ring at once: send to both neighbours, receive from both.

    On 2 ranks both neighbours are the same rank; the tags say which message is which.
    """
    nxt, prv = (rank + 1) % world_size, (rank - 1) % world_size
    from_prv = torch.zeros(1, dtype=torch.int64)
    from_nxt = torch.zeros(1, dtype=torch.int64)
    ops = [
        dist.P2POp(dist.isend, torch.tensor([10 * rank + 1]), nxt, tag=1),
        dist.P2POp(dist.isend, torch.tensor([10 * rank + 2]), prv, tag=2),
        dist.P2POp(dist.irecv, from_prv, prv, tag=1),
        dist.P2POp(dist.irecv, from_nxt, nxt, tag=2),
    ]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    assert from_prv.item() == 10 * prv + 1  # prv sent "+1" to its next, which is me
    assert from_nxt.item() == 10 * nxt + 2  # nxt sent "+2" to its previous, which is me


# -- asynchronous handles --------------------------------------------------------------------------


@pytest.mark.world_size(*WORLD_SIZES)
def test_async_all_reduce_handles(rank, world_size, pg):
    """async_op=True returns a Work handle; the result is defined only after wait()."""
    tensors = [torch.tensor([float(rank + k)]) for k in range(3)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    for work in works:
        work.wait()
        assert work.is_completed()
    # sum over r of (r + k) = n(n-1)/2 + n k
    n = world_size
    assert [t.item() for t in tensors] == [n * (n - 1) / 2 + n * k for k in range(3)]


@pytest.mark.world_size(*WORLD_SIZES)
def test_async_future_chaining(rank, world_size, pg):
    """Work.get_future() composes: the continuation runs once the all_reduce has finished."""
    t = torch.tensor([rank + 1.0])
    fut = dist.all_reduce(t, async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2)
    assert doubled.wait().item() == 2 * tri(world_size)
    assert t.item() == tri(world_size)


@pytest.mark.world_size(*WORLD_SIZES)
def test_several_async_ops_in_flight(rank, world_size, pg):
    """Different collectives in flight at once, waited for in the reverse order of issue."""
    b = torch.full((4,), float(rank))
    g_out = [torch.zeros(2, dtype=torch.int64) for _ in range(world_size)]
    r = torch.tensor([rank + 1], dtype=torch.int64)
    works = [
        dist.broadcast(b, src=world_size - 1, async_op=True),
        dist.all_gather(g_out, torch.tensor([rank, -rank]), async_op=True),
        dist.all_reduce(r, op=dist.ReduceOp.MAX, async_op=True),
    ]
    for work in reversed(works):
        work.wait()
    assert b.tolist() == [float(world_size - 1)] * 4
    assert [g.tolist() for g in g_out] == [[q, -q] for q in range(world_size)]
    assert r.item() == world_size


# -- dtypes and shapes -----------------------------------------------------------------------------


@pytest.mark.world_size(*WORLD_SIZES)
@pytest.mark.parametrize(
    "dtype",
    [torch.float16, torch.bfloat16, torch.uint8, torch.bool],
    ids=["float16", "bfloat16", "uint8", "bool"],
)
def test_all_reduce_small_dtypes(rank, world_size, pg, dtype):
    """Half precision, bytes and booleans reduce too (SUM on bool is logical or)."""
    if dtype is torch.bool:
        t = torch.tensor([rank == 0, False, True])
        dist.all_reduce(t)
        assert t.tolist() == [True, False, True]
        return
    t = torch.tensor([rank + 1, 2], dtype=dtype)
    dist.all_reduce(t)
    assert t.tolist() == [tri(world_size), 2 * world_size]


@pytest.mark.world_size(*WORLD_SIZES)
def test_all_reduce_non_contiguous_and_multidim(rank, world_size, pg):
    """A 3-D tensor reduces element-wise, and so does a non-contiguous (transposed) view."""
    t = torch.arange(24, dtype=torch.float64).reshape(2, 3, 4) + rank
    dist.all_reduce(t)
    expected = torch.arange(24, dtype=torch.float64).reshape(2, 3, 4) * world_size
    expected += world_size * (world_size - 1) / 2
    assert torch.equal(t, expected)

    base = torch.arange(6.0).reshape(2, 3) * (rank + 1)
    view = base.t()
    assert not view.is_contiguous()
    dist.all_reduce(view)
    n = tri(world_size)  # sum of rank + 1
    assert view.tolist() == [[0.0, 3.0 * n], [1.0 * n, 4.0 * n], [2.0 * n, 5.0 * n]]
    assert base.tolist() == [[0.0, 1.0 * n, 2.0 * n], [3.0 * n, 4.0 * n, 5.0 * n]]  # in place

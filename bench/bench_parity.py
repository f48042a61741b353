"""What a check across ranks costs: a 1 MiB float32 tensor at world size 4 (gloo, CPU).

Run by hand: ``python bench/bench_parity.py [--repeat N] [--world-size W] [--mib M]``. Starts W
processes (torch.multiprocessing, a FileStore in a temporary folder), and in each times every
check passing and failing (one rank's tensor differs in one element), N times each after a
warm-up, with a barrier on the test's group before each timing; prints rank 0's medians (and
min-max) in one table, beside a hand-written check (``all_gather`` of the whole tensor and a
``torch.equal`` against each rank's) as the ratio's reference. The plugin's own twin group is
made in the warm-up, as in a pool it is made by the first check of the pool's life.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pytest_distrank import (
    assert_close_across_ranks,
    assert_differs_across_ranks,
    assert_equal_across_ranks,
)


def by_hand(t: torch.Tensor) -> None:
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    if not all(torch.equal(o, out[0]) for o in out):
        raise AssertionError("differs")


def timed(check: Callable[[torch.Tensor], None], t: torch.Tensor, repeat: int) -> list[float]:
    out = []
    for i in range(repeat + 1):
        dist.barrier()
        start = time.perf_counter()
        try:
            check(t)
        except AssertionError:
            pass
        if i:  # the first is the warm-up
            out.append(time.perf_counter() - start)
    return out


def run(rank: int, world_size: int, folder: str, repeat: int, mib: float, queue: Any) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world_size
    )
    torch.set_num_threads(1)
    same = torch.randn(int(mib * (1 << 20)) // 4, generator=torch.Generator().manual_seed(0))
    bad = same.clone()
    if rank == world_size - 1:
        bad[12345] += 1.0
    mine = same + rank  # every rank its own values
    cases: list[tuple[str, Callable[[torch.Tensor], None], torch.Tensor]] = [
        ("hand-written all_gather + equal, passing", by_hand, same),
        ("assert_equal_across_ranks, passing", assert_equal_across_ranks, same),
        ("assert_equal_across_ranks, failing", assert_equal_across_ranks, bad),
        ("assert_close_across_ranks, passing", assert_close_across_ranks, same),
        ("assert_close_across_ranks, failing", assert_close_across_ranks, bad),
        ("assert_differs_across_ranks, passing", assert_differs_across_ranks, mine),
        ("assert_differs_across_ranks, failing", assert_differs_across_ranks, same),
    ]
    results = [(name, timed(check, t, repeat)) for name, check, t in cases]
    if rank == 0:
        queue.put(results)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--mib", type=float, default=1.0)
    args = parser.parse_args()
    os.environ.pop("PYTEST_CURRENT_TEST", None)
    with tempfile.TemporaryDirectory() as folder:
        queue = mp.get_context("spawn").SimpleQueue()
        mp.spawn(run, (args.world_size, folder, args.repeat, args.mib, queue), args.world_size)
        results = queue.get()
    print(
        f"{args.mib:g} MiB float32, world size {args.world_size}, gloo CPU, "
        f"{args.repeat} repetitions, rank 0's medians (min-max)"
    )
    base = statistics.median(results[0][1])
    print(f"{'check':42} {'ms':>8} {'min-max':>15} {'x hand':>7}")
    for name, times in results:
        median = statistics.median(times)
        span = f"{min(times) * 1e3:.2f}-{max(times) * 1e3:.2f}"
        print(f"{name:42} {median * 1e3:8.2f} {span:>15} {median / base:7.2f}")


if __name__ == "__main__":
    main()

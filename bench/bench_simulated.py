"""Simulated worlds: per-test cost and peak memory, against the same tests wired up by hand.

Runs in a plain Python process; every workload is a pytest session in a subprocess (as in
bench_overhead.py, whose timing helpers it uses). For each workload: a K-test and a 2K-test run,
the steady cost of one test being the difference of the wall times over K; and the peak
resident set of the process that ran the tests, which the last test writes down
(``ru_maxrss``: the pool's one rank process, or pytest's own process for the references).

Usage (from the repository root, with the project installed):

    python bench/bench_simulated.py               # K=50 fake, 4 local; 3 repetitions; medians
    python bench/bench_simulated.py --k 20 --k-local 2 --repeat 1

Workloads (each test builds its mesh and DTensors anew):
  fake ws1024 distrank       @pytest.mark.simulate("fake", 1024): a 8 x 128 mesh, two DTensors,
                             shape asserts
  fake ws1024 by hand        the same body in plain pytest, the fake group made by a session
                             fixture (what projects write by hand)
  local ws64 distrank        @pytest.mark.simulate("local", 64): a row-sharded matmul, a global
                             norm and an all_reduce, numbers asserted
  local ws64 LocalDTensor    the same body in PyTorch's own LocalDTensorTestBase (a test class made
                             by create_local_tensor_test_class, as PyTorch makes its twins)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench_overhead import timed_run

FAKE_BODY = """
    mesh = init_device_mesh("cpu", (8, 128), mesh_dim_names=("dp", "tp"))
    up = distribute_tensor(torch.zeros(4096, 1024), mesh, [Replicate(), Shard(0)])
    batch = distribute_tensor(torch.zeros(512, 1024), mesh, [Shard(0), Replicate()])
    assert up.to_local().shape == (32, 1024)
    assert batch.to_local().shape == (64, 1024)
"""
LOCAL_BODY = """
    mesh = init_device_mesh("cpu", (world_size,))
    x = torch.arange(world_size * 8, dtype=torch.float32).reshape(world_size * 2, 4) / 10
    w = torch.linspace(-1, 1, 12).reshape(4, 3)
    out = distribute_tensor(x, mesh, [Shard(0)]) @ distribute_tensor(w, mesh, [Replicate()])
    torch.testing.assert_close(out.full_tensor(), x @ w)
    torch.testing.assert_close((out * out).sum().full_tensor().sqrt(), (x @ w).norm())
    mine = torch.ones(1) * (rank + 1)
    dist.all_reduce(mine)
    assert mine.item() == world_size * (world_size + 1) // 2
"""
HEADER = """
import resource, pytest, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

def note_peak():
    with open("peak_kib", "w") as f:
        f.write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
"""
FAKE_DISTRANK = """
@pytest.mark.simulate("fake", 1024)
def test_{i}(rank, world_size):
{body}
    if {last}:
        note_peak()
"""
FAKE_BY_HAND = """
@pytest.fixture(scope="session")
def fake_world():
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1024)
    yield
    dist.destroy_process_group()
"""
FAKE_BY_HAND_TEST = """
def test_{i}(fake_world):
{body}
    if {last}:
        note_peak()
"""
LOCAL_DISTRANK = """
@pytest.mark.simulate("local", 64)
def test_{i}(rank, world_size):
{body}
    if {last}:
        note_peak()
"""
LOCAL_REFERENCE = """
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase, create_local_tensor_test_class, with_comms,
)

class Plain(DTensorTestBase):
    @property
    def world_size(self):
        return 64
{tests}

LocalTwin = create_local_tensor_test_class(Plain)
del Plain  # only the twin runs: one process, LocalTensorMode
"""
LOCAL_REFERENCE_TEST = """
    @with_comms
    def test_{i}(self):
        rank, world_size = self.rank, self.world_size
{body}
        if {last}:
            note_peak()
"""


def indent(body: str, spaces: int) -> str:
    pad = " " * spaces
    return "".join(pad + line + "\n" if line.strip() else "\n" for line in body.splitlines())


def file_of(kind: str) -> Callable[[int], str]:
    def make(k: int) -> str:
        def one(template: str, body: str, i: int, pad: int) -> str:
            return template.format(i=i, body=indent(body, pad), last=i == k - 1)

        if kind == "fake distrank":
            tests = [one(FAKE_DISTRANK, FAKE_BODY.strip("\n"), i, 0) for i in range(k)]
            return HEADER + "".join(tests)
        if kind == "fake by hand":
            tests = [one(FAKE_BY_HAND_TEST, FAKE_BODY.strip("\n"), i, 0) for i in range(k)]
            return HEADER + FAKE_BY_HAND + "".join(tests)
        if kind == "local distrank":
            tests = [one(LOCAL_DISTRANK, LOCAL_BODY.strip("\n"), i, 0) for i in range(k)]
            return HEADER + "".join(tests)
        tests = [one(LOCAL_REFERENCE_TEST, LOCAL_BODY.strip("\n"), i, 4) for i in range(k)]
        return HEADER + LOCAL_REFERENCE.format(tests="".join(tests))

    return make


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--k", type=int, default=50, help="fake tests in the small run (large: 2k)")
    parser.add_argument("--k-local", type=int, default=4, help="local tests in the small run")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    py = sys.executable
    base = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    workloads = [
        ("fake ws1024 distrank", "fake distrank", [*base, "-p", "distrank"]),
        ("fake ws1024 by hand", "fake by hand", [*base, "-p", "no:distrank"]),
        ("local ws64 distrank", "local distrank", [*base, "-p", "distrank"]),
        ("local ws64 LocalDTensor", "local reference", [*base, "-p", "no:distrank"]),
    ]
    per_test: dict[str, list[float]] = {name: [] for name, _, _ in workloads}
    peak: dict[str, list[float]] = {name: [] for name, _, _ in workloads}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for _ in range(args.repeat):  # interleaved: a noisy minute hits every workload alike
            for name, kind, cmd in workloads:
                make = file_of(kind)
                walls, k_small = [], args.k_local if kind.startswith("local") else args.k
                for k in (k_small, 2 * k_small):
                    (folder / "test_sim.py").write_text(make(k))
                    wall, _ = timed_run([*cmd, "test_sim.py"], folder)
                    walls.append(wall)
                per_test[name].append((walls[1] - walls[0]) / k_small * 1000)
                peak[name].append(int((folder / "peak_kib").read_text()) / 1024)
    print(
        f"K={args.k} and {2 * args.k} (local: {args.k_local} and {2 * args.k_local}), "
        f"{args.repeat} repetitions, medians (min-max)"
    )
    print(f"{'workload':<26}{'per test ms':>14}{'min-max':>18}{'peak RSS MiB':>14}")
    for name, _, _ in workloads:
        values = per_test[name]
        print(
            f"{name:<26}{statistics.median(values):>14.1f}"
            f"{f'{min(values):.1f}-{max(values):.1f}':>18}{statistics.median(peak[name]):>14.0f}"
        )
    fake = statistics.median(per_test["fake ws1024 distrank"])
    local_rss = statistics.median(peak["local ws64 distrank"])
    print(f"target fake ws1024 < 50 ms per test: {'met' if fake < 50 else 'MISSED'} ({fake:.1f})")
    print(f"target local ws64 peak RSS < 1024 MiB: {'met' if local_rss < 1024 else 'MISSED'}")


if __name__ == "__main__":
    main()

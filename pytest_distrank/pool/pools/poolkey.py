"""What makes rank processes incompatible: the key of a pool (world size, backend, GPUs, a
simulated world). Tests with equal keys share a pool.

Runs in the controller (pool mode): planning (:mod:`controller`) computes each test's key, the
pool set (:mod:`poolset`) keeps one live pool per key.
"""

from __future__ import annotations

import dataclasses

from ...parsing import size_words
from ...planning.gpuplan import GpuPlan
from ...planning.meshes import Simulated


@dataclasses.dataclass(frozen=True)
class PoolKey:
    """What makes rank processes incompatible: tests with equal keys share a pool."""

    world_size: int
    backend: str
    init_process_group: bool
    #: Non-zero for a pool of its own for one test: positive under --distrank-isolate, negative
    #: for a test that asks for fresh ranks (markers.wants_fresh_ranks).
    isolated: int = 0
    #: GPUs the pool leases for its lifetime (gpus.py); 0 for CPU-only pools.
    gpus: int = 0
    #: A simulated world its one rank process plays (markers.Simulated), or None.
    simulated: Simulated | None = None
    #: Ranks share the leased GPUs (gpuplan.py): "nccl" (NCCL multi-rank) or "gloo" (the
    #: fallback); "" for one GPU per rank.
    gpu_share: str = ""
    #: Bytes of each leased GPU the pool needs (requires_gpus(n, memory=...)); 0: GPUs whole.
    gpu_memory: int = 0

    def describe(self) -> str:
        if self.simulated is not None:
            return f"{self.simulated.describe()} in one process"
        init = "" if self.init_process_group else ", init_process_group=False"
        if self.gpu_share:
            shared = GpuPlan(self.gpus, self.backend, self.gpu_share)
            gpus = f", {shared.describe(self.world_size)}"
        else:
            gpus = f", {self.gpus} GPU{'s' if self.gpus > 1 else ''}" if self.gpus else ""
        if self.gpus and self.gpu_memory:
            gpus += f" ({size_words(self.gpu_memory)} of each)"
        return f"world_size={self.world_size}, backend={self.backend}{init}{gpus}"

    def cuda_device(self, rank: int) -> int:
        """The CUDA device index rank ``rank`` uses within the lease (-1: none): its own GPU
        for NCCL, GPU ``rank % gpus`` when ranks share them."""
        if not self.gpus or not (self.gpu_share or "nccl" in self.backend):
            return -1
        return rank % self.gpus

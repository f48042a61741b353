"""A toy inference engine, shaped like those tests start (vLLM's ``LLM(tensor_parallel_size=2)``).

``Engine(workers=2)`` starts two worker processes (``multiprocessing`` spawn) that form a gloo
group between them and serve requests through pipes (queues without their feeder threads and
semaphores): each request goes to every worker, each computes its share, an ``all_reduce`` sums
them, and worker 0 sends the answer back. ``Engine.result`` waits for the answer and for the
workers' sentinels, so a worker that dies is an error naming it; a worker that hangs leaves
``result`` waiting (the test's ``in_child`` timeout ends it). Not a test file: the examples in
``test_engine.py`` use it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import tempfile
import time
from multiprocessing.connection import Connection, wait


def _worker(rank: int, store: str, requests: Connection, results: Connection) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
    while True:
        request = requests.recv()
        if request is None:
            break
        kind, value = request
        if kind == "hang" and rank == 1:
            time.sleep(3600)  # a worker stuck: its peer waits in all_reduce
        if kind == "crash" and rank == 1:
            os.kill(os.getpid(), signal.SIGSEGV)  # a worker's native crash
        share = torch.tensor([float(value) * (rank + 1)])
        dist.all_reduce(share)  # value * 1 + value * 2
        if rank == 0:
            results.send(share.item())
    dist.destroy_process_group()


class Engine:
    """Two workers serving ``submit(value)`` -> ``value * 3``, computed across them."""

    def __init__(self, workers: int = 2) -> None:
        assert workers == 2, "the toy engine has two workers"
        ctx = mp.get_context("spawn")
        self.folder = tempfile.mkdtemp(prefix="toy-engine-")
        store = os.path.join(self.folder, "store")
        pipes = [ctx.Pipe(duplex=False) for _ in range(workers)]
        self.requests = [send for _, send in pipes]
        self.results, answers = ctx.Pipe(duplex=False)
        self.workers = [
            ctx.Process(target=_worker, args=(rank, store, pipes[rank][0], answers))
            for rank in range(workers)
        ]
        for worker in self.workers:
            worker.start()

    def submit(self, value: float, kind: str = "normal") -> None:
        for pipe in self.requests:
            pipe.send((kind, value))

    def result(self) -> float:
        """The next answer; a worker that died is an error naming it and how."""
        while True:
            ready = wait([self.results, *(w.sentinel for w in self.workers)])
            if self.results in ready:
                return float(self.results.recv())
            for rank, worker in enumerate(self.workers):
                if worker.sentinel in ready:
                    worker.join()
                    code = worker.exitcode or 0
                    how = signal.Signals(-code).name if code < 0 else f"exit code {code}"
                    raise RuntimeError(f"engine worker {rank} (pid {worker.pid}) died: {how}")

    def close(self) -> None:
        for pipe in self.requests:
            pipe.send(None)
        for worker in self.workers:
            worker.join(10)

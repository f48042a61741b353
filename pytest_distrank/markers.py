"""The plugin's markers as ``pytest --markers`` lists them: one help line each.

Registered by :mod:`plugin` in the controller and in every rank process. Reading the markers of
a test is planning's (:mod:`planning.spec`, :mod:`planning.meshes`); this module imports nothing.
"""

from __future__ import annotations

#: One line per marker, in the order ``pytest --markers`` shows them.
MARKERS = (
    "world_size(*sizes, backend=None, init_process_group=True): run the test on each of `sizes` "
    "ranks of a torch.distributed process group, one test per size with ids ws<N> when several "
    "are given; no size uses --distrank-world-size. `backend` picks the backend (default "
    "--distrank-backend; a tuple gives one test per backend, ids ws<N>-<backend>, each skipped "
    "on its own when unavailable); init_process_group=False starts the ranks without a default "
    "group, with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set for env:// initialisation.",
    "requires_nccl: the test needs NCCL and one GPU per rank (implies backend='nccl'); skipped "
    "before any rank starts when they are missing.",
    "requires_gpus(n, memory=None): skipped unless at least n GPUs are visible; memory='8GiB': "
    "the test needs that much of each GPU, and pools that declare it share GPUs while it fits.",
    "distrank_gpus(n): the test needs n GPUs, for --distrank-gpus tiers, where its markers "
    "cannot tell: a harness class whose world size counts GPUs, a test that starts its own GPU "
    "processes. Wins over what the other markers say; the class attribute distrank_gpus = n "
    "does the same.",
    "distrank_isolate: run this distributed test on fresh rank processes of its own, started "
    "for it and ended after it (for tests that need a fresh process).",
    "expect_rank_exit(rank, signal=None, exit_code=None, match=None): `rank` (or a tuple of "
    "ranks) is meant to die in this test, by `signal` ('SIGKILL') or with `exit_code`, its last "
    "output matching the regex `match`; the test passes when exactly those ranks die that way "
    "and every other rank passes. Pool mode only (docs/fault-tolerance.md).",
    "simulate(mode, *sizes, ranks=(0,), device='cpu'): also run the test in a simulated world "
    "of each of `sizes` ranks, in one process, with ids ws<N>-<mode>; mode 'fake' (PyTorch's "
    "fake process group: collectives return at once and move no data; `ranks`: the simulated "
    "rank(s) the process plays, one test each; device='meta': the `device` fixture is meta) or "
    "'local' (LocalTensorMode: every rank's tensors in the one process, collectives on the "
    "world and on DeviceMesh dimensions computed exactly, on other groups refused; `rank` is a "
    "symbolic int of every rank).",
    "mesh(**dims) or mesh(*shapes): run the test on a named DeviceMesh of each shape (a shape: "
    "dp=2, tp=2 as keywords, or {'dp': 2, 'tp': 2} or 'dp2-tp2' per shape), at a world size of "
    "the dimensions' product, with ids ws<N>-dp2-tp2 and the `mesh` fixture "
    "(docs/markers.md#meshes-and-backends).",
)

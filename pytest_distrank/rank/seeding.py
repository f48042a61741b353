"""Each rank's random state at the start of each distributed test (``--distrank-seed``).

Runs in the rank processes of both modes: pool ranks register :class:`SeedPlugin` in their
``pytest_configure`` (``pool/worker/main.py``), the ranks of a launched world when they start
(``launch/plugin.py``). Ranks forked from one server would otherwise all draw the same numbers,
and a test's numbers would depend on the tests before it in the pool: here every rank starts
every distributed test from a state that depends only on the session seed, the test's node id
and the rank, before any of the test's fixtures (a tryfirst ``pytest_runtest_setup``).

What is seeded (each for about a microsecond; ``torch.manual_seed`` would cost 0.2-0.8 ms):
torch's default CPU generator, the CUDA generators where CUDA is initialised, ``random``,
numpy's global state where numpy is imported, and DTensor's random-number tracker is dropped
(the next DTensor random op makes a new one from torch's state). While pytest-randomly is
active it owns ``random`` and numpy (it reseeds them in every phase, alike on every rank): then
only torch is seeded here. ``torch.Generator`` objects and numpy ``default_rng()`` generators
that a test makes itself are its own.
"""

from __future__ import annotations

import hashlib
import random
import sys
from collections.abc import Callable

import pytest

from .. import _compat

#: numpy's legacy global state takes 32-bit seeds.
NUMPY_SEED_MASK = 2**32 - 1
#: (session seed, node id) of the distributed test being run, for ``rank_inputs``'s default seed.
_CURRENT: list[tuple[int, str]] = []


def seed_of(session_seed: int, nodeid: str, rank: int) -> int:
    """The 64-bit seed of one test on one rank: a hash of the session seed, node id and rank.

    Distinct per rank and per test, the same in every session with the same seed, whatever ran
    before (and the same on a rerun of the test).
    """
    text = f"{session_seed}\0{nodeid}\0{rank}".encode(errors="surrogatepass")
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def current_test_seed() -> tuple[int, str] | None:
    """(session seed, node id) of the distributed test this rank runs; None when seeding is off."""
    return _CURRENT[-1] if _CURRENT else None


def seed_random_state(seed: int, torch_only: bool) -> None:
    """Seed what a test draws from: torch (CPU, and CUDA where initialised), DTensor's tracker
    (dropped), and unless ``torch_only``, ``random`` and numpy (where imported)."""
    if "torch" in sys.modules:
        import torch

        torch.default_generator.manual_seed(seed)
        if torch.cuda.is_initialized():
            torch.cuda.manual_seed_all(seed)
        _compat.reset_dtensor_rng()
    if torch_only:
        return
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed & NUMPY_SEED_MASK)


class SeedPlugin:
    """Seeds every distributed test's random state on this rank before its fixtures."""

    def __init__(
        self,
        session_seed: int,
        rank: int,
        distributed: Callable[[pytest.Item], bool] = lambda item: True,
    ) -> None:
        self.session_seed = session_seed
        self.rank = rank
        #: Which tests are distributed (launcher mode runs some on rank 0 alone: not seeded).
        self.distributed = distributed
        #: pytest-randomly reseeds ``random`` and numpy in every phase: leave them to it.
        self.torch_only = False

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if self.distributed(item):
            _CURRENT[:] = [(self.session_seed, item.nodeid)]
            seed = seed_of(self.session_seed, item.nodeid, self.rank)
            seed_random_state(seed, self.torch_only)


def register(
    config: pytest.Config,
    session_seed: int | None,
    rank: int,
    distributed: Callable[[pytest.Item], bool] = lambda item: True,
) -> None:
    """Register :class:`SeedPlugin` on this rank, unless the seed is off (None)."""
    if session_seed is None:
        return
    plugin = SeedPlugin(session_seed, rank, distributed)
    plugin.torch_only = _compat.randomly_reseeds(config)
    config.pluginmanager.register(plugin, "distrank-seed")

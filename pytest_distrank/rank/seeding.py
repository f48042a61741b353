"""Each rank's random state in each phase of each distributed test (``--distrank-seed``).

Runs in the rank processes of both modes: pool ranks register :class:`SeedPlugin` in their
``pytest_configure`` (``pool/worker/main.py``), the ranks of a launched world when they start
(``launch/plugin.py``). Ranks forked from one server would otherwise all draw the same numbers,
and a test's numbers would depend on the tests before it in the pool: here every rank starts
each phase of every distributed test (setup, before any of its fixtures; call; teardown) from a
state that depends only on the session seed, the test's node id, the rank and the phase. A
fixture of a wider scope (class, module, package, session) is set up from a state that depends
on its scope's node id instead (and its name and parameter), never on the test that happened
to set it up, and the state the test had is put back after it: what a test draws, and what its
wider fixtures drew, are the same whether it runs alone (the "rerun just this test" command)
or after the tests that shared those fixtures.

What is seeded (each for about a microsecond; ``torch.manual_seed`` would cost 0.2-0.8 ms):
torch's default CPU generator, the CUDA generators where CUDA is initialised, ``random``,
numpy's global state where numpy is imported, and DTensor's random-number tracker is dropped
(the next DTensor random op makes a new one from torch's state). While pytest-randomly is
active it owns ``random`` and numpy (it reseeds them in every phase, alike on every rank): then
only torch is seeded here. ``torch.Generator`` objects and numpy ``default_rng()`` generators
that a test makes itself are its own.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import sys
from collections.abc import Callable, Generator
from typing import Any

import pytest

from .. import _compat

#: numpy's legacy global state takes 32-bit seeds.
NUMPY_SEED_MASK = 2**32 - 1
#: (session seed, node id) of the distributed test being run, for ``rank_inputs``'s default seed.
_CURRENT: list[tuple[int, str]] = []


def seed_of(session_seed: int, nodeid: str, rank: int, phase: str = "setup") -> int:
    """The 64-bit seed of one phase of one test on one rank: a hash of the session seed, the
    node id, the rank and the phase (``setup``, ``call``, ``teardown``; a wider fixture's:
    :func:`fixture_phase`, with its scope's node id).

    Distinct per rank, test and phase, the same in every session with the same seed, whatever
    ran before (and the same on a rerun of the test).
    """
    text = f"{session_seed}\0{nodeid}\0{rank}"
    if phase != "setup":  # the setup's seed is the one of the first version
        text += f"\0{phase}"
    digest = hashlib.blake2b(text.encode(errors="surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def fixture_phase(argname: str, param_index: int = 0) -> str:
    """The phase word of a wider-scoped fixture's setup: its name and parameter's index."""
    return f"fixture\0{argname}\0{param_index}"


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


@dataclasses.dataclass
class RandomState:
    """What :func:`seed_random_state` seeds, as it was: put back after a wider fixture's setup."""

    torch_only: bool
    cpu: Any = None
    cuda: Any = None
    python: Any = None
    numpy: Any = None

    @classmethod
    def capture(cls, torch_only: bool) -> RandomState:
        state = cls(torch_only)
        if "torch" in sys.modules:
            import torch

            state.cpu = torch.default_generator.get_state()
            if torch.cuda.is_initialized():
                state.cuda = torch.cuda.get_rng_state_all()
        if not torch_only:
            state.python = random.getstate()
            numpy = sys.modules.get("numpy")
            if numpy is not None:
                state.numpy = numpy.random.get_state()
        return state

    def restore(self, seed: int | None) -> None:
        """Put the state back; what had none then (CUDA initialised since, numpy imported
        since) is seeded with ``seed``, the phase's, as it would have been (None: left)."""
        if "torch" in sys.modules:
            import torch

            if self.cpu is not None:
                torch.default_generator.set_state(self.cpu)
            elif seed is not None:
                torch.default_generator.manual_seed(seed)
            if torch.cuda.is_initialized():
                if self.cuda is not None:
                    torch.cuda.set_rng_state_all(self.cuda)
                elif seed is not None:
                    torch.cuda.manual_seed_all(seed)
            _compat.reset_dtensor_rng()  # made from the fixture's state, maybe: dropped
        if self.torch_only:
            return
        random.setstate(self.python)
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            if self.numpy is not None:
                numpy.random.set_state(self.numpy)
            elif seed is not None:
                numpy.random.seed(seed & NUMPY_SEED_MASK)


class SeedPlugin:
    """Seeds every distributed test's random state on this rank: each phase, and its wider
    fixtures' setups."""

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
        #: The distributed test being run and the seed of its phase; None in the tests that
        #: are not distributed.
        self.running: tuple[str, int] | None = None

    def _phase(self, item: pytest.Item, phase: str) -> None:
        if not self.distributed(item):
            self.running = None
            return
        _CURRENT[:] = [(self.session_seed, item.nodeid)]
        seed = seed_of(self.session_seed, item.nodeid, self.rank, phase)
        self.running = (item.nodeid, seed)
        seed_random_state(seed, self.torch_only)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self._phase(item, "setup")

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> None:
        self._phase(item, "call")

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        self._phase(item, "teardown")

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> Generator[None, object, object]:
        """A wider fixture is set up from its scope's seed, and the test's state is put back
        after it: also when a test that is not distributed sets it up (launcher mode runs
        those on rank 0 alone, unseeded), since a distributed test may use it next."""
        if fixturedef.scope == "function":
            return (yield)
        phase = fixture_phase(fixturedef.argname, getattr(request, "param_index", 0))
        saved = RandomState.capture(self.torch_only)
        seed_random_state(
            seed_of(self.session_seed, request.node.nodeid, self.rank, phase), self.torch_only
        )
        try:
            return (yield)
        finally:
            saved.restore(self.running[1] if self.running is not None else None)


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

"""A pool rank's store and process group: made once per rank process, checked after each test.

Runs in pool-mode rank processes (:mod:`main`). The pool's rendezvous (its default group, the
``dist_store`` fixture) is a FileStore in the controller's private folder. Only pools whose tests
rendezvous themselves (``init_process_group=False``, which PyTorch harness classes get from
:mod:`pool.suites`) get more: rank 0 serves a TCPStore on loopback, on a port the kernel picks,
and it is exported as MASTER_PORT, so that code using ``env://`` finds a live store and nobody
guesses a free port. Other pools listen on no port of the plugin's and have no MASTER_PORT.
torchrun's ``TORCHELASTIC_USE_AGENT_STORE=True`` convention is scoped to that store only.
After each test a rank meets the other members of the groups the test made before the plugin
destroys them (:func:`meet_before_destroy`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ... import _compat
from ...envvars import PLUGIN_PORT_ENV
from ...rank.context import RankContext
from ...rank.ownedgroups import twin_of_world
from ..protocol import RankConfig
from .simulate import simulate

STORE_TIMEOUT = timedelta(seconds=300)
MASTER_ADDR = "127.0.0.1"
AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"


def start_rank(cfg: RankConfig) -> RankContext:
    """Open the pool's store once, initialise the process group once."""
    import torch.distributed as dist

    store = dist.FileStore(cfg.store_path, cfg.world_size)
    ctx = RankContext(cfg.rank, cfg.world_size, cfg.local_rank, cfg.backend, store, None)
    ctx.cuda_device = cfg.cuda_device
    register_pid(ctx)
    if not cfg.init_process_group:
        master_store(ctx, "pool/")  # as the process it is: rank 0 of its pool
    if cfg.simulated is not None:
        return simulate(ctx, *cfg.simulated)
    if cfg.init_process_group:
        device_id = None
        if cfg.cuda_device >= 0 and ("nccl" in cfg.backend or _cuda_available()):
            import torch

            torch.cuda.set_device(cfg.cuda_device)
            # Bound to its GPU: collectives such as barrier() need not guess the device.
            device_id = torch.device("cuda", cfg.cuda_device) if "nccl" in cfg.backend else None
        dist.init_process_group(
            cfg.backend,
            store=store,
            rank=cfg.rank,
            world_size=cfg.world_size,
            device_id=device_id,
        )
        ctx.pg = dist.group.WORLD
        twin_of_world()  # every rank is here now: no check waits in the twin's rendezvous
    return ctx


def _cuda_available() -> bool:
    """A gloo pool that shares GPUs binds its rank's GPU only where CUDA is there (the fake GPU
    count of the test seam has none to bind)."""
    import torch

    return bool(torch.cuda.is_available())


def master_store(ctx: RankContext, prefix: str) -> None:
    """Serve a TCPStore on rank 0 (loopback, a port chosen by the kernel) and export it as
    MASTER_PORT; for ``init_process_group=False`` pools only.

    The port travels to the other ranks through the pool's FileStore, so nobody guesses a free
    port. Code that reads MASTER_ADDR/MASTER_PORT, and ``init_process_group()`` with env://, find
    a live store there. The store has no authentication: it listens on 127.0.0.1 only.
    """
    import torch.distributed as dist

    key = f"{prefix}master_port"
    if ctx.rank == 0:
        ctx.master_server = None  # drop the previous test's server first
        port_number, fd = _loopback_listener()
        # The store owns the fd from here (a failed start may have closed it already: not
        # closed again here, where its number may be another's by now).
        ctx.master_server = dist.TCPStore(
            MASTER_ADDR,
            port_number,
            is_master=True,
            wait_for_workers=False,
            timeout=STORE_TIMEOUT,
            master_listen_fd=fd,
        )
        port = str(ctx.master_server.port)
        ctx.store.set(key, port)
    else:
        port = ctx.store.get(key).decode()
    os.environ["MASTER_PORT"] = port
    os.environ[PLUGIN_PORT_ENV] = port
    _scope_agent_store()


def _loopback_listener() -> tuple[int, int]:
    """A listening socket on 127.0.0.1 (port chosen by the kernel), handed over as a bare fd.

    Given only the address, torch's TCPStore listens on every interface (``[::]``, torch 2.13);
    given the socket, its server (libuv or classic) accepts on it and closes it with the store.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((MASTER_ADDR, 0))
        sock.listen()
        port = int(sock.getsockname()[1])
        return port, sock.detach()


def _scope_agent_store() -> None:
    """Make ``TORCHELASTIC_USE_AGENT_STORE=True`` hold for the plugin's store only.

    torchrun's convention (every rank, rank 0 included, is a client of the store at
    MASTER_ADDR:MASTER_PORT, else rank 0 hosts a second store there) is right for the store rank 0
    serves here, but torch applies it to every ``tcp://`` and ``env://`` rendezvous of the process:
    a test's own ``tcp://127.0.0.1:<its port>`` rendezvous then hangs, since no rank hosts that
    store. The variable stays in the environment (code that reads it sees torchrun's value); around
    the store creation of a rendezvous to any other port it is lifted. Wraps torch's registered
    handlers (a private table of ``torch.distributed.rendezvous``); installed once per rank.
    """
    handlers = _compat.rendezvous_handlers()
    if handlers is None:
        return
    for scheme in ("tcp", "env"):
        original = handlers.get(scheme)
        if original is None or getattr(original, "_distrank_scoped", False):
            continue
        handlers[scheme] = _scoped_handler(scheme, original)


def _scoped_handler(scheme: str, original: Any) -> Any:
    from urllib.parse import urlparse

    def handler(url: str, **kwargs: Any) -> Any:
        if scheme == "tcp":
            port = str(urlparse(url).port)
        else:
            port = os.environ.get("MASTER_PORT", "")
        rendezvous = original(url, **kwargs)
        if port == os.environ.get(PLUGIN_PORT_ENV) or AGENT_STORE_ENV not in os.environ:
            yield from rendezvous
            return
        value = os.environ.pop(AGENT_STORE_ENV)
        try:
            first = next(rendezvous)  # the store is created here: rank 0 hosts it
        finally:
            os.environ[AGENT_STORE_ENV] = value
        yield first
        yield from rendezvous

    handler._distrank_scoped = True  # type: ignore[attr-defined]
    return handler


#: After a test, how long a rank whose test did not fail waits for the other members of the
#: groups it made (or of a default group it made or replaced) to finish the test before they
#: are destroyed (seconds): gloo's ``init_process_group`` may return on one rank while a peer
#: still connects to it.
MEET_WAIT = 2.0
#: A group whose own timeout is at most this (seconds) is a test of that timeout: a member may
#: wait in a collective on it until the timeout ends it, and the meeting waits as long (and
#: :data:`MEET_WAIT` more). Longer timeouts (torch's default, 30 min) are no test's subject.
SHORT_TIMEOUT = 120.0
#: How often a rank that meets its peers looks whether they finished (seconds).
MEET_POLL = 0.02
#: The process groups (identity, name) a rank held after its previous test: those it holds
#: beyond them now, the test made (or a fixture of the test's).
_HELD: set[tuple[int, str]] = set()


def meet_before_destroy(ctx: RankContext, failed: bool, done: Callable[[int], bool]) -> None:
    """After a test that made process groups (its own, a fixture's) or made or replaced the
    default group, and did not fail here, wait until the other members of those groups finished
    it too (``done(rank)``: the pool's shared phase array, where each rank says so without a
    write to the store), died, or :func:`_meet_wait` passed.

    The plugin destroys what the test left right after it (``group_problem``, the leftover
    check), and destroying one member's side breaks the group under the others: gloo's
    ``init_process_group`` may return on one rank while a peer still connects to it
    ("Connection closed by peer"), and a peer may wait in a collective on it that its group's
    short timeout will end, as the test expects (PyTorch's ``test_barrier_timeout_group``: only
    rank 0 calls the barrier; destroyed under it, it failed with "Connection reset by peer"
    instead). A rank whose test failed does not wait: its destroy is what errors out a peer
    left blocked in a collective it will never enter (DeepSpeed's harness relies on that), and
    its failure went out already. The wait is bounded: a rank that waits has not sent its last
    reports, and the deadlock watch counts it as running.
    """
    with contextlib.suppress(Exception):
        made, members = _made_groups(ctx)
        peers = sorted(members - {ctx.rank})
        end = time.monotonic() + _meet_wait(made)
        pids: dict[int, int] = {}
        while not failed and peers and time.monotonic() < end:
            peers = [r for r in peers if not done(r) and _alive(ctx, r, pids)]
            if peers:
                time.sleep(MEET_POLL)


def _made_groups(ctx: RankContext) -> tuple[list[Any], set[int]]:
    """The groups the test made (none for a new default group: every rank is a member) and the
    ranks to meet before destroying what it made: none when it made nothing."""
    import torch.distributed as dist

    from ...rank.ownedgroups import is_owned

    if not dist.is_initialized() or ctx.backend == "fake":
        return [], set()  # a simulated world is one process: no peer to meet
    if dist.group.WORLD is not ctx.pg:
        return [], set(range(ctx.world_size))
    held = {(id(pg), str(pg.group_name)): pg for pg in _compat.process_groups()}
    made = [
        pg
        for key, pg in held.items()
        if key not in _HELD and pg is not dist.group.WORLD and not is_owned(pg)
    ]
    _HELD.clear()
    _HELD.update(held)
    members: set[int] = set()
    for pg in made:
        with contextlib.suppress(Exception):
            members.update(dist.get_process_group_ranks(pg))
    return made, members


def _meet_wait(made: list[Any]) -> float:
    """:data:`MEET_WAIT`, or longer where a group the test made has a short timeout of its own:
    a peer may still wait in a collective on it until that timeout ends it."""
    longest = 0.0
    for pg in made:
        seconds = _group_timeout(pg)
        if seconds is not None and seconds <= SHORT_TIMEOUT:
            longest = max(longest, seconds)
    return MEET_WAIT + longest


def _group_timeout(pg: Any) -> float | None:
    """A group's own timeout in seconds (its backend's options; torch 2.13), None if unknown."""
    import torch

    for device in ("cpu", "cuda"):
        with contextlib.suppress(Exception):
            return float(pg._get_backend(torch.device(device)).options._timeout.total_seconds())
    return None


def register_pid(ctx: RankContext) -> None:
    """Write this rank's pid into the pool's store: a peer meeting it after a test
    (:func:`meet_before_destroy`) stops waiting for it once it died."""
    ctx.store.set(f"distrank-pid/{ctx.rank}", str(os.getpid()))


def _alive(ctx: RankContext, rank: int, pids: dict[int, int]) -> bool:
    """Whether ``rank``'s process still runs (not gone, not a zombie); True when unknown.
    ``pids``: those read from the store so far."""
    try:
        if rank not in pids:
            key = f"distrank-pid/{rank}"
            if not ctx.store.check([key]):
                return True
            pids[rank] = int(ctx.store.get(key))
        with open(f"/proc/{pids[rank]}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    except Exception:
        return True
    return state not in (b"Z", b"X")


def group_problem(ctx: RankContext) -> str:
    """After a test: what happened to the pool's default group ("" when it is still its own).

    Under ``init_process_group=False`` whatever group the test left is destroyed here.
    """
    import torch.distributed as dist

    if ctx.pg is None:
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        return "left a process group that could not be destroyed" if dist.is_initialized() else ""
    if not dist.is_initialized():
        return "left the default process group destroyed"
    if dist.group.WORLD is not ctx.pg:
        return "replaced the default process group (init_process_group was called again)"
    return ""

"""A rank process's place among processes: its parent, its process group, its environment.

Runs in each pool rank process, first thing after the fork server (or spawn) started it
(:func:`entry.rank_main`), before its pytest session begins; :func:`end_with_controller` runs
in the rank when the controller is gone.

A rank dies with the controller, and what it and its tests started dies with it, even after
``kill -9`` of the controller: the rank's parent (the fork server, which exits when the
controller does, or the controller itself under spawn) sends it :data:`PARENT_DEATH` as it dies
(``PR_SET_PDEATHSIG``). A Python signal handler would not run while the rank is blocked in C++
(a collective), so the signal is blocked in every thread and a thread waiting in ``sigwait``
takes it (as :mod:`rankfr` does for its own signal): it kills the rank's descendants, what
carries its pool's tag, its process group, and the rank last (:mod:`reaper`'s three nets).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
from typing import NoReturn

from ... import _compat
from ...envvars import POOL_TAG_ENV, RANK_ENV
from ...rank import reaper
from ..protocol import RankConfig
from . import harnessenv
from .rankgroup import MASTER_ADDR

_PR_SET_PDEATHSIG = 1
#: What the kernel sends a rank when its parent dies: a real-time signal nothing else uses, so
#: blocking it in the rank (and in what its tests start, who inherit the mask) changes nothing.
PARENT_DEATH = signal.SIGRTMIN + 5


def detach_from_controller_tree(expected_parent: int) -> None:
    """Die with the controller, and keep Ctrl-C out.

    The fork server hands every child a copy of the write end of its "alive" pipe; while a rank
    holds it, the fork server never sees the controller die. Close it, and ask the kernel to
    send :data:`PARENT_DEATH` to this rank when its parent (the fork server, or the controller
    under spawn) dies; a thread waits for it (:func:`_watch_parent`).
    """
    _compat.close_fork_server_alive_fd()
    _start_watcher()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, PARENT_DEATH, 0, 0, 0)
    if os.getppid() != expected_parent:
        os._exit(1)  # the parent died before prctl took effect (nothing started yet)
    reaper.become_subreaper()  # orphans of what the tests start stay findable (reaper.py)
    # Own process group: the terminal's SIGINT goes to the controller only, and the controller
    # can kill this rank together with any processes it starts.
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)


def _start_watcher() -> None:
    """Block :data:`PARENT_DEATH` in this (still single-threaded) process and start the thread
    that waits for it. The thread is made with every signal blocked, so that no other signal
    (the flight recorder's, the stack dump's) is ever delivered to it."""
    everything = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        threading.Thread(target=_watch_parent, name="distrank-parent-death", daemon=True).start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, everything | {PARENT_DEATH})


def _watch_parent() -> None:
    signal.sigwait({PARENT_DEATH})
    end_with_controller()


def end_with_controller() -> NoReturn:
    """The controller is gone (its pipe closed, or the parent-death signal): kill everything
    this rank and its tests started, then leave. Nothing is reported: no one is listening."""
    me = os.getpid()
    found = reaper.descendants([me])  # orphans too: the rank is their subreaper
    tag = harnessenv.pool_tag()  # not os.environ: a harness test's environment is its child's
    if tag:
        found |= reaper.tagged(tag)  # what left the tree (the pool's other ranks' too)
    found.discard(me)
    reaper.kill_all(found)
    if os.getpgrp() == me:  # the rank's own group: children that left neither tree nor tag
        with contextlib.suppress(OSError):
            os.killpg(me, signal.SIGKILL)  # the rank too
    os._exit(1)


def rank_env(cfg: RankConfig) -> dict[str, str]:
    """The rank's whole environment: the controller's, plus what torchrun would set."""
    env = dict(cfg.env)
    env.pop("PYTEST_ADDOPTS", None)
    rank, size = cfg.rank, cfg.world_size
    if cfg.simulated is not None:  # the rank it plays in a simulated world
        rank, size = cfg.simulated[2], cfg.simulated[1]
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(size),
        LOCAL_RANK=str(cfg.local_rank),
        LOCAL_WORLD_SIZE=str(cfg.world_size),
        GROUP_RANK="0",
        ROLE_RANK=str(rank),
        ROLE_WORLD_SIZE=str(size),
        MASTER_ADDR=MASTER_ADDR,
        # MASTER_PORT is set once rank 0 hosts a store (rankgroup.master_store). torchrun's
        # convention: the store at MASTER_ADDR:MASTER_PORT is hosted by someone else (here: a
        # TCPStore that rank 0 serves beside its test code), so every rank is a client (else
        # rank 0 would try to host a second store on the port).
        TORCHELASTIC_USE_AGENT_STORE="True",
        TORCHELASTIC_RESTART_COUNT="0",
    )
    env[RANK_ENV] = str(cfg.rank)
    env[POOL_TAG_ENV] = cfg.store_path  # unique per pool: see reaper.py
    return env

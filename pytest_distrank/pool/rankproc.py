"""A rank process's place among processes: its parent, its process group, its environment.

Runs in each pool rank process, first thing after the fork server (or spawn) started it
(:func:`worker.rank_main`), before its pytest session begins.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

from .. import _compat, reaper
from .protocol import RankConfig
from .rankgroup import MASTER_ADDR

_PR_SET_PDEATHSIG = 1


def detach_from_controller_tree(expected_parent: int) -> None:
    """Die with the controller, and keep Ctrl-C out.

    The fork server hands every child a copy of the write end of its "alive" pipe; while a rank
    holds it, the fork server never sees the controller die. Close it, and ask the kernel to
    SIGKILL this rank when its parent (the fork server, or the controller under spawn) dies.
    """
    _compat.close_fork_server_alive_fd()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != expected_parent:
        os._exit(1)  # the parent died before prctl took effect
    reaper.become_subreaper()  # orphans of what the tests start stay findable (reaper.py)
    # Own process group: the terminal's SIGINT goes to the controller only, and the controller
    # can kill this rank together with any processes it starts.
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)


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
        DISTRANK_RANK=str(cfg.rank),
    )
    env[reaper.POOL_TAG_ENV] = cfg.store_path  # unique per pool: see reaper.py
    return env

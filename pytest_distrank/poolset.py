"""The controller's pools: start them (through the fork server), reuse, retire, stop, count.

Runs in the controller. :class:`PoolSet` owns every :class:`~pool.Pool` of the session, the fork
server they come from, the private working folder (stores, rank logs, shared folders) and the
numbers the ``distrank`` summary and ``DISTRANK_STATS_FILE`` report. The controller asks it for
the pool of a key and tells it when a pool is done or broken.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import multiprocessing
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .gpus import GpuLease, GpuUnavailable, lease
from .pool import Pool, PoolKey
from .protocol import RankConfig
from .rankargs import coverage_settings, rank_pytest_args
from .settings import Settings

#: Modules the fork server imports once, so that every rank starts with them in memory. The last
#: one freezes the fork server's heap (cheap exit, copy-on-write friendly ranks).
PRELOAD = [
    "torch",
    "torch.distributed",
    "pytest",
    "pytest_distrank.plugin",
    "pytest_distrank.preload",
]
#: How long ranks get to tear down and exit at the end of the session.
STOP_TIMEOUT = 10.0


@dataclasses.dataclass(frozen=True)
class PoolStart:
    """One pool start: seconds to ready (fork server wait and forks, then ranks getting ready)."""

    world_size: int
    start_seconds: float
    fork_seconds: float
    ready_seconds: float
    #: It replaced a pool of the same key that a fault killed.
    after_fault: bool


@dataclasses.dataclass
class Stats:
    tests: int = 0
    pools_started: dict[int, int] = dataclasses.field(default_factory=dict)
    replaced: list[str] = dataclasses.field(default_factory=list)
    #: One entry per pool start: world size, seconds to ready, whether it replaced a killed pool.
    pools: list[PoolStart] = dataclasses.field(default_factory=list)
    test_seconds: list[float] = dataclasses.field(default_factory=list)
    #: Seconds pools spent waiting for GPUs that other pytest processes held.
    gpu_wait_seconds: float = 0.0

    def dump(self, path: str) -> None:
        """Write the numbers as JSON (``DISTRANK_STATS_FILE``; bench/ and tests read it)."""
        data = {
            "tests": self.tests,
            "pools": [dataclasses.asdict(p) for p in self.pools],
            "replaced": self.replaced,
            "test_seconds": self.test_seconds,
            "gpu_wait_seconds": self.gpu_wait_seconds,
        }
        Path(path).write_text(json.dumps(data, indent=1))


def plugin_modules(config: pytest.Config) -> list[str]:
    """pytest's own plugin modules and installed pytest plugins: what every rank imports anyway.

    Imported once in the fork server instead of in every rank's pytest session (pdb, junitxml,
    xdist and execnet, pytest-cov ...: about 50 modules). Only library code: a conftest.py or
    a test module is never preloaded.
    """
    from _pytest.config import default_plugins

    names = [f"_pytest.{name}" for name in default_plugins]
    for plugin, _dist in config.pluginmanager.list_plugin_distinfo():
        name = getattr(plugin, "__name__", None)
        if isinstance(name, str) and not name.startswith("pytest_distrank"):
            names.append(name)
    return names


class PoolSet:
    """Every pool of the session, by key; at most one live pool per key."""

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        self.live: dict[PoolKey, Pool] = {}
        #: Pools asked to stop, collected at the next retirement or at the session's end.
        self.stopping: list[Pool] = []
        #: Teardown errors of pools collected before the session's end, shown at its end.
        self.stop_errors: list[str] = []
        self.killed_keys: set[PoolKey] = set()
        #: Keys whose GPU lease timed out once; they do not wait again.
        self.gpu_starved: set[PoolKey] = set()
        self.stats = Stats()
        self.next_pool_id = 0
        self._context: Any = None
        self._workdir: Path | None = None

    @property
    def workdir(self) -> Path:
        """The session's private folder: stores, rank logs and basetemps, shared folders."""
        if self._workdir is None:
            factory = getattr(self.config, "_tmp_path_factory", None)
            base = factory.getbasetemp() if factory is not None else None
            self._workdir = Path(tempfile.mkdtemp(prefix="distrank-", dir=base))
        return self._workdir

    @property
    def fork_server_started(self) -> bool:
        return self._context is not None

    def get(self, key: PoolKey, nodeids: list[str], files: list[str], timeout: float) -> Pool:
        """The live pool of ``key``, started now if there is none (raises PoolStartError)."""
        pool = self.live.get(key)
        if pool is None:
            pool = self._start(key, nodeids, files, timeout)
            self.live[key] = pool
        return pool

    def _start(self, key: PoolKey, nodeids: list[str], files: list[str], timeout: float) -> Pool:
        gpu_lease = self._lease(key)
        env = dict(os.environ)
        if gpu_lease is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu_lease.cuda_visible_devices
        self.next_pool_id += 1
        pool_id = self.next_pool_id
        coverage = coverage_settings(self.config)
        configs = [
            RankConfig(
                rank=rank,
                world_size=key.world_size,
                local_rank=rank,
                backend=key.backend,
                init_process_group=key.init_process_group,
                pool_id=pool_id,
                store_path=str(self.workdir / f"pool{pool_id}.store"),
                pytest_args=tuple(
                    rank_pytest_args(
                        self.config, files, self.workdir / f"pool{pool_id}-rank{rank}-tmp"
                    )
                ),
                env=env,
                log_path=str(self.workdir / f"pool{pool_id}-rank{rank}.log"),
                nodeids=tuple(nodeids),
                coverage=coverage,
                files=tuple(files),
            )
            for rank in range(key.world_size)
        ]
        with self.capture_suspended():
            try:
                context, parent_pid = self.mp_context()
                pool = Pool(key, pool_id, context, configs, parent_pid)
            except BaseException:
                if gpu_lease is not None:
                    gpu_lease.release()
                raise
            pool.lease = gpu_lease
            started = self.stats.pools_started
            started[key.world_size] = started.get(key.world_size, 0) + 1
            try:
                pool.start(timeout)
            except BaseException:
                pool.kill()  # also on Ctrl-C mid-start: no rank outlives it, the GPUs go back
                raise
        self.stats.pools.append(
            PoolStart(
                world_size=key.world_size,
                start_seconds=pool.start_seconds,
                fork_seconds=pool.fork_seconds,
                ready_seconds=pool.ready_seconds,
                after_fault=key in self.killed_keys,
            )
        )
        return pool

    def _lease(self, key: PoolKey) -> GpuLease | None:
        """Lease the pool's GPUs, waiting for other pytest processes; raise GpuUnavailable.

        A key that waited in vain once does not wait again: its later tests take what is free
        at that moment or are skipped at once.
        """
        if key.gpus == 0:
            return None
        shared_key = dataclasses.replace(key, isolated=0)
        wait = self.settings.gpu_wait
        seconds = 0.0 if shared_key in self.gpu_starved else wait.value
        try:
            gpu_lease = lease(key.gpus, self.settings.gpu_lock_dir.value, seconds)
        except GpuUnavailable as exc:
            self.gpu_starved.add(shared_key)
            again = "; this pool waited in vain before, not again" if wait.value > seconds else ""
            raise GpuUnavailable(
                f"{exc}\n(--distrank-gpu-wait: {wait.value:g} s, from {wait.source}{again}). "
                "Free GPUs or raise --distrank-gpu-wait; a lease ends with its pytest process."
            ) from None
        self.stats.gpu_wait_seconds += gpu_lease.waited
        return gpu_lease

    def mp_context(self) -> tuple[Any, int]:
        """The multiprocessing context ranks start from, and the pid that will be their parent.

        Under forkserver the first call starts the server (it imports PRELOAD and the user's
        ``--distrank-preload`` modules); ranks check their parent's pid after setting
        PDEATHSIG.
        """
        method = self.settings.start_method.value
        if self._context is None:
            self._context = multiprocessing.get_context(method)
            if method == "forkserver":
                wanted = [*plugin_modules(self.config), *self.settings.preload.value]
                extra = [m for m in dict.fromkeys(wanted) if m not in PRELOAD]
                # preload (the heap freeze) stays last.
                self._context.set_forkserver_preload([*PRELOAD[:-1], *extra, PRELOAD[-1]])
        if method == "forkserver":
            from multiprocessing import forkserver

            forkserver.ensure_running()
            return self._context, int(forkserver._forkserver._forkserver_pid)  # type: ignore[attr-defined]
        return self._context, os.getpid()

    @contextlib.contextmanager
    def capture_suspended(self) -> Iterator[None]:
        """The fork server inherits fds 1 and 2: start it while pytest's capture is off."""
        capman = self.config.pluginmanager.getplugin("capturemanager")
        if capman is None:
            yield
            return
        with capman.global_and_fixture_disabled():
            yield

    def retire(self, key: PoolKey, pool: Pool, reason: str | None, graceful: bool) -> None:
        """The pool is done (``graceful``: its last test ran) or broken (``reason``): kill it."""
        if self.live.get(key) is pool:
            del self.live[key]
        if reason is not None:
            self.stats.replaced.append(f"{key.describe()}: {reason}")
            self.killed_keys.add(key)
        if graceful:
            # Pools asked to stop earlier have had a whole test to exit: collect them now, so
            # that finished processes do not hold pipes until the session ends.
            self.stop_errors.extend(self._collect_stopping())
            pool.request_stop()
            self.stopping.append(pool)
        else:
            pool.kill()

    def _collect_stopping(self) -> list[str]:
        errors: list[str] = []
        while self.stopping:
            errors.extend(self.stopping.pop(0).finish_stop(STOP_TIMEOUT))
        return errors

    def stop_all(self) -> list[str]:
        """Stop every pool: ask all first, then collect them (stopping is not serial).

        Returns the teardown errors of every pool stopped in this session.
        """
        pools = list(self.live.values())
        self.live.clear()
        for pool in pools:
            pool.request_stop()
        self.stopping.extend(pools)
        errors = [*self.stop_errors, *self._collect_stopping()]
        self.stop_errors.clear()
        return errors

    def kill_all(self) -> None:
        """Last resort at unconfigure: nothing the plugin started outlives the session."""
        for pool in [*self.live.values(), *self.stopping]:
            pool.kill()
        self.live.clear()
        self.stopping.clear()

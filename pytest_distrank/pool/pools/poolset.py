"""The controller's pools: start them (through the fork server), reuse, retire, stop, count.

Runs in the controller. :class:`PoolSet` owns every :class:`~pool.Pool` of the session, the fork
server they come from (:class:`~forkserver.ForkServer`), the rank templates fresh pools are
forked from (templates.py), the private working folder (stores, rank logs, shared folders) and
the numbers the ``distrank`` summary and ``DISTRANK_STATS_FILE`` report. The controller asks it for
the pool of a key and tells it when a pool is done or broken.

What a pool start needs beyond its ranks fails as an error of the tests that needed it, never of
the run (:class:`SessionStartError`): the private folder (made again when it vanished, tried again
by the next test when it could not be made), the GPU lock folder, and the fork server, whose
socket is kept short enough for ``AF_UNIX`` and whose start is bounded by the pool start limit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ... import _compat
from ...envvars import START_TIMEOUT_ENV
from ...options import LEFTOVERS_IGNORE_ENV, LEFTOVERS_IGNORE_THREADS, WORLD_SIZE
from ...parsing import FORKSERVERS, parse_seconds
from ...planning.gpuplan import share_env
from ...settings import Settings, Value
from ..onetest.debugrelay import DebugTerminal
from ..protocol import DebugSettings, RankConfig
from ..workerinput import RankInputs
from .cmdline import coverage_settings, rank_command_line
from .forkserver import ForkServer, SessionStartError
from .gpus import GpuFolderError, GpuLease, SessionLeases
from .memoryback import MemoryWatch
from .pool import Pool, PoolStartError
from .poolkey import PoolKey
from .preloads import files_preloads
from .stats import PoolStart, Stats
from .templates import TemplateError, Templates, fork_from, kind_of

#: How long ranks get to tear down and exit at the end of the session (or of a replay's pool).
STOP_TIMEOUT = 10.0
#: A pool must be ready within this long (or the test's own timeout, if that is longer).
START_TIMEOUT = 120.0
#: A pool with more ranks than this per CPU core gets a line in the summary: slow to start.
RANKS_PER_CORE = 8


def start_timeout_from_env() -> Value[float] | None:
    """``DISTRANK_START_TIMEOUT``, or None when it is not set (raise UsageError if invalid)."""
    raw = os.environ.get(START_TIMEOUT_ENV, "")
    if not raw.strip():
        return None
    source = f"{START_TIMEOUT_ENV}={raw} (environment)"
    try:
        return Value(parse_seconds(raw), source)
    except ValueError as exc:
        raise pytest.UsageError(
            f"pytest-distrank: invalid value {raw!r} for {START_TIMEOUT_ENV}, from {source}:\n"
            f"  {exc}"
        ) from None


class PoolSet:
    """Every pool of the session, by key; at most one live pool per key."""

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        self.live: dict[PoolKey, Pool] = {}
        #: Template ranks that fresh pools are forked from, by kind (templates.py).
        self.templates = Templates()
        #: Pools asked to stop, collected at the next retirement or at the session's end.
        self.stopping: list[Pool] = []
        #: Teardown errors of pools collected before the session's end, shown at its end.
        self.stop_errors: list[str] = []
        self.killed_keys: set[PoolKey] = set()
        self.stats = Stats()
        self.next_pool_id = 0
        self._workdir: Path | None = None
        #: Where the ranks read the test modules the controller rewrote (controller.py).
        self.rewritten = ""
        #: Why the session's folder could not be made when the fork server started early (at
        #: collection): the first pool start reports it, once; the next one tries again.
        self._early_workdir_problem: str | None = None
        #: Overrides every pool's start limit (DISTRANK_START_TIMEOUT).
        self.start_timeout = start_timeout_from_env()
        #: The fork server ranks are forked from (forkserver.py).
        self.server = ForkServer(config, settings, self._live_workdir, self.start_timeout)
        #: Lines for the ``distrank`` summary: world sizes far beyond the machine's cores.
        self.notes: list[str] = []
        self._crowded: set[int] = set()
        #: The session's GPU leases (gpus.py), and their GPUs' memory (memoryback.py).
        memory = MemoryWatch(settings.gpu_memory_wait, self.notes)
        self.leases = SessionLeases(settings.gpu_lock_dir, settings.gpu_wait, memory)
        #: The controller's terminal, for debuggers that ranks open while they start.
        self.terminal: DebugTerminal | None = None
        #: Each rank's config.workerinput: plugins' values, as xdist hands them over.
        self.inputs = RankInputs(config, self.notes)
        #: The session seed every rank's random state derives from (the controller's), or None.
        self.seed: int | None = None

    @property
    def workdir(self) -> Path:
        """The session's private folder: stores, rank logs and basetemps, shared folders.

        Made in pytest's basetemp at the first pool start; raises :class:`SessionStartError`
        when it cannot be made (then the next pool start tries again).
        """
        if self._workdir is None:
            base: Path | None = None
            try:
                base = _compat.getbasetemp(self.config)
                self._workdir = Path(tempfile.mkdtemp(prefix="distrank-", dir=base))
            except OSError as exc:
                raise SessionStartError(self._workdir_problem(base, exc)) from None
        return self._workdir

    def _workdir_problem(self, base: Path | None, exc: OSError) -> str:
        given = getattr(self.config.option, "basetemp", None)
        where = str(base or (os.path.abspath(given) if given else tempfile.gettempdir()))
        source = f"from --basetemp={given} (command line)" if given else "in the system temp folder"
        source = f"pytest's basetemp, {source}"
        return (
            f"pytest-distrank could not make its folder under {where}: {exc}\n"
            f"The folder holds the pools' stores, rank logs and shared folders; it is made in "
            f"{source}.\nPoint --basetemp at a writable folder with free space that no other "
            "pytest run uses at the same time (a run empties its --basetemp when it starts)."
        )

    def _live_workdir(self) -> Path:
        """:attr:`workdir`, made again if it vanished (another run emptied a shared basetemp);
        the fork server's socket went with it, so a new server starts in the new folder."""
        if self._workdir is not None and not self._workdir.is_dir():
            self._workdir = None
            self.server.forget()  # (only a running fork server of this session)
        return self.workdir

    def get(self, key: PoolKey, nodeids: list[str], files: list[str], timeout: float) -> Pool:
        """The live pool of ``key``, started now if there is none (raises PoolStartError).

        ``timeout`` bounds the start, unless DISTRANK_START_TIMEOUT is set.
        """
        pool = self.live.get(key)
        if pool is None:
            if self.start_timeout is not None:
                timeout = self.start_timeout.value
            pool = self._start(key, nodeids, files, timeout)
            self.live[key] = pool
        return pool

    def start_apart(
        self, key: PoolKey, nodeids: list[str], files: list[str], timeout: float
    ) -> Pool:
        """A pool of its own, kept out of the live ones: its user stops it (the replays)."""
        pool = self.get(key, nodeids, files, timeout)
        del self.live[key]
        return pool

    def _note_crowded(self, key: PoolKey, nodeids: list[str]) -> None:
        cores = os.cpu_count() or 1
        if key.world_size <= RANKS_PER_CORE * cores or key.world_size in self._crowded:
            return
        self._crowded.add(key.world_size)
        tests = nodeids[0] + (f" and {len(nodeids) - 1} more" if len(nodeids) > 1 else "")
        self.notes.append(
            f"world size {key.world_size} ({tests}) runs more than {RANKS_PER_CORE} ranks per "
            f"CPU core ({cores} {'core' if cores == 1 else 'cores'}): its ranks take turns on "
            "the cores, so its pool starts slowly and its collectives may time out; lower the "
            "world size or use a bigger machine"
        )

    def _start(self, key: PoolKey, nodeids: list[str], files: list[str], timeout: float) -> Pool:
        problem, self._early_workdir_problem = self._early_workdir_problem, None
        if problem is not None:
            raise SessionStartError(problem)
        workdir = self._live_workdir()
        self._note_crowded(key, nodeids)
        gpu_lease = self._lease(key)
        env = dict(os.environ)
        # A rank parametrizes a bare world_size() beside simulate() with the default size too.
        env[WORLD_SIZE.env] = str(self.settings.world_size.value)
        if gpu_lease is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu_lease.cuda_visible_devices
        env.update(share_env(key.gpu_share))  # several ranks per GPU: NCCL's switch
        coverage = coverage_settings(self.config)
        debug = self.debug_settings()
        pool_id, configs = self._configs(key, nodeids, files, env, workdir, coverage, debug)
        with self.capture_suspended():
            try:
                started_at = time.monotonic()
                context, parent_pid = self.server.context_for(timeout)
                fork = None
                if self._forks_fresh_ranks(key, coverage, debug):
                    made = (nodeids, files, env, workdir, timeout, context, parent_pid)
                    fork = self._templates(key, *made)
                    phases = str(workdir / f"pool{pool_id}.phases")
                    configs = [dataclasses.replace(c, phases_path=phases) for c in configs]
                fork_server_wait = time.monotonic() - started_at
                pool = Pool(key, pool_id, context, configs, parent_pid, fork)
            except TemplateError as exc:  # (no GPU lease: templates are for CPU pools only)
                self._refuse(kind_of(key), str(exc))
                return self._start(key, nodeids, files, timeout)
            except BaseException:
                if gpu_lease is not None:
                    gpu_lease.release()
                raise
            pool.lease = gpu_lease
            started = self.stats.pools_started
            sim = key.simulated
            kind = (sim.size, sim.mode) if sim is not None else (key.world_size, "")
            started[kind] = started.get(kind, 0) + 1
            try:
                pool.start(timeout, self.terminal)
            except TemplateError as exc:  # its fresh ranks start from nothing from now on
                pool.kill()
                started[kind] -= 1
                self._refuse(kind_of(key), str(exc))
                return self._start(key, nodeids, files, timeout)
            except BaseException:
                pool.kill()  # also on Ctrl-C mid-start: no rank outlives it, the GPUs go back
                raise
        pool.uncharged = pool.start_seconds + fork_server_wait
        self.stats.pools.append(
            PoolStart(
                world_size=key.world_size,
                start_seconds=pool.start_seconds + fork_server_wait,
                fork_seconds=pool.fork_seconds + fork_server_wait,
                ready_seconds=pool.ready_seconds,
                after_fault=key in self.killed_keys,
            )
        )
        return pool

    def _forks_fresh_ranks(
        self,
        key: PoolKey,
        coverage: dict[str, Any] | None,
        debug: DebugSettings,
    ) -> bool:
        """Whether this pool's fresh ranks are forked from templates (see templates.py)."""
        kind = kind_of(key)
        return (
            key.isolated != 0
            and kind not in self.templates.refused
            and self.settings.fresh_ranks.value == "fork"
            and self.settings.start_method.value in FORKSERVERS
            and coverage is None
            and not (debug.post_mortem or debug.trace or debug.live_rank is not None)
            and key.simulated is None
            and key.gpus == 0
        )

    def _refuse(self, kind: PoolKey, why: str) -> None:
        """The templates of ``kind`` cannot fork: they go, and its fresh ranks start from
        nothing, said once in the summary."""
        self.templates.drop(kind)
        self.templates.refused[kind] = why
        self.notes.append(
            f"fresh ranks of {kind.describe()} start from nothing, not forked from templates: {why}"
        )

    def _templates(
        self,
        key: PoolKey,
        nodeids: list[str],
        files: list[str],
        env: dict[str, str],
        workdir: Path,
        timeout: float,
        context: Any,
        parent_pid: int,
    ) -> Callable[[RankConfig, Any], Any]:
        """How the pool's ranks start: forked from the templates of its kind (started now, the
        first time; a pool start's errors if they cannot start)."""
        kind = kind_of(key)
        template = self.templates.get(kind)
        if template is None:
            debug = DebugSettings()
            tid, configs = self._configs(kind, nodeids, files, env, workdir, None, debug)
            preload = files_preloads(files, self.config.invocation_params.dir)
            configs = [dataclasses.replace(c, template=True, preload=preload) for c in configs]
            template = Pool(kind, tid, context, configs, parent_pid)
            try:
                template.start(timeout, self.terminal)
            except PoolStartError as exc:  # its fresh ranks start from nothing, said why
                template.kill()
                raise TemplateError(f"its templates did not start: {exc}") from None
            except BaseException:
                template.kill()
                raise
            for old in self.templates.add(kind, template):
                old.request_stop()  # after its children's pools: stopping is collected in order
                self.stopping.append(old)
        return fork_from(template)

    def _configs(
        self,
        key: PoolKey,
        nodeids: list[str],
        files: list[str],
        env: dict[str, str],
        workdir: Path,
        coverage: dict[str, Any] | None,
        debug: DebugSettings,
    ) -> tuple[int, list[RankConfig]]:
        """A new pool number and its ranks' configurations."""
        self.next_pool_id += 1
        pool_id = self.next_pool_id
        configs = [
            RankConfig(
                rank=rank,
                world_size=key.world_size,
                local_rank=rank,
                backend=key.backend,
                init_process_group=key.init_process_group,
                pool_id=pool_id,
                store_path=str(workdir / f"pool{pool_id}.store"),
                cmdline=rank_command_line(
                    self.config,
                    workdir / f"pool{pool_id}-rank{rank}-tmp",
                    # The debug rank writes straight to its log, which the controller shows live.
                    live=rank == debug.live_rank,
                ),
                env=env,
                log_path=str(workdir / f"pool{pool_id}-rank{rank}.log"),
                nodeids=tuple(nodeids),
                coverage=coverage,
                files=tuple(files),
                debug=debug,
                rewritten=self.rewritten,
                simulated=(
                    (sim.mode, sim.size, sim.rank, sim.device) if (sim := key.simulated) else None
                ),
                cuda_device=key.cuda_device(rank),
                gpu_share=key.gpu_share,
                cuda_growth=self.settings.cuda_growth.value,
                leftovers=self.settings.leftovers.value,
                leftovers_ignore=(
                    tuple(self.config.getini(LEFTOVERS_IGNORE_ENV)),
                    tuple(self.config.getini(LEFTOVERS_IGNORE_THREADS)),
                ),
                workerinput=self.inputs.for_rank(pool_id, rank),
                seed=self.seed,
            )
            for rank in range(key.world_size)
        ]
        return pool_id, configs

    def debug_settings(self) -> DebugSettings:
        """What the ranks' debuggers do: ``--pdb``, ``--trace``, ``--distrank-debug-rank``."""
        option = self.config.option
        live = self.settings.debug_rank.value
        return DebugSettings(
            post_mortem=bool(getattr(option, "usepdb", False)),
            trace=bool(getattr(option, "trace", False)),
            trace_rank=live or 0,
            live_rank=live,
        )

    def _lease(self, key: PoolKey) -> GpuLease | None:
        """Lease the pool's GPUs (gpus.SessionLeases); raise GpuUnavailable, or
        SessionStartError for an unusable lock folder."""
        if key.gpus and any(pool.lease is not None for pool in self.stopping):
            # A finished pool of this session still holds GPUs until it is collected.
            self.stop_errors.extend(self._collect_stopping())
        try:
            gpu_lease = self.leases.take(key, dataclasses.replace(key, isolated=0))
        except GpuFolderError as exc:
            raise SessionStartError(str(exc)) from None
        if gpu_lease is not None:
            self.stats.gpu_wait_seconds += gpu_lease.waited
        return gpu_lease

    def start_fork_server(self) -> None:
        """Start the fork server now, beside collection (earlystart.py); never raises."""
        self._early_workdir_problem = self.server.start()

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
            pool = self.stopping.pop(0)
            errors.extend(pool.finish_stop(STOP_TIMEOUT))
            self.stats.rank_cpu.extend(pool.serving_cpu.values())
        return errors

    def stop_all(self) -> list[str]:
        """Stop every pool: ask all first, then collect them (stopping is not serial).

        Returns the teardown errors of every pool stopped in this session.
        """
        pools = list(self.live.values())
        self.live.clear()
        templates = self.templates.take_all()  # after the pools forked from them
        for pool in [*pools, *templates]:
            pool.request_stop()
        self.stopping.extend([*pools, *templates])
        errors = [*self.stop_errors, *self._collect_stopping()]
        self.stop_errors.clear()
        return errors

    def kill_all(self) -> None:
        """Last resort at unconfigure: nothing the plugin started outlives the session."""
        for pool in [*self.live.values(), *self.stopping]:
            pool.kill()
        self.templates.kill_all()
        self.live.clear()
        self.stopping.clear()

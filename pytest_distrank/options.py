"""The plugin's options: each one's command-line flag, ini key, environment variable, default,
parser and help text.

Runs in every pytest process of both modes: plugin.py registers each option from this table, and
:mod:`settings` resolves their values. Every option has one help text, shared by its command-line
flag and its ini key (the pytest-timeout convention): it is what ``pytest --help`` tells users.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from .parsing import (
    ALL_TIERS,
    one_of,
    parse_backend,
    parse_bool,
    parse_bytes,
    parse_gpu_range,
    parse_modules,
    parse_order,
    parse_path,
    parse_positive_int,
    parse_rank,
    parse_seconds,
    parse_seed,
    parse_start_method,
)

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Option(Generic[T]):
    """One setting: its command-line flag, ini key, environment variable and parser."""

    dest: str
    flag: str
    env: str
    default: str
    help: str
    parse: Callable[[str], T]
    is_flag: bool = False

    @property
    def ini(self) -> str:
        return self.dest


WORLD_SIZE = Option(
    "distrank_world_size",
    "--distrank-world-size",
    "DISTRANK_WORLD_SIZE",
    "2",
    "World size of tests marked @pytest.mark.world_size() without a size (default: 2).",
    parse_positive_int,
)
BACKEND = Option(
    "distrank_backend",
    "--distrank-backend",
    "DISTRANK_BACKEND",
    "gloo",
    "torch.distributed backend of tests whose marker names none (default: gloo; "
    "requires_nccl implies nccl).",
    parse_backend,
)
START_METHOD = Option(
    "distrank_start_method",
    "--distrank-start-method",
    "DISTRANK_START_METHOD",
    "forkserver",
    "How rank processes start: 'forkserver' (default: forked from a server that has torch "
    "imported, milliseconds per rank; with -p distrank that server is forked from pytest as it "
    "starts, before conftest.py files), 'forkserver-late' (the server starts beside collection, "
    "after conftest.py files, and imports torch again) or 'spawn' (a fresh interpreter per rank).",
    parse_start_method,
)
ISOLATE = Option(
    "distrank_isolate",
    "--distrank-isolate",
    "DISTRANK_ISOLATE",
    "false",
    "Run every distributed test in fresh rank processes instead of warm, reused pools.",
    parse_bool,
    is_flag=True,
)
TIMEOUT = Option(
    "distrank_timeout",
    "--distrank-timeout",
    "DISTRANK_TIMEOUT",
    "300",
    "Deadline in seconds for a distributed test's setup, call and teardown on all ranks "
    "(default: 300; 0 for none). @pytest.mark.timeout(N) and pytest-timeout's --timeout and "
    "'timeout' ini key are honoured too.",
    parse_seconds,
)
FAILURE_GRACE = Option(
    "distrank_failure_grace",
    "--distrank-failure-grace",
    "DISTRANK_FAILURE_GRACE",
    "5",
    "Seconds the other ranks get to finish after one rank failed, crashed or skipped, before "
    "their stacks are dumped and the pool is killed (default: 5).",
    parse_seconds,
)

PRELOAD = Option(
    "distrank_preload",
    "--distrank-preload",
    "DISTRANK_PRELOAD",
    "",
    "Extra modules the fork server imports once, before forking ranks, comma-separated (e.g. "
    "torch._dynamo,mypkg.models): every rank then starts with them in memory instead of "
    "importing them itself. A module that fails to import is skipped silently.",
    parse_modules,
)


GPU_LOCK_DIR = Option(
    "distrank_gpu_lock_dir",
    "--distrank-gpu-lock-dir",
    "DISTRANK_GPU_LOCK_DIR",
    os.path.join(tempfile.gettempdir(), "pytest-distrank-gpu-locks"),
    "Folder of the GPU lease lock files, one per GPU. Every pytest process (xdist workers, "
    "concurrent sessions) that points at the same folder gets GPUs disjoint from the others' "
    "(default: pytest-distrank-gpu-locks in the system temp folder).",
    parse_path,
)
GPU_WAIT = Option(
    "distrank_gpu_wait",
    "--distrank-gpu-wait",
    "DISTRANK_GPU_WAIT",
    "600",
    "Seconds a pool that needs GPUs waits for other pytest processes to release enough of "
    "them; after that its test is skipped (default: 600; 0 to skip at once).",
    parse_seconds,
)
GPU_MEMORY_WAIT = Option(
    "distrank_gpu_memory_wait",
    "--distrank-gpu-memory-wait",
    "DISTRANK_GPU_MEMORY_WAIT",
    "5",
    "Seconds a whole GPU lease waits for the GPUs' memory to come back to what they used when "
    "the session first leased them (the pool before may have left a process holding it); after "
    "that the pool starts anyway and the summary names the holder (default: 5; 0: no wait).",
    parse_seconds,
)
GPU_OVERSUBSCRIBE = Option(
    "distrank_gpu_oversubscribe",
    "--distrank-gpu-oversubscribe",
    "DISTRANK_GPU_OVERSUBSCRIBE",
    "false",
    "Let the ranks of an NCCL test share GPUs (rank r on GPU r mod n) when there are fewer GPUs "
    "than ranks: with NCCL >= 2.30 (NCCL_MULTI_RANK_GPU_ENABLE=1), else with gloo on CUDA "
    "tensors if --distrank-gpu-fallback=gloo; off: such tests are skipped (default: off).",
    parse_bool,
    is_flag=True,
)
GPU_FALLBACK = Option(
    "distrank_gpu_fallback",
    "--distrank-gpu-fallback",
    "DISTRANK_GPU_FALLBACK",
    "none",
    "With --distrank-gpu-oversubscribe and an NCCL older than 2.30: 'gloo' runs NCCL tests with "
    "gloo on the same CUDA tensors (collectives gloo cannot run on CUDA skip, naming the op); "
    "'none' skips them (default: none).",
    one_of(("none", "gloo")),
)
GPUS = Option(
    "distrank_gpus",
    "--distrank-gpus",
    "DISTRANK_GPUS",
    ALL_TIERS,
    "GPU tier of a CI runner: keep only the tests whose GPU need falls in it and deselect the "
    "rest: N, A-B, >=N (or N+), <=N, or 'all' (default). A test's need comes from its markers "
    "and the options (an NCCL test needs one GPU per rank, or one under "
    "--distrank-gpu-oversubscribe; requires_gpus(n) at least n), never from this machine's "
    "GPUs, so the tiers of a fleet partition the suite and --collect-only lists the same "
    "everywhere. Pool mode only.",
    parse_gpu_range,
)
CUDA_GROWTH = Option(
    "distrank_cuda_growth",
    "--distrank-cuda-growth",
    "DISTRANK_CUDA_GROWTH",
    "1GiB",
    "CUDA memory a rank may hold above its steady state (what it held after its first test) "
    "before its pool is replaced; each test that leaves memory allocated is named in the "
    "summary either way (default: 1GiB; 0: never replace).",
    parse_bytes,
)

LAUNCHERS = ("auto", "off", "torchrun", "slurm", "mpi")


parse_launcher = one_of(LAUNCHERS, lower=True)


LAUNCHER = Option(
    "distrank_launcher",
    "--distrank-launcher",
    "DISTRANK_LAUNCHER",
    "auto",
    "Launcher mode: when pytest runs inside a launched world (torchrun, srun, mpirun), each "
    "pytest process is one rank and rank 0 prints the one report. 'auto' (default) detects it "
    "from the environment (torchrun's variables win over Slurm's, Slurm's over MPI's); "
    "'torchrun', 'slurm' or 'mpi' insist on one; 'off' ignores the launcher's variables.",
    parse_launcher,
)

SUITES_MODES = ("warm", "own")


parse_suites = one_of(SUITES_MODES, lower=True)


SUITES = Option(
    "distrank_suites",
    "--distrank-suites",
    "DISTRANK_SUITES",
    "warm",
    "Test classes of PyTorch's own harness (MultiProcessTestCase, MultiProcContinuousTest and "
    "their subclasses): 'warm' (default) runs each test method on a warm pool of the class's "
    "world size, as the class's own harness would in fresh processes; 'own' leaves them to "
    "their harness (each test spawns its processes). A class opts out with the class "
    "attribute distrank_suites = 'own'.",
    parse_suites,
)


DEBUG_RANK = Option(
    "distrank_debug_rank",
    "--distrank-debug-rank",
    "DISTRANK_DEBUG_RANK",
    "",
    "Debug one rank: its output is shown live on the terminal, labelled, as the tests run, its "
    "stdin is this terminal (input(), pdb), --trace stops in it, and its pid is printed when "
    "its pool starts (for py-spy or gdb). Ranks of every pool with that rank number.",
    parse_rank,
)

SEED = Option(
    "distrank_seed",
    "--distrank-seed",
    "DISTRANK_SEED",
    "random",
    "Session seed of the random state each rank starts each distributed test from (torch, "
    "random, numpy): a state that depends only on this seed, the test's node id and the rank, "
    "so ranks draw different numbers, as separate processes would, and a test draws the same "
    "ones whatever ran before it. 'random' (default) picks a new seed and prints it in the "
    "header; N repeats a session's; 'off' leaves the random state alone.",
    parse_seed,
)
LEFTOVERS = Option(
    "distrank_leftovers",
    "--distrank-leftovers",
    "DISTRANK_LEFTOVERS",
    "restore",
    "What a distributed test leaves behind in its warm ranks (environment, working folder, "
    "torch defaults and flags, threads, process groups, compile state): 'restore' (default) "
    "restores what can be restored and names it in the summary, 'fail' also fails the test "
    "with an error at teardown, 'off' does not look. What cannot be restored gives the next "
    "test fresh ranks either way.",
    one_of(("restore", "fail", "off"), lower=True),
)
FRESH_RANKS = Option(
    "distrank_fresh_ranks",
    "--distrank-fresh-ranks",
    "DISTRANK_FRESH_RANKS",
    "fork",
    "How the ranks of a test that runs on fresh ranks start (--distrank-isolate, classes that "
    "ask for fresh ranks, replays, a harness test's fresh retry): 'fork' (default) forks each "
    "from a template rank of its kind that has pytest configured and has run no conftest.py "
    "and imported no test module (the fork loads, imports and collects them itself); 'start' "
    "starts each from nothing, its own whole pytest start (see docs/performance.md).",
    one_of(("fork", "start"), lower=True),
)
DEADLOCKS = Option(
    "distrank_deadlocks",
    "--distrank-deadlocks",
    "DISTRANK_DEADLOCKS",
    "end",
    "A distributed test whose ranks' flight records prove it can never finish (ranks in "
    "different collectives at the same step; ranks waiting in a collective that every missing "
    "member finished the test or died without entering): 'end' (default) ends it once its ranks "
    "stood still for 2 s, with the same report a deadline gives; 'wait' waits for the deadline.",
    one_of(("end", "wait"), lower=True),
)
REPLAY = Option(
    "distrank_replay",
    "--distrank-replay",
    "DISTRANK_REPLAY",
    "on",
    "After the session's tests, replay each distributed test that failed in a pool that had "
    "run other tests, on fresh ranks: alone, then after its pool's earlier tests, bisecting "
    "them to the test that makes it fail (its polluter); verdicts go to a summary section of "
    "their own and change no outcome (default: on; never under -x, --pdb or a launcher).",
    parse_bool,
)
REPLAY_BUDGET = Option(
    "distrank_replay_budget",
    "--distrank-replay-budget",
    "DISTRANK_REPLAY_BUDGET",
    "300",
    "Seconds the replays after the session may take, all together (default: 300; 0 for no "
    "limit): a bound, each replay's deadlines are cut to the budget left, and a test whose run "
    "took longer than what is left is not replayed. A search cut short says how far it got.",
    parse_seconds,
)
ORDER = Option(
    "distrank_order",
    "--distrank-order",
    "DISTRANK_ORDER",
    "collected",
    "Order of the tests within each module, to find tests that depend on the ones before "
    "them: 'collected' (default), 'reverse', 'random' (from the session seed, "
    "--distrank-seed) or 'random:SEED'. Modules keep their order; tests that share a class "
    "stay together.",
    parse_order,
)
#: Ini-only lists of what a test may leave behind unnamed (rank/leftovers.py).
LEFTOVERS_IGNORE_ENV = "distrank_leftovers_ignore_env"
LEFTOVERS_IGNORE_THREADS = "distrank_leftovers_ignore_threads"

PROCESS_TREE = Option(
    "distrank_process_tree",
    "--distrank-process-tree",
    "DISTRANK_PROCESS_TREE",
    "false",
    "Every test's process tree is part of its report (as @pytest.mark.process_tree): the "
    "stacks of the processes it started at a deadline or an interrupt, those that died during "
    "it, and all of them ended after it (docs/own-workers.md).",
    parse_bool,
    is_flag=True,
)
TREE_DEATHS = Option(
    "distrank_tree_deaths",
    "--distrank-tree-deaths",
    "DISTRANK_TREE_DEATHS",
    "report",
    "A process of a test's tree that died by a signal or a non-zero exit during the test: "
    "'report' (default: named in the test's report, its outcome unchanged) or 'fail' (the "
    "test fails for it).",
    one_of(("report", "fail")),
)

OPTIONS: tuple[Option[Any], ...] = (
    WORLD_SIZE,
    BACKEND,
    START_METHOD,
    ISOLATE,
    TIMEOUT,
    FAILURE_GRACE,
    PRELOAD,
    GPU_LOCK_DIR,
    GPU_WAIT,
    GPU_MEMORY_WAIT,
    GPU_OVERSUBSCRIBE,
    GPU_FALLBACK,
    GPUS,
    CUDA_GROWTH,
    LAUNCHER,
    SUITES,
    DEBUG_RANK,
    SEED,
    LEFTOVERS,
    FRESH_RANKS,
    DEADLOCKS,
    REPLAY,
    REPLAY_BUDGET,
    ORDER,
    PROCESS_TREE,
    TREE_DEATHS,
)

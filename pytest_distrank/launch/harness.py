"""Launcher mode: PyTorch's harness classes (``MultiProcessTestCase``, ``MultiProcContinuousTest``)
and DeepSpeed's ``DistributedTest`` on sub-worlds, run as pool mode runs them.

Runs in every rank of a launched world: :func:`register` at configure time (from
:func:`plugin.start_launched`). Pool mode's pieces do the work here too, handed over by the
plugin's gate (:class:`Suites`; launcher mode imports nothing of pool mode):
``pool.suites.SuitesPlugin`` makes each test of such a class a test of the class's world size
with ``init_process_group=False`` (the same on every rank, as rank 0's plan needs), and
``pool.worker.suiterank.SuiteRunner`` (``pool.worker.dsrank.DeepSpeedRunner``) runs it in the
rank the way the class's own harness runs it in the child it spawns. Rank 0's plan puts these
tests on home sub-worlds only (:func:`subworld.home_slots`: the test's rank i is its node's local
rank i, and the file the ranks meet in is on their own node), where no group of the plugin's is
up (:meth:`group.GroupKeeper.without_group`): the class makes its own.

The environment rule for PyTorch's classes is pool mode's (:mod:`pool.worker.harnessenv`): for
the length of the test the rank's environment is what the harness's child would have, its
parent's (the pytest process's) without what the launcher gave this process (:func:`child_env`).
Code under test that reads ``RANK``, ``MASTER_PORT`` or ``TORCHELASTIC_*`` sees what it sees
under the harness. DeepSpeed's child's part sets its own (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_SIZE``...) over the rank's, as over a pool rank's, and they are put back
after it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Protocol

import pytest

from ..rank.context import RankContext
from .env import Launch
from .group import GroupKeeper

#: What a launcher sets in the environment of each process it starts (torchrun's agent, Slurm's
#: task, Open MPI's and MPICH's ranks): no harness's child has them.
LAUNCHER_VARIABLES = frozenset(
    {
        "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID",
        "SLURM_NTASKS", "SLURM_STEP_ID", "SLURM_STEPID", "PMI_RANK", "PMI_SIZE",
        "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
    }
)  # fmt: skip
#: ... and the families of them.
LAUNCHER_PREFIXES = ("TORCHELASTIC_", "OMPI_COMM_WORLD_", "PMIX_RANK")


def child_env(env: Mapping[str, str], launch: Launch) -> dict[str, str]:
    """``env`` (the rank's at its start) without the launcher's variables: what a harness's
    child started by this pytest process would inherit had no launcher started it."""
    drop = LAUNCHER_VARIABLES | set(launch.variables)
    return {
        name: value
        for name, value in env.items()
        if name not in drop and not name.startswith(LAUNCHER_PREFIXES)
    }


class Runner(Protocol):
    """What this module uses of pool mode's runner of harness tests (a pytest plugin)."""

    def end_continuous(self, ctx: RankContext) -> None: ...

    def problem(self) -> str: ...


@dataclasses.dataclass(frozen=True)
class Suites:
    """Pool mode's pieces, from the plugin's gate: the runner, and how it learns the environment
    a harness's child inherits (``harnessenv.remember``)."""

    runner: Runner
    remember: Callable[[dict[str, str]], None]
    #: Pool mode's runner of DeepSpeed's ``DistributedTest`` tests (``dsrank.DeepSpeedRunner``,
    #: a pytest plugin): the child's part in this rank, over the test's shared folder.
    deepspeed: object = None


def register(config: pytest.Config, launch: Launch, keeper: GroupKeeper, suites: Suites) -> None:
    """Run PyTorch's harness classes in this rank as a pool's rank runs them."""
    suites.remember(child_env(os.environ, launch))
    runner = suites.runner
    config.pluginmanager.register(runner, "distrank-suite-runner")
    if suites.deepspeed is not None:
        config.pluginmanager.register(suites.deepspeed, "distrank-deepspeed-runner")

    def end_harness() -> None:  # before the keeper replaces a continuous class's group
        if keeper.ctx is not None:
            runner.end_continuous(keeper.ctx)

    keeper.end_harness = end_harness
    keeper.harness_problem = runner.problem

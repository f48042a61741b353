"""End-to-end, opt-in: launcher mode under a real ``mpirun`` (Open MPI) and a real ``srun``.

test_launch.py sets the launchers' variables by hand; here the launcher itself starts the ranks,
where it is installed: Open MPI comes from the package manager (``apt-get install openmpi-bin``);
Slurm needs munge, slurmctld and slurmd running, so its test runs only where an ``srun`` step can
start (``DISTRANK_TEST_SRUN=1``, set by whoever runs a cluster). Absent, each test is skipped with
what to install. Sizes 1 and 2 in a world of 2: the size-1 test runs on a sub-world.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .test_launch import RUN_TIMEOUT, free_port

TESTS = """
import pytest
import torch
import torch.distributed as dist


@pytest.mark.world_size(2)
def test_sum(rank, world_size):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world_size == 2


@pytest.mark.world_size(1)
def test_alone(rank, world_size):
    assert (rank, world_size) == (0, 1)
"""


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    pytest_args = [sys.executable, "-m", "pytest", "-p", "distrank", "-p", "no:cacheprovider",
                   "-p", "no:randomly", "--color=no", "-rA", "test_launched.py"]  # fmt: skip
    return subprocess.run(
        [*command, *pytest_args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.timeout(RUN_TIMEOUT + 30)
@pytest.mark.skipif(
    shutil.which("mpirun") is None,
    reason="mpirun not installed: apt-get install openmpi-bin (Open MPI) to run this test",
)
def test_a_world_started_by_mpirun(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_launched=TESTS)
    port = str(free_port())
    env = {
        **os.environ,
        "OMPI_ALLOW_RUN_AS_ROOT": "1",  # CI machines run as root; Open MPI refuses it otherwise
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": port,
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    command = ["mpirun", "--oversubscribe", "-np", "2", "-x", "MASTER_ADDR", "-x", "MASTER_PORT",
               "-x", "PYTHONPATH", "-x", "PATH"]  # fmt: skip
    done = _run(command, Path(pytester.path), env)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "2 passed" in out, out
    assert "2 distributed tests on 2 ranks (mpi)" in out, out
    assert out.count("PASSED test_launched.py::test_sum") == 1, out  # one report, rank 0's


@pytest.mark.timeout(RUN_TIMEOUT + 30)
@pytest.mark.skipif(
    shutil.which("srun") is None or os.environ.get("DISTRANK_TEST_SRUN") != "1",
    reason="needs a Slurm cluster: srun installed, munge, slurmctld and slurmd running, and "
    "DISTRANK_TEST_SRUN=1",
)
def test_a_world_started_by_srun(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_launched=TESTS)
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    done = _run(["srun", "--ntasks=2", "--nodes=1"], Path(pytester.path), env)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "2 distributed tests on 2 ranks (slurm)" in out, out

"""Unit tests of launcher mode's detection (launch/env.py): pure logic, no process started.

The environment a launcher sets (torchrun, Slurm's srun, Open MPI's or MPICH's mpirun) -> the
launcher, rank, world size and local rank, or an error that explains what is missing; and the
command that reruns a test under the same launcher. The end-to-end runs of launcher mode are in
``tests/e2e/test_launch.py``.
"""

from __future__ import annotations

import dataclasses

import pytest

from pytest_distrank.launch.env import Launch, LaunchError, detect, rerun_command
from pytest_distrank.options import LAUNCHER, OPTIONS

RDZV = {"MASTER_ADDR": "node0", "MASTER_PORT": "29500"}


def test_torchrun_variables_are_detected() -> None:
    env = {
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
        "GROUP_WORLD_SIZE": "2", "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": "2", **RDZV,
    }  # fmt: skip
    launch = detect(env)
    assert launch is not None
    assert (launch.launcher, launch.rank, launch.world_size, launch.local_rank) == (
        "torchrun", 3, 4, 1,
    )  # fmt: skip
    assert (launch.local_world_size, launch.nodes, launch.agent_store, launch.restart) == (
        2, 2, True, 2,
    )  # fmt: skip
    assert (launch.master_addr, launch.master_port) == ("node0", 29500)
    assert launch.label() == "rank 3/4 (torchrun)"
    assert "from RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT" in launch.describe()


def test_torchrun_wins_over_slurm_and_mpi() -> None:
    env = {
        "RANK": "1", "WORLD_SIZE": "8", "LOCAL_RANK": "1", **RDZV,
        "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_STEP_ID": "0",
        "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    }  # fmt: skip
    launch = detect(env)
    assert launch is not None and launch.launcher == "torchrun" and launch.world_size == 8


def test_slurm_variables_map_to_rank_world_size_and_local_rank() -> None:
    env = {
        "SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0",
        "SLURM_STEP_NUM_NODES": "4", **RDZV,
    }  # fmt: skip
    launch = detect(env)
    assert launch is not None
    assert (launch.launcher, launch.rank, launch.world_size, launch.local_rank) == (
        "slurm", 5, 8, 1,
    )  # fmt: skip
    assert launch.nodes == 4 and not launch.agent_store
    assert launch.rank_env()["RANK"] == "5" and launch.rank_env()["LOCAL_RANK"] == "1"


def test_slurm_auto_needs_an_srun_step_but_an_explicit_choice_does_not() -> None:
    batch_script = {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_LOCALID": "0", **RDZV}
    assert detect(batch_script) is None  # pytest run directly in an sbatch script
    launch = detect(batch_script, "slurm", "--distrank-launcher=slurm (command line)")
    assert launch is not None and launch.world_size == 8


def test_a_world_of_one_process_is_the_usual_mode_under_auto() -> None:
    # srun -n1 pytest (no MASTER_ADDR needed), torchrun --nproc-per-node=1, mpirun -n 1.
    one_task = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0"}
    one_task["SLURM_STEP_ID"] = "3"
    assert detect(one_task) is None
    assert detect({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", **RDZV}) is None
    launch = detect({**one_task, **RDZV}, "slurm", "--distrank-launcher=slurm (command line)")
    assert launch is not None and launch.world_size == 1


@pytest.mark.parametrize(
    ("env", "local_size"),
    [
        (
            {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4",
             "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
            2,
        ),
        ({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0"}, None),
    ],
    ids=["openmpi", "mpich"],
)  # fmt: skip
def test_mpi_variables_are_detected(env: dict[str, str], local_size: int | None) -> None:
    launch = detect({**env, **RDZV})
    assert launch is not None
    assert (launch.launcher, launch.rank, launch.world_size, launch.local_rank) == ("mpi", 2, 4, 0)
    assert launch.local_world_size == local_size


@pytest.mark.parametrize(
    ("env", "needles"),
    [
        (
            {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0"},
            ["Slurm (srun)", "MASTER_ADDR and MASTER_PORT are not set",
             "export MASTER_ADDR=$(scontrol show hostnames", "--distrank-launcher=off"],
        ),
        (
            {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
             "OMPI_COMM_WORLD_LOCAL_RANK": "1", "MASTER_ADDR": "node0"},
            ["MPI (mpirun)", "MASTER_PORT is not set", "-x MASTER_PORT="],
        ),
        ({"RANK": "x", "WORLD_SIZE": "2", "LOCAL_RANK": "0", **RDZV}, ["RANK='x' is not an"]),
        ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0", **RDZV}, ["below the world size"]),
        ({"RANK": "0", "WORLD_SIZE": "2", **RDZV}, ["LOCAL_RANK", "is not set"]),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "h",
          "MASTER_PORT": "70000"}, ["MASTER_PORT=70000 is not a port"]),
    ],
    ids=["slurm-no-rendezvous", "mpi-no-port", "bad-int", "rank-too-big", "no-local-rank",
         "bad-port"],
)  # fmt: skip
def test_unusable_launch_environments_are_explained(
    env: dict[str, str], needles: list[str]
) -> None:
    with pytest.raises(LaunchError) as info:
        detect(env)
    for needle in needles:
        assert needle in str(info.value)


def test_off_ignores_the_launcher_and_a_named_launcher_must_be_there() -> None:
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", **RDZV}
    assert detect(env, "off") is None
    assert detect({}) is None
    # RANK & co. set by pool mode for its own ranks (and what a test there starts): not launched
    assert detect({**env, "DISTRANK_RANK": "0"}) is None
    with pytest.raises(LaunchError, match="SLURM_PROCID/SLURM_NTASKS are not set") as info:
        detect(env, "slurm", "DISTRANK_LAUNCHER=slurm (environment)")
    assert "DISTRANK_LAUNCHER=slurm (environment)" in str(info.value)
    assert LAUNCHER in OPTIONS and LAUNCHER.parse(" MPI ") == "mpi"
    with pytest.raises(ValueError, match="auto, off, torchrun, slurm, mpi"):
        LAUNCHER.parse("pbs")


def test_rerun_commands_match_the_launcher() -> None:
    base = Launch("torchrun", 0, 4, 0, 4, "h", 1, True, 0, ())
    assert (
        rerun_command(base, "t.py::a")
        == "torchrun --nproc-per-node=4 -m pytest -p distrank t.py::a"
    )
    two_nodes = dataclasses.replace(base, nodes=2, local_world_size=2)
    assert "--nnodes=2 --nproc-per-node=2" in rerun_command(two_nodes, "t.py::a")
    slurm = dataclasses.replace(base, launcher="slurm")
    assert rerun_command(slurm, "t.py::a[x y]").startswith("srun --ntasks=4 python -m pytest")
    assert rerun_command(slurm, "t.py::a[x y]").endswith("'t.py::a[x y]'")


def test_launched_ranks_other_than_0_write_no_report_file() -> None:
    """Rank 0 writes them, from every rank's merged reports; the others would overwrite them
    (pytest-split's durations file too: every rank's session would store its own)."""
    from types import SimpleNamespace

    from pytest_distrank import _compat

    option = SimpleNamespace(
        report_log="log.jsonl", htmlpath="r.html", json_report=True, store_durations=True
    )
    config = SimpleNamespace(option=option)
    dropped = _compat.drop_report_files(config)  # type: ignore[arg-type]
    assert dropped == ["report_log", "htmlpath", "json_report", "store_durations"]
    assert vars(option) == {
        "report_log": None,
        "htmlpath": None,
        "json_report": False,
        "store_durations": False,
    }

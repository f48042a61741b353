"""End-to-end: a launched world whose ranks die or sleep in sub-worlds' tests (brief A46 items
4 and 5).

A hand-made env:// world of four ranks on this machine (plain pytest processes with the
launcher's variables, as ``srun`` would start them: the others run on when one dies, unlike
torchrun and mpirun, which stop them all). It ends after the batch in which its ranks died, so it
is a world of its own, beside ``test_subworlds.py``'s shared one. ``launch_env``'s check makes
sure no process outlives it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .test_launch import HEADER, by_hand, launch_env, write

__all__ = ["launch_env"]  # the fixture, used by the test here


#: Four sub-worlds of one rank at once in a world of four: launched rank 1 sleeps past its
#: deadline (in no collective), on rank 2 the process is killed (SIGKILL), on rank 3 it calls
#: os._exit(3); then a test of all four.
DIES = (
    HEADER
    + """import signal

SLEEPS = pytest.param("sleeps", marks=pytest.mark.timeout(3))

@pytest.mark.world_size(1)
@pytest.mark.parametrize("how", ["beside", SLEEPS, "killed", "exits"])
def test_dies(how, rank):
    time.sleep(0.2)  # its watchdog says it is in call (every 50 ms)
    if how == "sleeps":
        time.sleep(60)
    if how == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "exits":
        os._exit(3)
    time.sleep(0.5)

@pytest.mark.world_size(4)
def test_after(rank):
    pass
"""
)


@pytest.mark.timeout(300)
def test_a_sub_world_whose_rank_dies_fails_in_seconds(
    launch_env: dict[str, str], tmp_path: Path
) -> None:
    """Brief A46 item 4: a sub-world whose rank 0 died (a launcher that lets the others run on:
    srun, or this hand-made env:// world) failed only after the test's deadline (300 s), its
    failure grace and 30 s; now in seconds, naming the rank in both numberings and how its
    process ended, and the session ends with its report and exit code. Item 5: the rank left
    asleep in Python was said to be "stuck in a collective"."""
    write(tmp_path, {"test_dies.py": DIES})
    ranks = [
        {"RANK": str(r), "WORLD_SIZE": "4", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "4"}
        for r in range(4)
    ]
    run = by_hand(launch_env, tmp_path, ranks, "--junitxml=j.xml", "--distrank-failure-grace=1")
    assert run.codes == [1, 1, -9, 3], run.outputs
    assert run.outcomes("test_dies", "j.xml") == {
        "test_dies[beside]": "passed", "test_dies[sleeps]": "failure",
        "test_dies[killed]": "failure", "test_dies[exits]": "failure", "test_after": "skipped",
    }  # fmt: skip
    run.match(
        0,
        [
            "  rank 0/1 (launched rank 2, node 0)  stopped serving in call: launched rank 2 "
            "(pid * on *) sent no sign of life for ? s in call of test_dies.py::test_dies[[]killed"
            "[]]: its process killed by signal 9 (SIGKILL)*",
        ],
    )
    run.match(
        0,
        [
            "  rank 0/1 (launched rank 3, node 0)  stopped serving in call: launched rank 3 "
            "called os._exit(3) in test_dies.py::test_dies[[]exits[]]*",
        ],
    )
    run.match(
        0,
        [
            "SKIPPED [[]1[]] test_dies.py:*: not run: test_dies.py::test_dies[[]sleeps[]] left "
            "rank(s) 1 stuck (timeout): rank 1 in no collective (blocked in test_dies at "
            "test_dies.py:*); a rank still inside its test cannot be taken out of it *",
        ],
    )
    # Rank 0's session, from collection to its summary (the ranks' start is the machine's load).
    seconds = float(re.findall(r" in ([\d.]+)s", run.outputs[0])[-1])
    print(f"the launched world took {run.seconds:.1f} s, rank 0's session {seconds:.1f} s")
    assert seconds < 60, run.outputs  # deadline 300 s: it did not wait for it

"""End-to-end: nothing the run started is left for init to reap after pytest returns (#40).

Told by a process's parent, not by its state: the inner pytest runs under a small wrapper that
makes itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``), so that whatever pytest
leaves behind (a process it started and did not ``waitpid``, alive or a zombie) is re-parented
to the wrapper, which lists its children once pytest has exited. On a machine whose init reaps
at once a zombie is invisible; under the wrapper it is not. The first leftover found this way
was multiprocessing's resource tracker, which the fork server's start makes pytest's child.
A session with no distributed test ends the fork server it forked at its start unused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..helpers import RUN_TIMEOUT

WRAPPER = r"""
import ctypes, json, os, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
command = [sys.executable, "-m", "pytest", *sys.argv[1:]]
run = subprocess.run(command, capture_output=True, text=True)
time.sleep(0.5)  # an orphan re-parents when its parent's exit is done
left = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        stat = open(f"/proc/{pid}/stat").read()
        cmdline = open(f"/proc/{pid}/cmdline").read().replace("\0", " ").strip()
    except OSError:
        continue
    fields = stat[stat.rindex(")") + 2 :].split()
    if int(fields[1]) == os.getpid():
        left.append([int(pid), fields[0], stat[stat.index("(") + 1 : stat.rindex(")")], cmdline])
print(json.dumps({"rc": run.returncode, "out": run.stdout[-3000:], "left": left}))
"""


@pytest.mark.timeout(RUN_TIMEOUT)
@pytest.mark.parametrize("ending", ["passed", "failed with -x", "no distributed test"])
def test_pytest_reaps_every_process_it_started(pytester: pytest.Pytester, ending: str) -> None:
    if ending == "no distributed test":
        pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    else:
        pytester.makepyfile(
            test_two="""
        import pytest
        import torch
        import torch.distributed as dist

        @pytest.mark.world_size(2)
        def test_a(rank):
            t = torch.ones(1)
            dist.all_reduce(t)
            assert t.item() == 2

        @pytest.mark.world_size(2)
        def test_b(rank):
            assert rank == 0 or "{ending}" == "passed"
        """.replace("{ending}", ending)
        )
    wrapper = pytester.path / "wrapper.py"
    wrapper.write_text(WRAPPER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    args = ["-p", "distrank", "-p", "no:cacheprovider", "-q", *(["-x"] if "-x" in ending else [])]
    done = subprocess.run(
        [sys.executable, str(wrapper), *args],
        cwd=Path(pytester.path),
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["rc"] == (1 if "-x" in ending else 0), found["out"]
    assert found["left"] == [], f"left for init to reap after pytest returned: {found['left']}"

"""The names of the plugin's environment variables besides its options': what pool mode sets in
its ranks, launcher mode's secret, a developer's tools and the test seams.

Runs in every pytest process of both modes and in the processes they start (the ranks and what a
test starts inherit the variables). docs/reference.md, "Environment variables", lists each one.
"""

from __future__ import annotations

import os

#: Set in every rank process of pool mode to its rank (pool/worker/rankproc.py) and inherited by
#: what its tests start: a conftest.py tells a rank by it (docs/fixtures.md); the plugin's gate
#: (plugin.py) and launcher detection (launch/env.py) read it.
RANK_ENV = "DISTRANK_RANK"

#: Launcher mode's secret for the control store's MACs (launch/auth.py): the same value for every
#: rank, set in the environment (never on a command line). Required on several nodes under
#: ``DISTRANK_REQUIRE_SECRET=1``; without it such a run says its results are unauthenticated.
SECRET_ENV = "DISTRANK_SECRET"
REQUIRE_SECRET_ENV = "DISTRANK_REQUIRE_SECRET"

#: Test seam: ``DISTRANK_TEST_WAITS=S`` makes every fixed wait of the end-of-test rule S seconds:
#: the failure grace's default, the finish wait and the stack-dump wait (endgame.py), so that the
#: plugin's own fault tests do not sit out 5 + 5 + 3 s each. Not for users: a grace that short
#: can kill peers that were just finishing.
TEST_WAITS_ENV = "DISTRANK_TEST_WAITS"

#: Test seam: ``DISTRANK_LEAN_PHASES=0`` makes every pool rank run pytest's own per-phase
#: reporting for every test (pool/worker/leanphases.py), so that a test can compare the lean
#: path's outcomes with the full protocol's. Read in the ranks (they inherit the controller's
#: environment).
LEAN_PHASES_ENV = "DISTRANK_LEAN_PHASES"


def lean_phases() -> bool:
    """Whether pool ranks may skip pytest's reporting hooks for plain passing phases."""
    return os.environ.get(LEAN_PHASES_ENV, "1") != "0"


#: Test seams of planning (planning/capabilities.py, planning/gpuplan.py), so that its GPU
#: decisions are tested on machines without GPUs: ``DISTRANK_FAKE_GPU_COUNT=N`` makes the
#: planner believe N GPUs are visible, ``DISTRANK_FAKE_NCCL_VERSION=2.30.1`` that this NCCL is
#: built in. Not for users.
FAKE_GPU_COUNT_ENV = "DISTRANK_FAKE_GPU_COUNT"
FAKE_NCCL_VERSION_ENV = "DISTRANK_FAKE_NCCL_VERSION"

#: Pool mode's other variables (docs/reference.md, "Environment variables"): a developer's tools
#: (profile every rank, the session's numbers, a bound on pool starts); then, not for users, test
#: seams of GPU memory, and what pool mode sets in its ranks (the pool's tag, its store's port).
PROFILE_ENV = "DISTRANK_PROFILE_RANKS"
STATS_ENV = "DISTRANK_STATS_FILE"
START_TIMEOUT_ENV = "DISTRANK_START_TIMEOUT"
FAKE_GPU_MEMORY_ENV = "DISTRANK_FAKE_GPU_MEMORY"
FAKE_GPU_USED_DIR_ENV = "DISTRANK_FAKE_GPU_USED_DIR"
FAKE_ALLOCATED_ENV = "DISTRANK_FAKE_CUDA_ALLOCATED_FILE"
FAKE_RESERVED_ENV = "DISTRANK_FAKE_CUDA_RESERVED_FILE"
POOL_TAG_ENV = "DISTRANK_POOL_TAG"
PLUGIN_PORT_ENV = "DISTRANK_MASTER_PORT"
#: The process tree (tree/, docs/own-workers.md): where its faulthandler fallback writes (set by
#: the controller for opted-in sessions, inherited by ranks and the tree); test seams, not for
#: users: the py-spy to run ("none": as if not installed), the folder that stands for /dev in
#: the search for GPU device files.
TREE_DIR_ENV = "DISTRANK_TREE_DIR"
TREE_PYSPY_ENV = "DISTRANK_TREE_PYSPY"
FAKE_NVIDIA_DIR_ENV = "DISTRANK_FAKE_NVIDIA_DIR"


def seam_wait(default: float) -> float:
    """``default``, or the seconds of :data:`TEST_WAITS_ENV` where it is set."""
    raw = os.environ.get(TEST_WAITS_ENV, "")
    if not raw:
        return default
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:  # NaN and negative values too
        raise ValueError(f"{TEST_WAITS_ENV}={raw!r} (environment): expected seconds >= 0")
    return seconds

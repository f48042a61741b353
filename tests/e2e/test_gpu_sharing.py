"""End-to-end: NCCL tests with fewer GPUs than ranks, on a machine without GPUs, through the
DISTRANK_FAKE_GPU_COUNT and DISTRANK_FAKE_NCCL_VERSION seams.

Without --distrank-gpu-oversubscribe such a test is skipped before any rank starts, naming the
counts and the option. With it, NCCL >= 2.30 puts ranks round-robin on the GPUs with
NCCL_MULTI_RANK_GPU_ENABLE=1, an older NCCL falls back to gloo where allowed, or skips naming the
version. The tests run with ``init_process_group=False`` where NCCL would have to start: they
check what each rank was given (its GPU, backend, environment), not NCCL itself, which
``tests/gpu/`` runs on a real GPU.

Sessions that start no rank (the skips, the bad option value) run in this process
(``run_inprocess``). The ones with ranks share a session where the machine (GPU count, NCCL
version) is the same: the gloo fallback, what gloo cannot run there, and the CUDA memory a test
leaves run in one (``shared_session``); NCCL 2.30's round robin in another. The texts of the
fallback's skip are unit-tested in ``tests/unit/test_gpu_sharing_texts.py``.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ..helpers import RunPytest, SharedSession

#: Each rank writes down what it was given.
RECORD = """
import os, pathlib, pytest

@pytest.mark.world_size(4, backend="nccl", init_process_group=False)
def test_given(rank, backend, device):
    pathlib.Path(f"rank{rank}").write_text(" ".join([
        backend,
        str(device),
        os.environ["CUDA_VISIBLE_DEVICES"],
        os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE", "-"),
    ]))
"""

#: An op gloo cannot run on CUDA tensors, in the fallback's pool of 4 ranks on 2 GPUs: the pool of
#: RECORD (the same marker; the op's error is the one ProcessGroupGloo raises). A second pool
#: needing the same GPUs would wait for the first one's lease, which a finished pool keeps until
#: the next pool of the session stops.
ALLTOALL = """
import pytest

@pytest.mark.world_size(4, backend="nccl", init_process_group=False)
def test_alltoall(backend):
    assert backend == "gloo"
    # What ProcessGroupGloo raises for an op it cannot run on CUDA tensors.
    raise RuntimeError("ProcessGroupGloo::alltoall_base: unsupported device type cuda")
"""

MEMORY = """
import os, pathlib, pytest

def hold(mib):  # what torch.cuda.memory_allocated() would say after the test
    pathlib.Path(os.environ["DISTRANK_FAKE_CUDA_ALLOCATED_FILE"]).write_text(
        str(mib << 20)
    )

def reserve(mib):  # what torch.cuda.memory_reserved() would say after the test
    pathlib.Path(os.environ["DISTRANK_FAKE_CUDA_RESERVED_FILE"]).write_text(str(mib << 20))

@pytest.mark.world_size(1)
def test_a_model(rank):
    hold(100)
    reserve(128)

@pytest.mark.world_size(1)
def test_a_then_a_big_cache(rank):
    reserve(1664)  # the caching allocator keeps 1.5 GiB above the steady state: released

@pytest.mark.world_size(1)
def test_b_leaks_a_little(rank):
    hold(164)

@pytest.mark.world_size(1)
def test_c_leaks_a_lot(rank):
    pathlib.Path("pid-c").write_text(str(os.getpid()))
    hold(1400)

@pytest.mark.world_size(1)
def test_d_next(rank):
    assert pathlib.Path("pid-c").read_text() != str(os.getpid())
"""


def machine(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, gpus: int, nccl: str
) -> None:
    """This many fake GPUs and this NCCL version, and the recording test."""
    monkeypatch.setenv("DISTRANK_FAKE_GPU_COUNT", str(gpus))
    monkeypatch.setenv("DISTRANK_FAKE_NCCL_VERSION", nccl)
    pytester.makepyfile(test_given=RECORD)


def given(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.glob("rank*"))}


# -- decided before any rank starts: in this process -------------------------------------------


def test_fewer_gpus_than_ranks_skip_naming_the_option(
    pytester: pytest.Pytester,
    run_inprocess: RunPytest,
    fake_gpus: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine(pytester, monkeypatch, gpus=2, nccl="2.30.1")
    result = run_inprocess("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        [
            "SKIPPED [[]1[]] *: backend 'nccl' needs 4 GPUs (one per rank), 2 visible; "
            "--distrank-gpu-oversubscribe lets 4 ranks share 2 GPUs"
        ]
    )
    assert given(pytester.path) == {}


def test_older_nccl_skips_naming_its_version_and_the_fallback(
    pytester: pytest.Pytester,
    run_inprocess: RunPytest,
    fake_gpus: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine(pytester, monkeypatch, gpus=1, nccl="2.21.5")
    monkeypatch.setenv("DISTRANK_GPU_OVERSUBSCRIBE", "1")
    result = run_inprocess("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        [
            "distrank: * GPU oversubscription on (DISTRANK_GPU_OVERSUBSCRIBE=1 (environment)): "
            "NCCL 2.21.5 cannot put several ranks on one GPU; tests with fewer GPUs than ranks "
            "skip",
            "SKIPPED [[]1[]] *: backend 'nccl' needs 4 GPUs (one per rank), 1 visible; NCCL 2.21.5 "
            "cannot run several ranks on one GPU (NCCL 2.30 can, with "
            "NCCL_MULTI_RANK_GPU_ENABLE=1); --distrank-gpu-fallback=gloo runs the test with gloo "
            "on the same CUDA tensors",
        ]
    )
    assert given(pytester.path) == {}


def test_a_bad_fallback_value_names_the_option(
    pytester: pytest.Pytester, run_inprocess: RunPytest
) -> None:
    pytester.makepyfile(test_given=RECORD)
    result = run_inprocess("--distrank-gpu-fallback=mpi")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*invalid value 'mpi' for --distrank-gpu-fallback (ini: distrank_gpu_fallback, env: "
            "DISTRANK_GPU_FALLBACK), from --distrank-gpu-fallback=mpi (command line):",
            "*expected one of none, gloo",
        ]
    )


# -- ranks on shared GPUs ------------------------------------------------------------------------


def test_nccl_2_30_puts_ranks_round_robin_with_the_switch(
    pytester: pytest.Pytester,
    run_pytest: RunPytest,
    fake_gpus: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine(pytester, monkeypatch, gpus=2, nccl="2.30.1")
    result = run_pytest("--distrank-gpu-oversubscribe")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "distrank: * GPU oversubscription on (--distrank-gpu-oversubscribe (command line)): "
            "NCCL 2.30.1 runs several ranks per GPU (NCCL_MULTI_RANK_GPU_ENABLE=1)"
        ]
    )
    assert given(pytester.path) == {
        "rank0": "nccl cuda:0 0,1 1",
        "rank1": "nccl cuda:1 0,1 1",
        "rank2": "nccl cuda:0 0,1 1",
        "rank3": "nccl cuda:1 0,1 1",
    }


#: The folder the fallback session ran in (its first test's).
_FALLBACK_FOLDER: list[Path] = []


def _write_fallback(folder: Path) -> None:
    _FALLBACK_FOLDER.append(folder)
    for name, text in (
        ("test_given.py", RECORD),
        ("test_alltoall.py", ALLTOALL),
        ("test_memory.py", MEMORY),
    ):
        (folder / name).write_text(textwrap.dedent(text).lstrip("\n"))


@pytest.fixture
def fallback(shared_session: SharedSession, fake_gpus: Path) -> tuple[pytest.RunResult, Path]:
    """NCCL 2.21.5 on 2 fake GPUs with the gloo fallback, and a CUDA memory limit: gloo's
    refusal and the recording test in one pool of 4 ranks, the memory tests in pools of one."""
    result = shared_session(
        "gpu-fallback",
        _write_fallback,
        "-v",
        "-rs",
        "--distrank-gpu-oversubscribe",
        "--distrank-gpu-fallback=gloo",
        "--distrank-cuda-growth=1GiB",
        env={
            "DISTRANK_FAKE_GPU_COUNT": "2",
            "DISTRANK_FAKE_NCCL_VERSION": "2.21.5",
            "DISTRANK_FAKE_CUDA_ALLOCATED_FILE": "{folder}/allocated",
            "DISTRANK_FAKE_CUDA_RESERVED_FILE": "{folder}/reserved",
        },
    )
    return result, _FALLBACK_FOLDER[0]


def test_the_fallback_session_runs_every_test_once(
    fallback: tuple[pytest.RunResult, Path],
) -> None:
    result, _ = fallback
    result.assert_outcomes(passed=6, skipped=1)


def test_older_nccl_falls_back_to_gloo_on_the_shared_gpus(
    fallback: tuple[pytest.RunResult, Path],
) -> None:
    result, folder = fallback
    result.stdout.fnmatch_lines(["*shared GPUs run gloo on CUDA tensors"])
    result.stdout.fnmatch_lines(["*test_given.py::test_given PASSED*"])
    assert given(folder) == {
        "rank0": "gloo cuda:0 0,1 -",
        "rank1": "gloo cuda:1 0,1 -",
        "rank2": "gloo cuda:0 0,1 -",
        "rank3": "gloo cuda:1 0,1 -",
    }


def test_what_gloo_cannot_run_on_cuda_is_a_skip_naming_the_op(
    fallback: tuple[pytest.RunResult, Path],
) -> None:
    result, _ = fallback
    result.stdout.fnmatch_lines(
        [
            "SKIPPED [[]1[]] test_alltoall.py:7: gloo cannot run alltoall_base on CUDA tensors; "
            "this NCCL test ran with gloo (4 ranks on 2 GPUs, --distrank-gpu-fallback=gloo). It "
            "needs NCCL >= 2.30 or one GPU per rank."
        ]
    )


def test_reserved_cuda_memory_past_the_limit_is_released_and_named(
    fallback: tuple[pytest.RunResult, Path],
) -> None:
    """The caching allocator's reserve grows by design: past the limit it is released
    (torch.cuda.empty_cache) and named with the test, and the pool stays (rank/leftovers.py)."""
    result, _ = fallback
    result.stdout.fnmatch_lines(
        [
            "leftovers: test_memory.py::test_a_then_a_big_cache left 1.5 GiB of reserved CUDA "
            "memory above the steady state (released: torch.cuda.empty_cache()) on rank 0 "
            "(restored)"
        ]
    )
    assert "test_a_then_a_big_cache left the rank" not in result.stdout.str()  # no pool killed


def test_cuda_memory_a_test_leaves_is_named_and_past_the_limit_replaces_the_pool(
    fallback: tuple[pytest.RunResult, Path],
) -> None:
    result, _ = fallback
    names = ("a_model", "a_then_a_big_cache", "b_leaks_a_little", "c_leaks_a_lot", "d_next")
    result.stdout.fnmatch_lines([f"*test_memory.py::test_{name} PASSED*" for name in names])
    result.stdout.fnmatch_lines(
        [
            "pool killed after a fault: world_size=1, backend=gloo: "
            "test_memory.py::test_c_leaks_a_lot left the rank holding 1.3 GiB of CUDA memory "
            "above its steady state (100 MiB after its first test), past the limit of 1.0 GiB "
            "(--distrank-cuda-growth)",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "CUDA memory: test_memory.py::test_b_leaks_a_little left 64 MiB of CUDA memory "
            "allocated on rank 0/1",
            "CUDA memory: test_memory.py::test_c_leaks_a_lot left 1.2 GiB of CUDA memory "
            "allocated on rank 0/1",
        ]
    )

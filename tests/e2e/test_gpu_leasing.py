"""End-to-end: GPU leasing on a machine without GPUs, through the DISTRANK_FAKE_GPU_COUNT seam.

Two concurrent sessions get disjoint GPUs, or share one when they declare memory; a pool that
cannot get GPUs is skipped after --distrank-gpu-wait, and the lease of a process killed meanwhile
is taken over (its GPUs, or its memory); an outer CUDA_VISIBLE_DEVICES is respected, and files
planted in the lock folder neither hang nor harm; the next whole lease of a session waits for
its GPUs' memory to be back (the DISTRANK_FAKE_GPU_USED_DIR seam) and names what holds it.
Where the machine is the same, one inner session checks several of these: another process holds
GPUs when it starts, and an ordinary test of the session kills it before the tests that need
them (``KILL_HOLDER``). The unit tests of ``gpus.lease`` are in ``tests/unit/test_gpus.py``
(of the memory wait in ``test_gpu_memoryback.py``); the ``fake_gpus`` fixture (four fake GPUs,
a private lock folder) is in ``tests/conftest.py``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ..helpers import TAG_ENV, RunPytest, run_at_once, wait_gone

#: A test that records the GPUs its rank sees, then waits until the other session recorded its.
RECORD = """
import os, pathlib, time, pytest

@pytest.mark.world_size(1)
@pytest.mark.requires_gpus(2)
def test_lease(rank):
    seen = pathlib.Path(os.environ["SEEN_DIR"])
    (seen / os.environ["SESSION"]).write_text(os.environ["CUDA_VISIBLE_DEVICES"])
    deadline = time.monotonic() + 60
    while len(list(seen.iterdir())) < int(os.environ["SESSIONS"]):
        assert time.monotonic() < deadline, "the other session never ran its test"
        time.sleep(0.05)
"""

#: Holds the locks of GPUs 0..N-1 (or that many bytes of each) like a pool would, until killed.
HOLDER = """
import sys, time
from pytest_distrank.pool.pools import gpus
lease = gpus.lease(int(sys.argv[2]), sys.argv[1], wait=0, memory=int(sys.argv[3]))
print("holding", lease.cuda_visible_devices, flush=True)
time.sleep(600)
"""


def _two_sessions(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, test_file: str
) -> dict[str, str]:
    """Sessions "a" and "b" at once, each running ``test_file`` (RECORD-like); what each rank
    recorded of its CUDA_VISIBLE_DEVICES, by session."""
    seen = pytester.mkdir("seen")
    monkeypatch.setenv("SEEN_DIR", str(seen))
    monkeypatch.setenv("SESSIONS", "2")
    tag = uuid.uuid4().hex
    monkeypatch.setenv(TAG_ENV, tag)
    pytester.makepyfile(test_record=test_file)
    command = [sys.executable, "-m", "pytest", "-p", "distrank", "-q"]
    envs = [{**os.environ, "SESSION": name} for name in ("a", "b")]
    files = [pytester.path / f"session-{name}.txt" for name in ("a", "b")]
    try:
        codes = run_at_once([command, command], envs, pytester.path, files, 150)
    finally:
        assert not wait_gone(tag, 15)
    outputs = [file.read_text() for file in files]
    assert codes == [0, 0], outputs
    for output in outputs:
        assert "1 passed" in output, output
    return {p.name: p.read_text() for p in seen.iterdir()}


def test_concurrent_sessions_get_disjoint_gpus(
    pytester: pytest.Pytester, fake_gpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _two_sessions(pytester, monkeypatch, RECORD)
    leases = {name: set(devices.split(",")) for name, devices in seen.items()}
    assert len(leases["a"]) == len(leases["b"]) == 2
    assert not leases["a"] & leases["b"], leases


@contextlib.contextmanager
def _hold(lock_dir: Path, count: int, memory: int = 0) -> Iterator[subprocess.Popen[str]]:
    """Another process holding ``count`` GPUs (whole, or ``memory`` bytes of each); SIGKILLed
    at the end (or earlier by the test)."""
    with subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOLDER), str(lock_dir), str(count), str(memory)],
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().startswith("holding")
            yield holder
        finally:
            holder.kill()


def test_sessions_that_declare_memory_share_one_gpu(
    pytester: pytest.Pytester, fake_gpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISTRANK_FAKE_GPU_COUNT", "1")
    monkeypatch.setenv("DISTRANK_FAKE_GPU_MEMORY", "80GiB")
    shared = RECORD.replace("requires_gpus(2)", 'requires_gpus(1, memory="30GiB")')
    assert _two_sessions(pytester, monkeypatch, shared) == {"a": "0", "b": "0"}


#: An ordinary test that SIGKILLs the holder (HOLDER_PID) and waits until it is dead (a zombie of
#: the outer test until that reaps it: its locks are gone either way).
KILL_HOLDER = """
import os, signal, time

def test_kill_the_holder():
    pid = int(os.environ["HOLDER_PID"])
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.02)
    raise AssertionError("the holder is still alive")
"""


def test_memory_of_a_killed_holder_is_free_again(
    pytester: pytest.Pytester,
    run_pytest: RunPytest,
    fake_gpus: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One GPU of 80 GiB, 40 GiB of it held by another process: a test that needs 60 GiB is
    skipped; once that process is killed (test_b_kill.py), the next such test runs."""
    monkeypatch.setenv("DISTRANK_FAKE_GPU_COUNT", "1")
    monkeypatch.setenv("DISTRANK_FAKE_GPU_MEMORY", "80GiB")
    big = """
        import pytest

        @pytest.mark.world_size(1)
        @pytest.mark.requires_gpus(1, memory="60GiB")
        def test_big(rank):
            pass
        """
    pytester.makepyfile(
        test_a_big=big,
        test_b_kill=KILL_HOLDER,
        test_c_big_again=big.replace("def test_big(", "def test_big_again("),
    )
    with _hold(fake_gpus, 1, memory=40 << 30) as holder:
        monkeypatch.setenv("HOLDER_PID", str(holder.pid))
        result = run_pytest("-rs", "-v", "--distrank-gpu-wait=0")
    result.assert_outcomes(skipped=1, passed=2)
    result.stdout.fnmatch_lines(
        [
            "SKIPPED [[]1[]] *GPU lease: could not lease 1 of the 1 visible GPUs within 0 s*",
            f"  GPU 0: 1 share holds 40.0 GiB of 80.0 GiB (pid {holder.pid})",
        ]
    )
    result.stdout.fnmatch_lines(
        ["*test_a_big.py::test_big SKIPPED*", "*test_c_big_again.py::test_big_again PASSED*"]
    )


def test_gpu_wait_expiry_skips_with_holder_and_option(
    pytester: pytest.Pytester,
    run_pytest: RunPytest,
    fake_gpus: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another process holds 3 of the 4 GPUs: the tests that need 2 are skipped after the wait
    (the pool waits once). test_lease_of_a_killed_process_is_taken_over checks the same
    session's end."""
    result = _wait_then_take_over(pytester, run_pytest, fake_gpus, monkeypatch)
    holder_pid = _WAIT_SESSION["holder"]
    result.stdout.fnmatch_lines(
        [
            "SKIPPED [[]1[]] test_wait.py:*: GPU lease: could not lease 2 of the 4 visible GPUs "
            "within 0.5 s: 3 are held by other pytest processes*",
            f"  GPU 0: pid {holder_pid} on *",
            "*(--distrank-gpu-wait: 0.5 s, from --distrank-gpu-wait=0.5 (command line)). Free*",
            "*this pool waited in vain before, not again*",
        ]
    )
    result.stdout.fnmatch_lines(
        ["*test_wait.py::test_needs_two SKIPPED*", "*test_wait.py::test_again SKIPPED*"]
    )


def test_lease_of_a_killed_process_is_taken_over(
    pytester: pytest.Pytester,
    run_pytest: RunPytest,
    fake_gpus: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The holder of test_gpu_wait_expiry_skips_with_holder_and_option's session is SIGKILLed by
    an ordinary test (its lock files stay): the next pool takes over all four GPUs."""
    result = _wait_then_take_over(pytester, run_pytest, fake_gpus, monkeypatch)
    result.assert_outcomes(skipped=2, passed=2)
    result.stdout.fnmatch_lines(["*test_z_take.py::test_all_four PASSED*"])


#: The session of the two tests above, run by the first of them (its leak check covers it).
_WAIT_SESSION: dict[str, Any] = {}


def _wait_then_take_over(
    pytester: pytest.Pytester,
    run_pytest: RunPytest,
    fake_gpus: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> pytest.RunResult:
    if "result" not in _WAIT_SESSION:
        pytester.makepyfile(
            test_wait="""
            import pytest

            @pytest.mark.world_size(1)
            @pytest.mark.requires_gpus(2)
            def test_needs_two(rank):
                pass

            @pytest.mark.world_size(1)
            @pytest.mark.requires_gpus(2)
            def test_again(rank):
                pass
            """,
            test_z_take=KILL_HOLDER
            + """
import pytest

@pytest.mark.world_size(2)
@pytest.mark.requires_gpus(4)
def test_all_four(rank):
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
""",
        )
        _WAIT_SESSION["result"] = None
        with _hold(fake_gpus, 3) as holder:
            _WAIT_SESSION["holder"] = holder.pid
            monkeypatch.setenv("HOLDER_PID", str(holder.pid))
            _WAIT_SESSION["result"] = run_pytest("-rs", "-v", "--distrank-gpu-wait=0.5")
    result = _WAIT_SESSION["result"]
    if result is None:
        pytest.fail("the shared session of the GPU wait and the takeover did not finish")
    assert isinstance(result, pytest.RunResult)
    return result


def test_ranks_see_their_lease_within_the_outer_devices(
    planted_session: tuple[pytest.RunResult, Path, str],
) -> None:
    """CUDA_VISIBLE_DEVICES=6,3,4 outside: a pool of 2 GPUs gets 6,3, a CPU pool all three."""
    result, _, _ = planted_session
    result.stdout.fnmatch_lines(
        [
            "*test_outer.py::test_two PASSED*",
            "*test_outer.py::test_cpu_pool_leaves_devices_alone PASSED*",
        ]
    )


def test_files_planted_in_the_lock_folder_neither_hang_nor_harm(
    planted_session: tuple[pytest.RunResult, Path, str],
    record_property: Callable[[str, object], None],
) -> None:
    """Issue #24, D1, as another user would plant them: a link named like the owner note (its
    target was truncated and made 0666), a FIFO named like a share (every session hung), a held
    share whose size does not parse (INTERNALERROR). Planted at GPU 6, the first visible one,
    which test_outer.py's pool of 2 GPUs leases (6,3)."""
    result, victim, seen = planted_session
    record_property("fs_protection", seen)
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        ["*test_planted.py::test_ordinary PASSED*", "*test_planted.py::test_whole PASSED*"]
    )
    assert (victim.read_text(), victim.stat().st_mode & 0o777) == ("SECRET\n", 0o600), seen


#: The planted session's result, the victim file and the file-system protections seen.
_PLANTED: list[tuple[pytest.RunResult, Path, str] | None] = []


@pytest.fixture
def planted_session(
    pytester: pytest.Pytester,
    run_pytest: RunPytest,
    fake_gpus: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[pytest.RunResult, Path, str]:
    """Three fake GPUs seen as CUDA_VISIBLE_DEVICES=6,3,4, with files planted at GPU 6: one
    session for the outer devices and the planted files (run by the first test that asks)."""
    if not _PLANTED:
        _PLANTED.append(None)
        protected = [Path(f"/proc/sys/fs/protected_{n}") for n in ("symlinks", "regular", "fifos")]
        seen = " ".join(
            f"{f.name}={f.read_text().strip() if f.exists() else '?'}" for f in protected
        )
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,3,4")
        monkeypatch.setenv("DISTRANK_FAKE_GPU_COUNT", "3")
        fake_gpus.mkdir()
        fake_gpus.chmod(0o1777)
        victim = pytester.path / "victim"
        victim.write_text("SECRET\n")
        victim.chmod(0o600)
        (fake_gpus / "gpu-6.owner").symlink_to(victim)
        os.mkfifo(fake_gpus / "gpu-6.share.1.1-1")
        pytester.makepyfile(
            test_outer="""
            import os, pytest

            @pytest.mark.world_size(1)
            @pytest.mark.requires_gpus(2)
            def test_two(rank):
                assert os.environ["CUDA_VISIBLE_DEVICES"] == "6,3"

            @pytest.mark.world_size(2)
            def test_cpu_pool_leaves_devices_alone(rank):
                assert os.environ["CUDA_VISIBLE_DEVICES"] == "6,3,4"
            """,
            test_planted="""
            import pytest

            def test_ordinary():
                pass

            @pytest.mark.world_size(1)
            @pytest.mark.requires_gpus(1)
            def test_whole(rank):
                pass
            """,
        )
        held = os.open(fake_gpus / "gpu-6.share.lots.1-1", os.O_RDONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(held, fcntl.LOCK_EX)
            result = run_pytest("-v", "--distrank-gpu-wait=1", timeout=60)
        finally:
            os.close(held)
        _PLANTED[0] = (result, victim, seen)
    planted = _PLANTED[0]
    if planted is None:
        pytest.fail("the shared session of the outer devices and the planted files did not finish")
    return planted


#: Stands for the driver and a leftover worker: holds GPU 1's device file open; puts GPU 0's use
#: back to 1 GiB a second after a test raised it to 3 GiB (GPU 1's stays where the test left it).
GPU_USE = """
import os, pathlib, sys, time
used = pathlib.Path(sys.argv[1])
held = open(os.path.join(sys.argv[2], "nvidia1"), "w")
print("holding", flush=True)
while (used / "0").read_text() != "3GiB":
    time.sleep(0.05)
time.sleep(1)
(used / "0").write_text("1GiB")
time.sleep(600)
"""


def test_a_finished_pools_gpus_go_to_the_next_pool_of_the_session(
    pytester: pytest.Pytester,
    run_pytest: RunPytest,
    fake_gpus: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pool whose last test ran is stopped lazily; it held its lease until then, so the next
    pool that needed the same GPUs waited for its own session and got them. It waited for their
    memory too (the DISTRANK_FAKE_GPU_USED_DIR seam): GPU 0's came back within the wait, GPU 1's
    did not, and the summary names it, the memory still held and the process holding it."""
    used = pytester.mkdir("used")
    devices = pytester.mkdir("dev")
    for gpu in "0123":
        (used / gpu).write_text("1GiB")
    monkeypatch.setenv("DISTRANK_FAKE_GPU_USED_DIR", str(used))
    monkeypatch.setenv("DISTRANK_FAKE_NVIDIA_DIR", str(devices))
    pytester.makepyfile(
        """
        import os, pathlib, pytest

        @pytest.mark.requires_gpus(4)
        @pytest.mark.world_size(1)
        def test_one(rank):
            used = pathlib.Path(os.environ["DISTRANK_FAKE_GPU_USED_DIR"])
            (used / "1").write_text("3GiB")
            (used / "0").write_text("3GiB")

        @pytest.mark.requires_gpus(4)
        @pytest.mark.world_size(2)
        def test_two(rank):
            pass
        """
    )
    (pytester.path / "gpu_use.py").write_text(GPU_USE)
    holder = subprocess.Popen(
        [sys.executable, "gpu_use.py", str(used), str(devices)],
        cwd=pytester.path,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        result = run_pytest("-rs", "--distrank-gpu-wait=3", "--distrank-gpu-memory-wait=2")
    finally:
        holder.kill()
        holder.communicate()
    result.assert_outcomes(passed=2)
    result.stdout.re_match_lines(
        [
            r"GPU 1: 2\.0 GiB of its memory still held 2\.\d s after the pools before released "
            r"it \(it uses 3\.0 GiB, 1\.0 GiB when this session first leased it; tolerance 64 "
            r"MiB\); the pool world_size=2, backend=gloo, 4 GPUs started on it anyway",
            rf"  GPU 1 is held open by pid {holder.pid} \(.*python.* gpu_use\.py .*\)",
            r"  What to do: end the process that holds it .*",
        ]
    )
    assert "GPU 0:" not in result.stdout.str()

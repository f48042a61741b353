"""End-to-end: distributed tests that pass, their ids, fixtures and pools.

Scenarios share inner sessions (a session start costs seconds): ``basics`` runs most of them,
each in its own file, with the plugin loaded by ``-p distrank`` while autoloading is off, and
beside it a second session on the same machine (``BESIDE``, two sessions at once);
``--distrank-isolate`` has its own session (test_isolate.py); the one that needs
``--distrank-start-method=spawn`` is a case of tests/e2e/test_ecosystem.py's spawn session. Each
test below checks its own scenario's lines. Sessions that start no rank (ordinary tests,
``--markers``, a bad option) run in-process.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from ..helpers import RunPytest, SharedSession, Started, finish_beside, start_beside
from .hostile import HOSTILE, nothing_imported_is_shared

#: The folder each shared session ran in, by name (its files record what the ranks saw).
_FOLDERS: dict[str, Path] = {}


def _writer(name: str, files: dict[str, str]) -> Callable[[Path], None]:
    """A ``write(folder)`` for ``shared_session``: the files, with RECORD as a path there."""

    def write(folder: Path) -> None:
        _FOLDERS[name] = folder
        for path, source in files.items():
            text = textwrap.dedent(source).replace("RECORD", repr(str(folder / "record")))
            (folder / path).parent.mkdir(exist_ok=True)
            (folder / path).write_text(text)

    return write


def _records(name: str, scenario: str) -> list[list[str]]:
    """The lines a scenario's tests wrote to ``RECORD-<scenario>.txt``, split in words."""
    text = (_FOLDERS[name] / f"record-{scenario}.txt").read_text()
    return [line.split() for line in text.splitlines()]


BASICS = {
    # world_size(1, 2, 3, 4): one test per size, each in a pool of its size.
    "test_sizes.py": """
        import pytest, torch, torch.distributed as dist

        @pytest.mark.world_size(1, 2, 3, 4)
        def test_sum(request, rank, world_size, pg, device):
            assert request.node.name == f"test_sum[ws{world_size}]"
            assert dist.get_rank() == rank and dist.get_world_size() == world_size
            t = torch.ones(1, device=device) * rank
            dist.all_reduce(t, group=pg)
            assert t.item() == sum(range(world_size))

        @pytest.mark.world_size(2, 3)
        @pytest.mark.parametrize("x", ["a", "b"])
        def test_ids(world_size, x):
            assert world_size in (2, 3)

        @pytest.mark.world_size()
        def test_default(world_size):
            assert world_size == 3  # --distrank-world-size=3
        """,
    "test_class.py": """
        import pytest, torch.distributed as dist

        pytestmark = pytest.mark.world_size(2)

        class TestGroup:
            def test_rank(self, rank):
                assert rank == dist.get_rank()

            def test_size(self, world_size):
                assert world_size == 2
        """,
    "test_selfinit.py": """
        import os, pytest, torch, torch.distributed as dist

        @pytest.mark.world_size(2, init_process_group=False)
        @pytest.mark.parametrize("round", [1, 2])
        def test_self_init(rank, round):
            assert not dist.is_initialized()
            assert os.environ["RANK"] == str(rank) and os.environ["WORLD_SIZE"] == "2"
            # The store the pool serves for this test, in round 2 too (was: the last test's)
            assert os.environ["MASTER_PORT"] == os.environ["DISTRANK_MASTER_PORT"]
            dist.init_process_group("gloo")
            t = torch.tensor([rank + round], dtype=torch.float32)
            dist.all_reduce(t)
            assert t.item() == 1 + 2 * round
            # left initialised on purpose: the plugin destroys it after the test
        """,
    "test_modfixture.py": """
        import pytest

        @pytest.fixture(scope="module")
        def resource(rank, tmp_path_factory):
            with open(RECORD + "-modfixture.txt", "a") as f:
                f.write(f"setup {rank}\\n")
            yield rank
            with open(RECORD + "-modfixture.txt", "a") as f:
                f.write(f"teardown {rank}\\n")

        @pytest.mark.world_size(2)
        @pytest.mark.parametrize("i", range(3))
        def test_uses(resource, rank, i):
            assert resource == rank

        @pytest.mark.world_size(3)
        def test_interleaved(world_size):
            assert world_size == 3

        @pytest.mark.world_size(2)
        def test_after(resource, rank):
            assert resource == rank
        """,
    "test_reuse.py": """
        import os, pytest

        @pytest.mark.world_size(2)
        @pytest.mark.parametrize("i", range(4))
        def test_pid(rank, i):
            with open(RECORD + "-reuse.txt", "a") as f:
                f.write(f"{rank} {os.getpid()}\\n")
        """,
    "test_shared.py": """
        import pytest, torch.distributed as dist

        @pytest.mark.world_size(3)
        @pytest.mark.parametrize("round", [1, 2])
        def test_share(rank, world_size, shared_tmp_path, dist_store, tmp_path, round):
            assert list(shared_tmp_path.iterdir()) == []  # a new folder for every test
            dist.barrier()
            (shared_tmp_path / f"{rank}.txt").write_text(str(rank * round))
            dist_store.set(f"key{rank}", str(rank + 10 * round))
            dist.barrier()
            names = sorted(p.name for p in shared_tmp_path.iterdir())
            assert names == [f"{r}.txt" for r in range(world_size)]
            assert [int((shared_tmp_path / n).read_text()) for n in names] == [
                r * round for r in range(world_size)
            ]
            got = [int(dist_store.get(f"key{r}")) for r in range(world_size)]
            assert got == [r + 10 * round for r in range(world_size)]
            assert tmp_path != shared_tmp_path
        """,
    # torchrun's variables; a TCPStore (MASTER_PORT) only for pools whose tests rendezvous
    # themselves, on loopback: no pool listens on every interface (hostile review 3, D15).
    "test_env.py": '''
        import os, pytest, torch.distributed as dist

        def wildcard_listeners():
            """LISTEN sockets on 0.0.0.0 or :: that this rank holds (every rank asks: the
            pool's processes)."""
            inodes = set()
            for fd in os.listdir("/proc/self/fd"):
                try:
                    inodes.add(os.readlink(f"/proc/self/fd/{fd}"))
                except OSError:
                    continue
            found = []
            for table in ("/proc/net/tcp", "/proc/net/tcp6"):
                with open(table) as f:
                    for line in f.readlines()[1:]:
                        address, state, inode = line.split()[1], line.split()[3], line.split()[9]
                        wildcard = set(address.split(":")[0]) == {"0"}
                        if state == "0A" and wildcard and f"socket:[{inode}]" in inodes:
                            found.append(address)
            return found

        @pytest.mark.world_size(2)
        def test_env(rank, local_rank, world_size, backend, pg):
            assert backend == "gloo"
            assert local_rank == rank
            assert os.environ["RANK"] == str(rank)
            assert os.environ["LOCAL_RANK"] == str(local_rank)
            assert os.environ["WORLD_SIZE"] == os.environ["LOCAL_WORLD_SIZE"] == "2"
            assert os.environ["MASTER_ADDR"] == "127.0.0.1"
            assert os.environ["TORCHELASTIC_USE_AGENT_STORE"] == "True"
            assert "PYTEST_ADDOPTS" not in os.environ
            # The default group meets on a FileStore: no store of the plugin's, no port.
            assert "MASTER_PORT" not in os.environ
            assert wildcard_listeners() == []
            # A fresh process's start method, not the fork server's (a rank is one's child).
            import multiprocessing
            assert multiprocessing.get_start_method() == multiprocessing.get_all_start_methods()[0]

        @pytest.mark.world_size(2, init_process_group=False)
        def test_env_init(rank):
            assert int(os.environ["MASTER_PORT"]) > 0
            dist.init_process_group("gloo")  # env://, at the store rank 0 serves on loopback
            try:
                assert wildcard_listeners() == []
            finally:
                dist.destroy_process_group()
        ''',
    # The session runs with PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 and -p distrank: the controller
    # and every rank have the plugin, and no plugin that only autoloading brings.
    "test_autoload.py": """
        import pytest

        def test_controller(pytestconfig):
            assert pytestconfig.pluginmanager.hasplugin("distrank")
            assert not pytestconfig.pluginmanager.hasplugin("timeout")

        @pytest.mark.world_size(2)
        def test_ranks(rank, pytestconfig):
            assert rank in (0, 1)
            assert not pytestconfig.pluginmanager.hasplugin("timeout")
        """,
    # --distrank-preload=heavy,json
    "heavy.py": "import os\nIMPORTED_IN = os.getpid()\n",
    "test_preload.py": """
        import os, sys, pytest

        @pytest.mark.world_size(2)
        def test_already_there(rank):
            # imported once by the fork server, so not by this rank process
            assert sys.modules["heavy"].IMPORTED_IN != os.getpid()
        """,
    # pytest.ini names test_b_by_ini; test_c_by_marker has the marker.
    "pytest.ini": """
        [pytest]
        distrank_isolate_tests = *::test_b_by_ini
        """,
    "test_fresh.py": """
        import os, pytest

        def record(name, rank):
            with open(RECORD + "-fresh.txt", "a") as f:
                f.write(f"{name} {rank} {os.getpid()}\\n")

        @pytest.mark.world_size(2)
        def test_a_shared(rank):
            record("a", rank)

        @pytest.mark.world_size(2)
        def test_b_by_ini(rank):
            record("b", rank)

        @pytest.mark.distrank_isolate
        @pytest.mark.world_size(2)
        def test_c_by_marker(rank):
            record("c", rank)

        @pytest.mark.world_size(2)
        def test_d_shared_again(rank):
            record("d", rank)
        """,
}


#: The second of two sessions on one machine (test_two_sessions_at_once_do_not_collide): it runs
#: beside ``basics``, started just before it, in a folder of its own. Its result, once it ran.
BESIDE = """
    import os, pytest, torch, torch.distributed as dist

    @pytest.mark.world_size(2)
    @pytest.mark.parametrize("i", range(10))
    def test_sum(rank, pg, dist_store, i):
        dist_store.set(f"k{rank}", str(os.getpid()))
        dist.barrier()
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == 2
    """
_BESIDE: dict[str, pytest.RunResult | BaseException] = {}


@pytest.fixture
def basics(shared_session: SharedSession) -> pytest.RunResult:
    """The ``basics`` session, and beside it the session of :data:`BESIDE` in a folder of its
    own (started by the first test that runs ``basics``, with its environment: the process tag
    of ``run_pytest``, whose leak check after that test covers both sessions)."""
    beside: list[tuple[Path, Started]] = []

    def write(folder: Path) -> None:
        _writer("basics", {**BASICS, **HOSTILE})(folder)
        place = folder.with_name(f"{folder.name}-beside")
        place.mkdir()
        (place / "test_beside.py").write_text(textwrap.dedent(BESIDE))
        beside.append((place, start_beside(["-q", "-p", "no:cacheprovider"], place)))

    try:
        return shared_session(
            "basics",
            write,
            "-v",
            "--distrank-world-size=3",
            "--distrank-preload=heavy,json",
            "--distrank-fresh-ranks=start",
            "--hostile-flag=yes",
            env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        )
    finally:
        for place, process in beside:  # it ends before the leak check of the first run
            try:
                _BESIDE["basics"] = finish_beside(process, place)
            except pytest.fail.Exception as exc:
                _BESIDE["basics"] = exc


def test_basics_session_outcomes(basics: pytest.RunResult) -> None:
    """Every scenario of the session passed, and the summary counts its distributed tests."""
    basics.assert_outcomes(passed=35)
    # A pool per world size, and one for each test that rendezvouses itself or needs fresh
    # ranks (init_process_group=False, test_fresh.py's b and c, test_hostile.py's two).
    basics.stdout.fnmatch_lines(
        [
            "34 distributed tests; pools started: 1 at world size 1, 6 at world size 2, "
            "1 at world size 3, 1 at world size 4"
        ]
    )


def test_nothing_a_fresh_rank_imports_is_shared_when_it_starts_afresh(
    basics: pytest.RunResult,
) -> None:
    nothing_imported_is_shared(_FOLDERS["basics"], basics)


def test_all_reduce_passes_at_every_world_size(basics: pytest.RunResult) -> None:
    basics.stdout.fnmatch_lines_random(
        [f"test_sizes.py::test_sum[[]ws{size}[]] PASSED*" for size in (1, 2, 3, 4)]
    )


def test_world_size_list_makes_one_test_per_size_with_ids(basics: pytest.RunResult) -> None:
    basics.stdout.fnmatch_lines_random(
        [
            "*test_ids[[]ws2-a[]] PASSED*",
            "*test_ids[[]ws2-b[]] PASSED*",
            "*test_ids[[]ws3-a[]] PASSED*",
            "*test_ids[[]ws3-b[]] PASSED*",
        ]
    )


def test_bare_world_size_uses_the_default_size(basics: pytest.RunResult) -> None:
    basics.stdout.fnmatch_lines(["distrank: *, default world size 3*", "*::test_default PASSED*"])


def test_class_methods_and_module_marker(basics: pytest.RunResult) -> None:
    basics.stdout.fnmatch_lines(["*TestGroup::test_rank PASSED*", "*TestGroup::test_size PASSED*"])


def test_init_process_group_false_allows_env_rendezvous(basics: pytest.RunResult) -> None:
    basics.stdout.fnmatch_lines(
        ["*::test_self_init[[]1[]] PASSED*", "*::test_self_init[[]2[]] PASSED*"]
    )


def test_module_fixture_is_created_once_per_rank(basics: pytest.RunResult) -> None:
    basics.stdout.fnmatch_lines(
        [f"*::test_uses[[]{i}[]] PASSED*" for i in range(3)]
        + ["*::test_interleaved PASSED*", "test_modfixture.py::test_after PASSED*"]
    )
    lines = sorted(" ".join(words) for words in _records("basics", "modfixture"))
    assert lines == ["setup 0", "setup 1", "teardown 0", "teardown 1"]


def test_pool_is_reused_across_tests(basics: pytest.RunResult) -> None:
    basics.stdout.fnmatch_lines([f"*::test_pid[[]{i}[]] PASSED*" for i in range(4)])
    pids = _records("basics", "reuse")
    assert len(pids) == 8
    assert len({pid for _, pid in pids}) == 2, pids


def test_shared_tmp_path_and_dist_store(basics: pytest.RunResult) -> None:
    basics.stdout.fnmatch_lines(["*::test_share[[]1[]] PASSED*", "*::test_share[[]2[]] PASSED*"])


def test_rank_environment_matches_torchrun(basics: pytest.RunResult) -> None:
    basics.stdout.fnmatch_lines(["*::test_env PASSED*", "*::test_env_init PASSED*"])


def test_autoload_disabled_with_explicit_plugin(basics: pytest.RunResult) -> None:
    basics.stdout.fnmatch_lines(
        ["test_autoload.py::test_controller PASSED*", "test_autoload.py::test_ranks PASSED*"]
    )


def test_preload_option_imports_modules_in_the_fork_server(basics: pytest.RunResult) -> None:
    basics.stdout.fnmatch_lines(
        ["distrank: *, preload heavy,json", "*::test_already_there PASSED*"]
    )


def test_tests_that_need_fresh_ranks_get_a_pool_of_their_own(basics: pytest.RunResult) -> None:
    basics.stdout.fnmatch_lines(
        [
            f"test_fresh.py::test_{name} PASSED*"
            for name in ("a_shared", "b_by_ini", "c_by_marker", "d_shared_again")
        ]
    )
    pids: dict[str, set[str]] = {}
    for name, _, pid in _records("basics", "fresh"):
        pids.setdefault(name, set()).add(pid)
    assert all(len(ranks) == 2 for ranks in pids.values()), pids
    # Three pools: a and d share one; b (by the ini) and c (by the marker) each start their own.
    assert pids["a"] == pids["d"]
    assert len(pids["a"] | pids["b"] | pids["c"]) == 6, pids


def test_preload_of_a_bad_module_name_is_a_usage_error(
    pytester: pytest.Pytester, run_inprocess: RunPytest
) -> None:
    pytester.makepyfile(heavy="import os\n")
    bad = run_inprocess("--distrank-preload=heavy,no-such-module")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*'no-such-module' is not a module name*"])


def test_ordinary_tests_run_in_the_controller(
    pytester: pytest.Pytester, run_inprocess: RunPytest
) -> None:
    pytester.makepyfile(
        """
        import os

        def test_plain():
            assert "RANK" not in os.environ
        """
    )
    result = run_inprocess("-v")
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("*distributed test*")


def test_markers_and_fixtures_are_documented(run_inprocess: RunPytest) -> None:
    result = run_inprocess("--markers")
    result.stdout.fnmatch_lines(
        [
            "@pytest.mark.world_size(*sizes, backend=None, init_process_group=True):*",
            "@pytest.mark.requires_nccl:*",
            "@pytest.mark.requires_gpus(n, memory=None):*",
        ]
    )
    result = run_inprocess("--fixtures")
    for name in ("rank", "world_size", "local_rank", "backend", "pg", "device"):
        result.stdout.fnmatch_lines([f"{name} [[]session scope[]]*"])
    result.stdout.fnmatch_lines(["dist_store*", "shared_tmp_path*"])


# -- two sessions on one machine ----------------------------------------------------------------


def test_two_sessions_at_once_do_not_collide(basics: pytest.RunResult) -> None:
    """Rendezvous never guesses a port: two sessions on one machine run side by side, ``basics``
    and the one started just before it (:data:`BESIDE`); both pass."""
    beside = _BESIDE.get("basics")
    assert isinstance(beside, pytest.RunResult), f"the session beside basics did not end: {beside}"
    assert beside.ret == 0, beside.stdout.str() + beside.stderr.str()
    beside.assert_outcomes(passed=10)
    assert basics.ret == 0, basics.stdout.str()

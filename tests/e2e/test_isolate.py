"""End-to-end: ``--distrank-isolate``, a pool of its own for every test, its ranks forked from
rank templates (the default ``--distrank-fresh-ranks=fork``): what each fork has anew, what it
never shares with another (hostile.py), and what the pools leave open.

One shared session, ``isolate``; its files record what the ranks saw (test_basics.py's writer).
"""

from __future__ import annotations

import json

import pytest

from ..helpers import SharedSession
from .hostile import HOSTILE, nothing_imported_is_shared
from .test_basics import _FOLDERS, _records, _writer

ISOLATE = {
    "test_isolate.py": """
        import os, pytest

        @pytest.mark.world_size(2)
        @pytest.mark.parametrize("i", range(4))
        def test_pid(rank, i):
            with open(RECORD + "-isolate.txt", "a") as f:
                f.write(f"{rank} {os.getpid()}\\n")
        """,
    # Fresh ranks forked from templates (pool/worker/template.py): what each has anew.
    "test_fresh.py": """
        import json, multiprocessing, os, signal, threading, pytest

        # What an import does in a rank stays in a fork of it (the template imported it).
        os.environ["SET_AT_IMPORT"] = "yes"

        def on_child(signum, frame):
            pass

        signal.signal(signal.SIGCHLD, on_child)

        @pytest.mark.world_size(2)
        @pytest.mark.parametrize("i", range(3))
        def test_fresh(rank, i, tmp_path, request, capfd):
            print(f"own output {i} {rank}")
            own = capfd.readouterr().out
            fact = {
                "i": i, "rank": rank, "pid": os.getpid(), "ppid": os.getppid(),
                "pgid": os.getpgid(0), "tag": os.environ["DISTRANK_POOL_TAG"],
                "tmp": str(tmp_path), "worker": request.config.workerinput["workerid"],
                "env_worker": os.environ["PYTEST_XDIST_WORKER"], "own": own,
                "threads": sorted(t.name for t in threading.enumerate()),
                "name": multiprocessing.current_process().name,
                "imported_env": os.environ.get("SET_AT_IMPORT"),
                "sigchld_kept": signal.getsignal(signal.SIGCHLD) is on_child,
            }
            with open(RECORD + "-fresh.txt", "a") as f:
                f.write(json.dumps(fact) + "\\n")
        """,
    # A parallel op at import starts OpenMP's threads in the template: it must not fork.
    "test_omp.py": """
        import pytest, torch

        BIG = torch.ones(4_000_000).sum()

        @pytest.mark.world_size(2)
        @pytest.mark.parametrize("i", range(2))
        def test_after_a_parallel_import(rank, i):
            assert torch.ones(4_000_000).sum().item() == 4_000_000
        """,
    # A fork makes the items of its own test only (pool/worker/forkcollect.py): its conftest's
    # pytest_pycollect_makeitem sees no other name of the module or class.
    "test_pruned/conftest.py": """
        import os

        def pytest_pycollect_makeitem(collector, name, obj):
            if "DISTRANK_POOL_TAG" in os.environ and name.startswith(("test_", "Test")):
                with open(RECORD + "-collected.txt", "a") as f:
                    f.write(f"{os.getpid()} {collector.name} {name}\\n")
        """,
    "test_pruned/test_pruned.py": """
        import os, unittest, pytest

        class Cases(unittest.TestCase):  # pytest makes an instance per item it collects
            def __init__(self, methodName="runTest"):
                super().__init__(methodName)
                if "DISTRANK_POOL_TAG" in os.environ:
                    with open(RECORD + "-instances.txt", "a") as f:
                        f.write(f"{os.getpid()} {methodName}\\n")

            @pytest.mark.world_size(2)
            def test_a(self):
                pass

            @pytest.mark.world_size(2)
            def test_b(self):
                pass

        @pytest.mark.world_size(2)
        def test_one(rank):
            pass

        @pytest.mark.world_size(2)
        @pytest.mark.parametrize("i", range(2))
        def test_two(rank, i):
            pass

        class TestThree:
            @pytest.mark.world_size(2)
            def test_method(self, rank):
                pass

        def test_here():
            pass
        """,
    # Ordinary tests run in the pytest process: the first and the last one count its open fds.
    "test_fds.py": """
        import os, pytest

        counts = []

        def test_a_first():
            counts.append(len(os.listdir("/proc/self/fd")))

        @pytest.mark.world_size(2)
        @pytest.mark.parametrize("i", range(12))
        def test_isolated(rank, i):
            pass

        def test_z_last():
            grown = len(os.listdir("/proc/self/fd")) - counts[0]
            # The fork server, the last pool (still stopping) and the rank templates of two
            # kinds of pool (their pipes and sentinels) hold some; 12 pools that leaked
            # theirs would hold dozens more.
            assert grown <= 16, f"{grown} more fds open after 12 isolated pools"
        """,
}


@pytest.fixture
def isolate(shared_session: SharedSession) -> pytest.RunResult:
    return shared_session(
        "isolate",
        _writer("isolate", {**ISOLATE, **HOSTILE}),
        "-v",
        "--distrank-isolate",
        "--hostile-flag=yes",
        "-W",
        "error",  # a fork's leftovers of its template (an unclosed file) would fail its tests
        "-p",
        "no:randomly",
    )


def test_isolate_gives_fresh_processes_per_test(isolate: pytest.RunResult) -> None:
    isolate.stdout.fnmatch_lines(["distrank: *, isolate*"])
    isolate.stdout.fnmatch_lines_random([f"*::test_pid[[]{i}[]] PASSED*" for i in range(4)])
    assert len({pid for _, pid in _records("isolate", "isolate")}) == 8
    # 12 + 4 + 3 + 2 + 6 tests, each in a pool of its own.
    isolate.stdout.fnmatch_lines(["29 distributed tests; pools started: 29 at world size 2"])


def test_fresh_ranks_are_forked_from_templates_and_inherit_nothing_of_them(
    isolate: pytest.RunResult,
) -> None:
    """Each fresh rank is its own process, forked from its rank's template (a process that is
    that rank before its group starts), with what template.NOT_INHERITED lists made anew."""
    text = (_FOLDERS["isolate"] / "record-fresh.txt").read_text()
    facts = [json.loads(line) for line in text.splitlines()]
    assert sorted((f["i"], f["rank"]) for f in facts) == [(i, r) for i in range(3) for r in (0, 1)]
    assert len({f["pid"] for f in facts}) == 6
    for f in facts:
        assert f["pgid"] == f["pid"], "a rank leads its own process group"
        assert f["own"] == f"own output {f['i']} {f['rank']}\n", "capture of its own"
        assert {"distrank-flight-recorder", "distrank-parent-death"} <= set(f["threads"])
        assert f["worker"] == f["env_worker"]
        assert f["imported_env"] == "yes" and f["sigchld_kept"], "what the import set stays"
    # Forked by its rank's template, the same for every test; the fork server would be the
    # parent of both ranks.
    parents = [{f["ppid"] for f in facts if f["rank"] == rank} for rank in (0, 1)]
    assert len(parents[0]) == len(parents[1]) == 1 and parents[0] != parents[1]
    assert len({f["tag"] for f in facts}) == 3  # a pool's tag, per test
    assert len({f["tmp"] for f in facts}) == 6
    assert len({f["worker"] for f in facts}) == 6
    assert len({f["name"] for f in facts}) == 6  # distrank-pool<P>-rank<R>: its pool's


def test_nothing_a_fresh_rank_imports_is_shared_when_forked_from_a_template(
    isolate: pytest.RunResult,
) -> None:
    nothing_imported_is_shared(_FOLDERS["isolate"], isolate)


def test_a_parallel_op_at_import_runs_in_the_fork_not_in_its_template(
    isolate: pytest.RunResult,
) -> None:
    """A template imports no test module: OpenMP's pool, which a fork would not keep (its first
    parallel op would hang), starts in each fork itself; every fresh rank is forked."""
    isolate.stdout.fnmatch_lines_random(
        [f"*::test_after_a_parallel_import[[]{i}[]] PASSED*" for i in range(2)]
    )
    assert "start from nothing" not in isolate.stdout.str()


def test_a_fork_makes_the_items_of_its_own_test_only(isolate: pytest.RunResult) -> None:
    """Each fork's collection goes straight to its test: the module's and the class's other
    names get no item (pytest would make them all, then keep the test's by node id)."""
    isolate.stdout.fnmatch_lines_random(
        ["*::test_one PASSED*", "*::test_two[[]1[]] PASSED*", "*::TestThree::test_method PASSED*"]
    )
    seen: dict[str, set[tuple[str, str]]] = {}
    for pid, collector, name in _records("isolate", "collected"):
        seen.setdefault(pid, set()).add((collector, name))
    module = "test_pruned.py"
    one, two = {(module, "test_one")}, {(module, "test_two")}
    three = {(module, "TestThree"), ("TestThree", "test_method")}
    assert sorted(map(sorted, seen.values())) == sorted(
        map(sorted, [one, one, *[two] * 4, three, three])
    )


def test_a_fork_makes_an_instance_for_its_own_unittest_method_only(
    isolate: pytest.RunResult,
) -> None:
    """pytest makes a unittest class's instance for each of its methods it collects (one of
    PyTorch's RPC classes: 215 of them); a fork, for its own test's method only."""
    isolate.stdout.fnmatch_lines_random(["*::Cases::test_a PASSED*", "*::Cases::test_b PASSED*"])
    made: dict[str, set[str]] = {}
    for pid, name in _records("isolate", "instances"):
        made.setdefault(pid, set()).add(name)
    methods = sorted(sorted(names - {"runTest"}) for names in made.values())  # pytest's holder
    assert methods == [["test_a"], ["test_a"], ["test_b"], ["test_b"]]


def test_isolated_pools_release_their_file_descriptors(isolate: pytest.RunResult) -> None:
    isolate.assert_outcomes(passed=32)
    isolate.stdout.fnmatch_lines(["*::test_a_first PASSED*", "*::test_z_last PASSED*"])

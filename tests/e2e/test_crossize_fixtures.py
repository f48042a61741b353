"""End-to-end: fixtures at another world size (``pytest_distrank.fixture(world_size=N)``, issue
#31, item 3): a producer runs once, on ranks of its own, before the first test that requests it;
tests at other sizes (and ordinary tests) get its folder; its failure or hang errors every test
that requests it, with its report, and it is not run again; a producer no selected test requests
never runs; bad world sizes error the tests that request them, alone.

One inner session (``crossize``: a producer in conftest.py used from two modules, a failing
one and a hanging one, gloo on the CPU) holds every scenario that runs ranks; the bad world
sizes start no rank, and their session runs in-process. The xdist lock and launcher mode's skip
are unit tests (tests/unit/test_crossize.py): an xdist run or a launched world costs seconds
more than this whole file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..helpers import RunPytest, SharedSession, failure_section

CONFTEST = """
import pytest, torch.distributed as dist
import pytest_distrank


def note(folder, line):
    with open(folder / "runs.log", "a") as f:
        f.write(line + "\\n")


@pytest_distrank.fixture(world_size=4)
def made(rank, world_size, pg, fixture_path, request):
    note(request.config.rootpath, f"made {rank}")
    (fixture_path / f"r{rank}").write_text(str(world_size))
    dist.barrier()


@pytest_distrank.fixture(world_size=3)
def unused(rank, fixture_path, request):
    note(request.config.rootpath, f"unused {rank}")
"""

MADE = """
import pytest


@pytest.mark.world_size(2, 3)
def test_other_sizes_read_it(made, rank, world_size):
    assert sorted(p.name for p in made.iterdir()) == ["r0", "r1", "r2", "r3"]
    assert (made / "r3").read_text() == "4"


def test_an_ordinary_test_reads_it(made):
    assert (made / "r0").read_text() == "4"


@pytest.mark.world_size(2)
def test_deselected(unused):
    pass
"""

OTHER_MODULE = """
import pytest


@pytest.mark.world_size(3)
def test_from_another_module(made, world_size):
    assert len(list(made.iterdir())) == 4
"""

FAILING = """
import pytest
import pytest_distrank


@pytest_distrank.fixture(world_size=3)
def broken(rank, pg, fixture_path, request):
    with open(request.config.rootpath / "runs.log", "a") as f:
        f.write(f"broken {rank}\\n")
    assert rank != 1, "rank 1 refuses to write"


@pytest.mark.world_size(2)
def test_needs_broken(broken):
    pass


def test_ordinary_needs_broken(broken):
    pass
"""

HANGING = """
import time
import pytest
import pytest_distrank
import torch.distributed as dist

pytestmark = pytest.mark.timeout(2)


@pytest_distrank.fixture(world_size=2)
def stuck(rank, pg, fixture_path):
    if rank == 0:
        time.sleep(60)
    dist.barrier()


@pytest.mark.world_size(2)
def test_needs_stuck(stuck):
    pass
"""


#: The folder the shared session ran in (its runs.log), set when it is written.
WHERE: dict[str, Path] = {}


@pytest.fixture
def crossize(shared_session: SharedSession) -> pytest.RunResult:
    def write(folder: Path) -> None:
        WHERE["crossize"] = folder
        (folder / "conftest.py").write_text(CONFTEST)
        (folder / "test_made.py").write_text(MADE)
        (folder / "test_other_module.py").write_text(OTHER_MODULE)
        (folder / "test_failing.py").write_text(FAILING)
        (folder / "test_hanging.py").write_text(HANGING)

    return shared_session(
        "crossize",
        write,
        "-v",
        "-rs",
        "-p",
        "no:randomly",
        "--distrank-failure-grace=1",
        "--deselect=test_made.py::test_deselected",
    )


def runs(name: str) -> list[str]:
    """What the shared session's producers wrote to its runs.log: one line per rank and run."""
    log = WHERE["crossize"] / "runs.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return sorted(line for line in lines if line.split()[0] == name)


def test_it_runs_once_and_every_size_gets_its_folder(
    crossize: pytest.RunResult,
) -> None:
    crossize.stdout.fnmatch_lines_random(
        [
            "*::test_other_sizes_read_it[[]ws2[]] PASSED*",
            "*::test_other_sizes_read_it[[]ws3[]] PASSED*",
            "*::test_an_ordinary_test_reads_it PASSED*",
            "*::test_from_another_module PASSED*",
            "fixture 'made' (world size 4) passed (ran in * s, before "
            "test_made.py::test_other_sizes_read_it[[]ws2[]]); its folder: */distrank-fixtures/"
            "made-*",
        ]
    )
    assert runs("made") == [f"made {r}" for r in range(4)]  # once, on 4 ranks


def test_a_producer_is_no_test_of_the_counts(crossize: pytest.RunResult) -> None:
    crossize.assert_outcomes(passed=4, errors=3, deselected=1)
    crossize.stdout.no_fnmatch_line("*distrank-fixture*PASSED*")


def test_no_selected_test_requests_it_so_it_never_runs(
    crossize: pytest.RunResult,
) -> None:
    assert runs("unused") == []
    crossize.stdout.no_fnmatch_line("*fixture 'unused'*")


def test_a_failed_producer_errors_each_test_that_requests_it_once_run(
    crossize: pytest.RunResult,
) -> None:
    lines = crossize.stdout.lines
    for name in ("test_needs_broken", "test_ordinary_needs_broken"):
        failure_section(lines, f"ERROR at setup of {name}").fnmatch_lines(
            [
                f"test_failing.py::{name}: fixture 'broken' (world size 3) failed in its call: "
                "[[]rank 1/3[]] AssertionError: rank 1 refuses to write*",
                "It ran once, before test_failing.py::test_needs_broken, on 3 ranks of its own; "
                "every test that requests it errors with this report, and it is not run again*",
                "What to do: fix 'broken' (its report follows)*",
                "*rank 1/3  failed in call: AssertionError: rank 1 refuses to write*root cause",
            ]
        )
    assert runs("broken") == [f"broken {r}" for r in range(3)]


def test_a_hung_producer_ends_at_its_deadline_and_errors_its_users(
    crossize: pytest.RunResult,
) -> None:
    section = failure_section(crossize.stdout.lines, "ERROR at setup of test_needs_stuck")
    section.fnmatch_lines(
        [
            "test_hanging.py::test_needs_stuck: fixture 'stuck' (world size 2) failed in its "
            "call: *",
            "*rank 0/2  timed out in call after 2 s; blocked in stuck at test_hanging.py:13*",
        ]
    )


BAD = """
import pytest
import pytest_distrank


@pytest_distrank.fixture(world_size=0)
def zero(fixture_path):
    pass


@pytest_distrank.fixture(world_size=100_000)
def huge(fixture_path):
    pass


@pytest_distrank.fixture(world_size=2, backend="nccl")
def on_gpus(fixture_path):
    pass


@pytest.mark.world_size(2)
def test_zero(zero):
    pass


def test_huge(huge):
    pass


@pytest.mark.world_size(2)
def test_on_gpus(on_gpus):
    pass


def test_fixture_path_outside_a_producer(fixture_path):
    pass


def test_plain():
    pass
"""


def test_bad_world_sizes_error_the_tests_that_request_them_alone(
    pytester: pytest.Pytester, run_inprocess: RunPytest
) -> None:
    pytester.makepyfile(test_bad=BAD)
    result = run_inprocess("-rEs", "-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=3, skipped=1)
    result.stdout.fnmatch_lines_random(
        [
            "test_bad.py::test_zero: fixture 'zero': pytest_distrank.fixture(world_size=0): "
            "world size 0 is not a positive integer; write e.g. "
            "pytest_distrank.fixture(world_size=4).",
            "*test_bad.py::test_huge: fixture 'huge' (world size 100000) cannot run: world size "
            "100000 needs 100000 rank processes on this machine, at most * ranks*",
            "SKIPPED [[]1[]] test_bad.py:*: fixture 'on_gpus' (world size 2) cannot run here: "
            "backend 'nccl' is not available*",
            "*test_fixture_path_outside_a_producer uses the fixture 'fixture_path', which exists "
            "only in a function decorated with @pytest_distrank.fixture(world_size=N)*",
        ]
    )

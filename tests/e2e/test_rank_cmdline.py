"""End-to-end: what a rank's own pytest session makes of the controller's command line.

Runs in the outer pytest process. One inner session (``cmdline``) puts everything that must
reach the ranks on one command line and in one ``pytest.ini``, each scenario a file of its own:
``-W error``, options a conftest.py adds (space-separated, after positional files), ``-x``,
``--runxfail``, ``-s``, a conftest that sets ``verbose`` to a boolean, and ini ``addopts`` with
``-x --junitxml`` that the controller honours and the ranks must not repeat. The tests check
what ranks see and do, not how the arguments are spelled for them. The plugin loaded by module
path, with autoloading off and no installed distribution, needs a session of its own.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from ..helpers import RUN_TIMEOUT, SharedSession

REPO_ROOT = Path(__file__).resolve().parents[2]

WS2 = """
import pytest

@pytest.mark.world_size(2)
def test_two(rank):
    assert rank in (0, 1)
"""

CMDLINE = {
    "pytest.ini": """
        [pytest]
        addopts = -x --junitxml=session.xml
        """,
    "conftest.py": """
        def pytest_addoption(parser):
            parser.addoption("--scale", type=int, default=1)
            parser.addoption("--tag", required=True)

        def pytest_configure(config):
            config.option.verbose = True  # as DeepSpeed's tests/conftest.py does
        """,
    "test_scale.py": """
        import pytest, torch, torch.distributed as dist

        @pytest.mark.world_size(2)
        def test_scale(request, rank, pg):
            scale = request.config.getoption("scale")
            tag = request.config.getoption("tag")
            seen = torch.tensor([float(scale)])
            dist.all_reduce(seen, group=pg)
            print(f"rank {rank}: scale={scale} tag={tag} sum={seen.item()}")
            assert (scale, tag, seen.item()) == (3, "blue", 6.0), f"rank {rank}"
        """,
    "test_cache.py": """
        import pytest

        @pytest.mark.world_size(2)
        def test_cache(rank, cache):
            cache.set(f"distrank/rank{rank}", rank)
            assert cache.get(f"distrank/rank{rank}", None) == rank
        """,
    "test_talk.py": """
        import sys, pytest

        @pytest.mark.world_size(2)
        def test_talk(rank):
            print(f"hello from rank {rank}")
            print(f"problem on rank {rank}", file=sys.stderr)
        """,
    "test_verbose.py": WS2,
    "test_werror.py": WS2,
    # Last: its first failure stops the session (-x), so the second never runs.
    "test_zz_runxfail.py": """
        import pytest

        @pytest.mark.world_size(2)
        @pytest.mark.xfail(reason="known bug")
        @pytest.mark.parametrize("i", [1, 2])
        def test_known_bug(rank, i):
            assert rank < 0, f"rank {rank} ran the xfail test as an ordinary one"
        """,
}

_RAN_IN: list[Path] = []


def _write(folder: Path) -> None:
    _RAN_IN.append(folder)
    for name, source in CMDLINE.items():
        (folder / name).write_text(textwrap.dedent(source))


@pytest.fixture
def cmdline(shared_session: SharedSession) -> pytest.RunResult:
    files = [name for name in CMDLINE if name.startswith("test_")]
    # The space-separated spellings, the controller's positional files and -x between options
    # must not confuse the ranks: the option values reach them, the file list stays the pool's.
    return shared_session(
        "cmdline",
        _write,
        *files,
        "--scale",
        "3",
        "--tag",
        "blue",
        "-x",
        "-rfP",
        "-W",
        "error",
        "--runxfail",
        "-s",
    )


def test_cmdline_session_totals(cmdline: pytest.RunResult) -> None:
    cmdline.assert_outcomes(passed=5, failed=1)


def test_the_cache_fixture_works_in_ranks(cmdline: pytest.RunResult) -> None:
    """Ranks block pytest's cacheprovider (its last-failed writes are the controller's), yet
    the cache fixture reads and writes the project's cache, as in a pytest-xdist worker."""
    cmdline.stdout.fnmatch_lines(["*test_cache.py::test_cache PASSED*"])
    values = _RAN_IN[0] / ".pytest_cache" / "v" / "distrank"
    assert sorted(p.name for p in values.iterdir()) == ["rank0", "rank1"]


def test_warnings_as_errors_on_the_command_line(cmdline: pytest.RunResult) -> None:
    cmdline.stdout.fnmatch_lines(["*test_werror.py::test_two PASSED*"])


def test_conftest_options_reach_every_rank(cmdline: pytest.RunResult) -> None:
    cmdline.stdout.fnmatch_lines(["*test_scale.py::test_scale PASSED*"])
    cmdline.stdout.fnmatch_lines_random(
        [
            "[[]rank 0/2[]] rank 0: scale=3 tag=blue sum=6.0",
            "[[]rank 1/2[]] rank 1: scale=3 tag=blue sum=6.0",
        ]
    )


def test_runxfail_reaches_the_ranks(cmdline: pytest.RunResult) -> None:
    cmdline.stdout.fnmatch_lines(
        [
            "FAILED *::test_known_bug[[]1[]] - [[]all 2 ranks[]] AssertionError: rank * ran the "
            "xfail test as*"
        ]
    )


def test_boolean_verbose_from_a_conftest_does_not_break_pools(cmdline: pytest.RunResult) -> None:
    cmdline.stdout.fnmatch_lines(["*test_verbose.py::test_two PASSED*"])


def test_capture_no_shows_every_ranks_output_labelled(cmdline: pytest.RunResult) -> None:
    cmdline.stdout.fnmatch_lines(["*test_talk.py::test_talk*PASSED*"])
    cmdline.stdout.fnmatch_lines_random(
        [
            "[[]rank 0/2[]] hello from rank 0",
            "[[]rank 1/2[]] hello from rank 1",
            "[[]rank 0/2[]] problem on rank 0",
            "[[]rank 1/2[]] problem on rank 1",
        ]
    )


def test_rank_addopts_and_junit_do_not_leak_into_ranks(cmdline: pytest.RunResult) -> None:
    # -x (the ini's addopts, and the command line's) stops the controller after the first
    # failure; the ranks write no junitxml report of their own.
    cmdline.stdout.fnmatch_lines(["*stopping after 1 failures*"])
    cmdline.stdout.no_fnmatch_line("*test_known_bug[[]2[]]*")
    folder = _RAN_IN[0]
    assert sorted(p.name for p in folder.glob("*.xml")) == ["session.xml"]
    assert not list(folder.rglob("rank*.xml"))


@pytest.mark.usefixtures("run_pytest")  # its process-leak check; the run itself is below
def test_plugin_loaded_by_module_path_without_install(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "Not installed": -p distrank finds the entry point even with autoload off, so a
    # sitecustomize hides this distribution from importlib.metadata in the controller, the fork
    # server and the ranks alike; the package itself comes from the checkout on PYTHONPATH.
    hide = pytester.mkdir("hide_install")
    (hide / "sitecustomize.py").write_text(
        "import importlib.metadata as md\n"
        "_distributions = md.distributions\n"
        "def distributions(**kwargs):\n"
        "    for dist in _distributions(**kwargs):\n"
        "        if dist.metadata['Name'] != 'pytest-distrank':\n"
        "            yield dist\n"
        "md.distributions = distributions\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hide), str(REPO_ROOT)]))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(test_by_path=WS2)
    # Not run_pytest: it would add "-p distrank".
    result = pytester.runpytest_subprocess(
        "-p", "pytest_distrank.plugin", "-v", timeout=RUN_TIMEOUT
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_by_path.py::test_two PASSED*"])

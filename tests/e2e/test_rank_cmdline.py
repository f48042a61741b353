"""End-to-end: the command line of a rank's own pytest session (pool/rankargs.py).

Runs in the outer pytest process: each test runs pytest in a subprocess through ``run_pytest``
(``pytest -p distrank ARGS`` with the process-leak check), or, for the plugin loaded by module
path, ``runpytest_subprocess`` itself. The unit tests of the argument list itself are in
``tests/unit/test_rankargs.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ..helpers import RunPytest

REPO_ROOT = Path(__file__).resolve().parents[2]

WS2 = """
import pytest

@pytest.mark.world_size(2)
def test_two(rank):
    assert rank in (0, 1)
"""


def test_warnings_as_errors_on_the_command_line(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(test_werror=WS2)
    result = run_pytest("-W", "error", "-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_werror.py::test_two PASSED*"])


def test_conftest_options_reach_every_rank(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makeconftest(
        """
        def pytest_addoption(parser):
            parser.addoption("--scale", type=int, default=1)
            parser.addoption("--tag", required=True)
        """
    )
    pytester.makepyfile(
        test_scale="""
        import pytest, torch, torch.distributed as dist

        @pytest.mark.world_size(2)
        def test_scale(request, rank, pg):
            scale = request.config.getoption("scale")
            tag = request.config.getoption("tag")
            seen = torch.tensor([float(scale)])
            dist.all_reduce(seen, group=pg)
            print(f"rank {rank}: scale={scale} tag={tag} sum={seen.item()}")
            assert (scale, tag, seen.item()) == (3, "blue", 6.0), f"rank {rank}"
        """
    )
    # The space-separated spellings, the controller's positional file and -x must not confuse
    # the ranks: the option values reach them, the file list stays the pool's.
    result = run_pytest("test_scale.py", "--scale", "3", "--tag", "blue", "-x", "-rP")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*rank 0/2*", "rank 0: scale=3 tag=blue sum=6.0"])
    result.stdout.fnmatch_lines(["*rank 1/2*", "rank 1: scale=3 tag=blue sum=6.0"])


def test_runxfail_reaches_the_ranks(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    pytester.makepyfile(
        test_runxfail="""
        import pytest

        @pytest.mark.world_size(2)
        @pytest.mark.xfail(reason="known bug")
        def test_known_bug(rank):
            assert rank < 0, f"rank {rank} ran the xfail test as an ordinary one"
        """
    )
    result = run_pytest("--runxfail", "-ra")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["FAILED *::test_known_bug - [[]rank *] AssertionError: rank * ran the xfail test as*"]
    )


def test_boolean_verbose_from_a_conftest_does_not_break_pools(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makeconftest(
        """
        def pytest_configure(config):
            config.option.verbose = True  # as DeepSpeed's tests/conftest.py does
        """
    )
    pytester.makepyfile(test_verbose=WS2)
    result = run_pytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_verbose.py::test_two PASSED*"])


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
    result = pytester.runpytest_subprocess("-p", "pytest_distrank.plugin", "-v", timeout=180)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_by_path.py::test_two PASSED*"])

"""End-to-end scenario of fresh ranks, run by two shared sessions: what a test module and a
conftest do at import and at the session's start stays each rank process's own.

Not a test file: tests/e2e/test_basics.py's ``basics`` session (``--distrank-fresh-ranks=start``)
and tests/e2e/test_isolate.py's ``isolate`` session (forked from templates, the default) each
write :data:`HOSTILE` and check it with :func:`nothing_imported_is_shared`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

#: What a test module and a conftest do at import and at the session's start is each rank's own,
#: on ranks started afresh (``basics``: ``--distrank-fresh-ranks=start``) and on ranks forked from
#: templates (``isolate``: the default), each case one that forks of a template that had collected
#: got wrong. In its own folder: its conftest.py (an initial one: ``test*`` beside the invocation)
#: adds ``--hostile-flag``, given on both command lines.
HOSTILE = {
    "test_hostile/conftest.py": """
        import os, pytest

        @pytest.fixture
        def conftest_pid():
            return os.getpid()

        def pytest_addoption(parser):
            parser.addoption("--hostile-flag", default="unset")

        def note(event, config):
            if "DISTRANK_POOL_TAG" in os.environ:  # in ranks only
                with open(RECORD + "-hooks.txt", "a") as f:
                    f.write(f"{os.getpid()} {event} {config.getoption('--hostile-flag')}\\n")

        def pytest_configure(config):
            note("configure", config)

        def pytest_sessionstart(session):
            note("sessionstart", session.config)

        def pytest_sessionfinish(session):
            note("sessionfinish", session.config)

        def pytest_unconfigure(config):
            note("unconfigure", config)
        """,
    "test_hostile/test_hostile.py": """
        import multiprocessing, os, subprocess, uuid, pytest

        if "DISTRANK_POOL_TAG" in os.environ:  # in ranks only: the controller imports it too
            FILE = open(__file__)
            LOCK = multiprocessing.Lock()
            CHILD = subprocess.Popen(["sleep", "60"])
            DRAWN = uuid.uuid4().hex
            PID = os.getpid()

        @pytest.mark.distrank_isolate
        @pytest.mark.world_size(2)
        @pytest.mark.parametrize("i", range(2))
        def test_nothing_imported_is_shared(rank, i, request, conftest_pid):
            from _pytest.faulthandler import fault_handler_stderr_fd_key

            try:
                assert PID == os.getpid() == conftest_pid, "imported by this very process"
                with open(__file__) as again:
                    assert FILE.read() == again.read(), "the file's offset is this process's"
                assert LOCK.acquire(timeout=2), "the lock is this process's"  # never released
                assert CHILD.poll() is None, "its child runs"
            finally:
                CHILD.kill()
                CHILD.wait()
            fd = request.config.stash[fault_handler_stderr_fd_key]  # faulthandler_timeout's
            dumps_to = os.readlink(f"/proc/self/fd/{fd}")
            assert dumps_to.endswith(f"-rank{rank}.log"), "its own rank log, not a template's"
            with open(RECORD + "-hostile.txt", "a") as f:
                f.write(f"{rank} {i} {DRAWN} {dumps_to}\\n")
        """,
}


def _records(folder: Path, scenario: str) -> list[list[str]]:
    return [line.split() for line in (folder / f"record-{scenario}.txt").read_text().splitlines()]


def nothing_imported_is_shared(folder: Path, result: pytest.RunResult) -> None:
    """:data:`HOSTILE`'s checks held in every rank of the session that ran in ``folder``: each
    rank process imported the test module and ran its conftest's hooks itself, with its option's
    value."""
    result.stdout.fnmatch_lines_random(
        [f"*::test_nothing_imported_is_shared[[]{i}[]] PASSED*" for i in range(2)]
    )
    rows = _records(folder, "hostile")
    assert sorted((rank, i) for rank, i, _, _ in rows) == [(r, i) for r in "01" for i in "01"]
    assert len({drawn for _, _, drawn, _ in rows}) == 4, "a value drawn at import: its own"
    assert len({log for *_, log in rows}) == 4, "faulthandler_timeout dumps: its own log"
    events: dict[str, list[tuple[str, str]]] = {}
    for pid, event, flag in _records(folder, "hooks"):
        events.setdefault(pid, []).append((event, flag))
    hooks = ("configure", "sessionstart", "sessionfinish", "unconfigure")
    once = [(event, "yes") for event in hooks]
    assert len(events) >= 4 and all(seen == once for seen in events.values()), events

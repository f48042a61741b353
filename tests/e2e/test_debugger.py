"""End-to-end: a debugger in one rank (docs/debugging.md), under a pseudo-terminal.

``breakpoint()``, ``--pdb``, ``--trace`` and ``--distrank-debug-rank`` each open pdb in a rank
whose input and output travel through the controller, labelled ``[rank r/n]``; without a
terminal each says why. ``in_terminal`` types the answers at the prompts and checks that no
process outlives the run.

Scenarios share sessions, one file each, their prompts answered in file order: a session per
set of options (``--pdb``; ``--pdb`` without a grace; ``--trace`` of a debug rank; none, with a
slow person at the prompt), each ending with its one scenario that must come last (stepping out
of a test types ``n`` until the debugger lets go; ``q`` and Ctrl-C end the session). Each test
checks its scenario's lines: from the line that starts its test (``-v``) to its outcome. The
sessions without a terminal share too (two, one beside the other: ``NO_TERMINAL`` and
``PDB_NO_TERMINAL``); a breakpoint() under xdist is checked in test_ecosystem.py's xdist session.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable

import pytest

from pytest_distrank.envvars import TEST_WAITS_ENV

from ..helpers import CTRL_C, InTerminal, SharedSession, TerminalRun, failure_section
from .test_faults import Session

BREAKPOINT_IN_RANK_1 = """
    import pytest
    import torch.distributed as dist

    @pytest.mark.world_size(2)
    def test_debug_me(rank):
        x = rank * 10
        if rank == 1:
            breakpoint()
        dist.barrier()
        assert x == rank * 10

    @pytest.mark.world_size(2)
    def test_after(rank):
        dist.barrier()
"""

RANK_1_FAILS = """
    import pytest
    import torch
    import torch.distributed as dist

    @pytest.mark.world_size(2)
    def test_sum(rank):
        t = torch.ones(2) * rank
        dist.all_reduce(t)
        if rank == 1:
            assert t.sum() == 5
        dist.barrier()
"""


BOTH_STOP = """
    import pytest
    import torch.distributed as dist

    @pytest.mark.world_size(2)
    def test_both_stop(rank):
        if rank == 0:
            import pdb; pdb.set_trace()
        else:
            breakpoint()
        dist.barrier()
"""

#: breakpoint() in rank 1 while the pool of world size 3 starts (its setup hook): the session's
#: other pools are of other sizes and start without a prompt.
POOL_START_HOOK = """
    def pytest_distrank_rank_setup(config, rank, world_size):
        if rank == 1 and world_size == 3:
            breakpoint()
"""
AFTER_THE_POOL_START = """
    import pytest

    @pytest.mark.world_size(3)
    def test_after_the_setup_hook(rank):
        assert rank in (0, 1, 2)
"""

ALL_FAIL = """
    import pytest

    @pytest.mark.world_size(2)
    def test_all_fail(rank):
        assert rank == 7
"""

STEP_OUT = """
    import pytest

    @pytest.mark.world_size(2)
    def test_first(rank):
        if rank == 1:
            breakpoint()
        assert rank >= 0

    @pytest.mark.world_size(2)
    def test_second(rank):
        assert rank >= 0
"""
#: Far more ``n`` than the lines from the test to the end of its protocol.
STEPS = ["n"] * 2000

DEADLINE = """
    import pytest
    import torch.distributed as dist

    @pytest.mark.world_size(2)
    @pytest.mark.timeout(2)
    def test_slow_person(rank):
        if rank == 0:
            breakpoint()
        dist.barrier()
"""

THREAD = """
    import threading
    import pytest

    @pytest.mark.world_size(2)
    def test_thread(rank):
        errors = []

        def body():
            try:
                breakpoint()
            except BaseException as exc:
                errors.append(str(exc))

        worker = threading.Thread(target=body, name="helper")
        worker.start()
        worker.join()
        assert not errors, errors[0]
"""

TRACED = """
    import pytest

    @pytest.mark.world_size(2)
    def test_traced(rank):
        y = rank + 100
        assert y > 0
"""

ASKS = """
    import pytest
    import torch.distributed as dist

    @pytest.mark.world_size(2)
    def test_asks(rank):
        print(f"hello from rank {rank}")
        if rank == 1:
            name = input("name? ")
            print(f"got {name}")
        dist.barrier()
"""

#: Terminal sessions already run, by name (as ``shared_session`` keeps subprocess ones).
_TERMINAL: dict[str, TerminalRun | BaseException] = {}

TerminalSession = Callable[..., TerminalRun]


@pytest.fixture
def terminal_session(
    pytester: pytest.Pytester, in_terminal: InTerminal, monkeypatch: pytest.MonkeyPatch
) -> TerminalSession:
    """``run(name, files, args, answers, pause=0.0)``: one ``in_terminal`` session for every
    test that names it, run the first time one asks; its leak check runs after that test.
    ``-v -rfEsp``: each test's lines start at its name, and no passing test's captured output is
    shown. The end-of-test rule's waits take 1 s (``DISTRANK_TEST_WAITS``), as in
    ``run_pytest``."""

    def run(
        name: str, files: dict[str, str], args: list[str], answers: list[str], pause: float = 0.0
    ) -> TerminalRun:
        if name not in _TERMINAL:
            monkeypatch.setenv(TEST_WAITS_ENV, "1")
            for path, source in files.items():
                (pytester.path / path).write_text(textwrap.dedent(source))
            try:
                _TERMINAL[name] = in_terminal([*args, "-v", "-rfEsp"], answers, pause)
            except pytest.fail.Exception as exc:  # ran past its time: each test fails with it
                _TERMINAL[name] = exc
        result = _TERMINAL[name]
        if isinstance(result, BaseException):
            pytest.fail(f"the terminal session {name!r} did not finish: {result}")
        return result

    return run


def _region(run: TerminalRun, nodeid: str) -> list[str]:
    """The lines of one test under ``-v``: from the line that starts it to its outcome's."""
    lines = run.lines()
    starts = [i for i, line in enumerate(lines) if line.split(" ", 1)[0] == nodeid]
    assert starts, f"{nodeid} did not start:\n{run.output}"
    return lines[starts[0] : starts[-1] + 1]


def _answer(lines: list[str], prompt: str) -> str:
    """The line after ``prompt`` (what pdb printed for the command typed there)."""
    return lines[lines.index(prompt) + 1]


#: The ``--pdb`` session's prompts, scenario by scenario, in file order.
PDB_ANSWERS = {
    "test_a_breakpoint.py": ["p rank", "p x", "c"],
    "test_b_turns.py": ["p rank", "c", "p rank", "c"],
    "test_c_pool_start.py": ["p rank", "c"],
    "test_d_post_mortem.py": ["p rank", "p t", "c"],
    "test_e_all_fail.py": ["c"],
    "test_z_step_out.py": STEPS,
}


@pytest.fixture
def pdb_session(terminal_session: TerminalSession) -> TerminalRun:
    files = {
        "conftest.py": POOL_START_HOOK,
        "test_a_breakpoint.py": BREAKPOINT_IN_RANK_1,
        "test_b_turns.py": BOTH_STOP,
        "test_c_pool_start.py": AFTER_THE_POOL_START,
        "test_d_post_mortem.py": RANK_1_FAILS,
        "test_e_all_fail.py": ALL_FAIL,
        "test_z_step_out.py": STEP_OUT,
    }
    answers = [line for lines in PDB_ANSWERS.values() for line in lines]
    return terminal_session("pdb", files, ["--pdb"], answers)


@pytest.fixture
def no_grace_session(terminal_session: TerminalSession) -> TerminalRun:
    """``--pdb`` without a failure grace; then ``q`` at a breakpoint ends the session."""
    files = {"test_a_post_mortem.py": RANK_1_FAILS, "test_b_quit.py": BREAKPOINT_IN_RANK_1}
    args = ["--pdb", "--distrank-failure-grace=0"]
    return terminal_session("pdb-no-grace", files, args, ["p rank", "c", "q"])


@pytest.fixture
def slow_session(terminal_session: TerminalSession) -> TerminalRun:
    """No options; 1.5 s before each answer (a slow person); Ctrl-C at the last prompt."""
    files = {
        "test_a_deadline.py": DEADLINE,
        "test_b_thread.py": THREAD,
        "test_c_ctrl_c.py": BREAKPOINT_IN_RANK_1,
    }
    return terminal_session("slow", files, [], ["p rank", "c", CTRL_C], pause=1.5)


@pytest.fixture
def trace_session(terminal_session: TerminalSession) -> TerminalRun:
    """``--trace --distrank-debug-rank=1``: each test starts in rank 1's debugger."""
    files = {"test_a_traced.py": TRACED, "test_b_asks.py": ASKS}
    args = ["--trace", "--distrank-debug-rank=1"]
    return terminal_session("trace", files, args, ["n", "p y", "c", "c", "ada"])


def test_breakpoint_stops_its_rank_and_continue_passes(pdb_session: TerminalRun) -> None:
    run = pdb_session
    lines = _region(run, "test_a_breakpoint.py::test_debug_me")
    assert any(">>> PDB set_trace in rank 1/2 (pid " in line for line in lines), run.output
    assert "[rank 1/2] -> dist.barrier()" in lines
    assert _answer(lines, "[rank 1/2] (Pdb) p rank") == "[rank 1/2] 1"
    assert _answer(lines, "[rank 1/2] (Pdb) p x") == "[rank 1/2] 10"
    assert any(">>> PDB continue in rank 1/2 >>>" in line for line in lines)
    typed = [line for line in lines if "(Pdb) " in line]
    assert typed == [f"[rank 1/2] (Pdb) {answer}" for answer in ["p rank", "p x", "c"]]
    assert "PASSED test_a_breakpoint.py::test_debug_me" in run.lines()
    assert "PASSED test_a_breakpoint.py::test_after" in run.lines()


def test_the_deadline_stands_still_at_the_prompt(slow_session: TerminalRun) -> None:
    """3 s at the prompt (1.5 s before each of two answers); the deadline is 2 s."""
    run = slow_session
    lines = _region(run, "test_a_deadline.py::test_slow_person")
    assert [line for line in lines if "(Pdb) " in line] == [
        "[rank 0/2] (Pdb) p rank",
        "[rank 0/2] (Pdb) c",
    ], run.output
    assert "PASSED test_a_deadline.py::test_slow_person" in run.lines(), run.output


def test_ranks_that_stop_take_turns(pdb_session: TerminalRun) -> None:
    run = pdb_session
    lines = _region(run, "test_b_turns.py::test_both_stop")
    heads = [line for line in lines if ">>> PDB set_trace in rank" in line]
    assert len(heads) == 2, run.output
    answers = [lines[i + 1] for i, line in enumerate(lines) if line.endswith("(Pdb) p rank")]
    assert sorted(answers) == ["[rank 0/2] 0", "[rank 1/2] 1"], run.output
    assert "PASSED test_b_turns.py::test_both_stop" in run.lines()


def test_a_debugger_stepping_out_of_its_test_lets_go_when_the_test_ends(
    pdb_session: TerminalRun,
) -> None:
    run = pdb_session
    assert run.returncode == 1, run.output[-3000:]  # (the --pdb scenarios' failures)
    lines = run.lines()
    assert "PASSED test_z_step_out.py::test_first" in lines, run.output[-3000:]
    assert "PASSED test_z_step_out.py::test_second" in lines, run.output[-3000:]
    before = sum(len(answers) for answers in PDB_ANSWERS.values()) - len(STEPS)
    steps = run.typed[before:]
    assert steps == STEPS[: len(steps)] and len(steps) < len(STEPS)  # never `c`
    first = "\n".join(_region(run, "test_z_step_out.py::test_first"))
    assert first.count(">>> PDB set_trace in rank 1/2") == 1
    assert ">>> PDB" not in "\n".join(_region(run, "test_z_step_out.py::test_second"))


def test_pdb_opens_in_the_failing_rank(pdb_session: TerminalRun) -> None:
    run = pdb_session
    lines = _region(run, "test_d_post_mortem.py::test_sum")
    assert any(">>> PDB post_mortem in rank 1/2 (pid " in line for line in lines), run.output
    assert "[rank 1/2] E           assert tensor(2.) == 5" in lines
    assert _answer(lines, "[rank 1/2] (Pdb) p rank") == "[rank 1/2] 1"
    assert _answer(lines, "[rank 1/2] (Pdb) p t") == "[rank 1/2] tensor([1., 1.])"
    assert "[rank 0/2] (Pdb)" not in "\n".join(lines)
    assert any(line.startswith("FAILED test_d_post_mortem.py::test_sum") for line in run.lines())
    # The peer waited for the debugger, then got the usual grace period (DISTRANK_TEST_WAITS:
    # 1 s), not killed at once.
    failure_section(run.lines(), "test_sum").fnmatch_lines(["  rank 0/2  killed in call 1.*"])


def test_pdb_opens_even_without_a_failure_grace(no_grace_session: TerminalRun) -> None:
    run = no_grace_session
    lines = _region(run, "test_a_post_mortem.py::test_sum")
    assert _answer(lines, "[rank 1/2] (Pdb) p rank") == "[rank 1/2] 1", run.output
    assert any(line.startswith("FAILED test_a_post_mortem.py::test_sum") for line in run.lines())


def test_pdb_opens_once_when_every_rank_fails(pdb_session: TerminalRun) -> None:
    run = pdb_session
    lines = _region(run, "test_e_all_fail.py::test_all_fail")
    heads = [line for line in lines if ">>> PDB post_mortem in rank" in line]
    assert len(heads) == 1, run.output
    assert "failed too; --pdb debugs rank" in "\n".join(lines)
    assert any(line.startswith("FAILED test_e_all_fail.py::test_all_fail") for line in run.lines())


def test_trace_starts_the_debug_rank_in_the_debugger(trace_session: TerminalRun) -> None:
    run = trace_session
    assert run.returncode == 0, run.output
    lines = _region(run, "test_a_traced.py::test_traced")
    assert any(">>> PDB runcall in rank 1/2 (pid " in line for line in lines), run.output
    assert "[rank 1/2] -> y = rank + 100" in lines
    assert _answer(lines, "[rank 1/2] (Pdb) p y") == "[rank 1/2] 101"
    assert "[rank 0/2]" not in run.output
    assert "PASSED test_a_traced.py::test_traced" in run.lines()


def test_debug_rank_output_is_live_and_its_stdin_is_the_terminal(
    trace_session: TerminalRun,
) -> None:
    run = trace_session
    assert run.returncode == 0, run.output
    assert any(
        "distrank: rank 1/2 of pool world_size=2, backend=gloo is pid " in line
        and "(--distrank-debug-rank=1 (command line)); to see its stack: py-spy dump --pid" in line
        for line in run.lines()
    ), run.output
    lines = _region(run, "test_b_asks.py::test_asks")
    assert "[rank 1/2] hello from rank 1" in lines
    assert "[rank 1/2] name? ada" in lines
    assert "[rank 1/2] got ada" in lines
    assert "hello from rank 0" not in run.output
    assert "PASSED test_b_asks.py::test_asks" in run.lines()


def test_quit_fails_the_test_and_stops_the_session(no_grace_session: TerminalRun) -> None:
    run = no_grace_session
    lines = run.lines()
    assert run.returncode == 2, run.output
    assert any(">>> PDB quit in rank 1/2 >>>" in line for line in lines), run.output
    assert "rank 1/2: quit the debugger (q); the session stops" in run.output
    assert any("Interrupted: Quitting debugger (q in rank 1/2)" in line for line in lines)
    failed = [line for line in lines if line.startswith("FAILED test_b_quit.py::test_debug_me")]
    assert failed, run.output
    assert not any("test_b_quit.py::test_after" in line for line in lines), run.output  # not run


def test_ctrl_c_at_the_prompt_ends_the_session(slow_session: TerminalRun) -> None:
    run = slow_session
    assert run.returncode == 2, run.output
    assert "KeyboardInterrupt" in run.output
    lines = run.lines()
    assert any(line.startswith("test_c_ctrl_c.py::test_debug_me") for line in lines)
    # The interrupted test is reported as an interrupt reports the test in flight (issue 29:
    # its ranks' stacks, failed), the next never ran (in_terminal: no rank is left).
    assert any(
        line.startswith("FAILED test_c_ctrl_c.py::test_debug_me - ")
        and "Interrupted: still in call when SIGINT came after" in line
        for line in lines
    ), run.output
    assert "interrupted in call by SIGINT after" in run.output
    assert not any("test_c_ctrl_c.py::test_after" in line for line in lines), run.output


#: breakpoint() while pools start: in the rank setup hook (rank 1 of world size 4), and at the
#: import of a test module (rank 2 of world size 3, which alone imports test_imported.py).
BREAKPOINTS_AT_START = {
    "conftest.py": """
        def pytest_distrank_rank_setup(config, rank, world_size):
            if rank == 1 and world_size == 4:
                breakpoint()
    """,
    "test_setup_hook.py": """
        import pytest

        @pytest.mark.world_size(4)
        def test_after_the_setup_hook(rank):
            assert rank in (0, 1, 2, 3)
    """,
    "test_imported.py": """
        import os
        import pytest

        if os.environ.get("RANK") == "2":
            breakpoint()

        @pytest.mark.world_size(3)
        def test_after_the_import(rank):
            pass
    """,
}


def _dedented(files: dict[str, str]) -> dict[str, str]:
    return {path: textwrap.dedent(source) for path, source in files.items()}


#: Both ranks fail, rank 1 first.
BOTH_FAIL = """
    import time, pytest

    @pytest.mark.world_size(2)
    def test_both(rank):
        if rank == 0:
            time.sleep(0.5)
        assert False, f"rank {rank} fails"
"""
PYTHONBREAKPOINT_OFF = """
    import pytest

    @pytest.mark.world_size(2)
    def test_debug_me(rank):
        breakpoint()
"""


#: ``--pdb`` without a terminal; ``PYTHONBREAKPOINT=0`` (no other test here calls breakpoint()).
PDB_NO_TERMINAL = Session(
    "test_debugger.pdb-no-terminal",
    _dedented(
        {
            "test_both_fail.py": BOTH_FAIL,
            "test_rank_1_fails.py": RANK_1_FAILS,
            "test_pythonbreakpoint.py": PYTHONBREAKPOINT_OFF,
        }
    ),
    ("--pdb", "-v", "-rA"),
    {"PYTHONBREAKPOINT": "0"},
)
#: breakpoint() in a test and while pools start, the controller's stdin not a terminal; the
#: session ``PDB_NO_TERMINAL`` runs beside it, at the same time (``Session.beside``).
NO_TERMINAL = Session(
    "test_debugger.no-terminal",
    _dedented({"test_breakpoint.py": BREAKPOINT_IN_RANK_1, **BREAKPOINTS_AT_START}),
    ("-v", "-rA"),
    beside=(PDB_NO_TERMINAL,),
)


@pytest.fixture
def no_terminal(shared_session: SharedSession) -> pytest.RunResult:
    return NO_TERMINAL.run(shared_session).result


@pytest.fixture
def pdb_no_terminal(shared_session: SharedSession) -> pytest.RunResult:
    return NO_TERMINAL.run_beside(shared_session, PDB_NO_TERMINAL).result


def test_breakpoint_without_a_terminal_fails_its_rank_saying_why(
    no_terminal: pytest.RunResult,
) -> None:
    result = no_terminal
    result.stdout.fnmatch_lines_random(
        [
            "test_breakpoint.py::test_debug_me FAILED*",
            "test_breakpoint.py::test_after PASSED*",
        ]
    )
    failure_section(result.stdout.lines, "test_debug_me").fnmatch_lines(
        [
            "  rank 1/2  failed in call: Failed: breakpoint() on rank 1/2 (pid *): no debugger "
            "can open: the controller's stdin is not a terminal (CI, a pipe or /dev/null).*",
        ]
    )
    assert "BdbQuit" not in result.stdout.str()


def test_breakpoint_while_a_pool_starts_says_why_not_a_death(
    no_terminal: pytest.RunResult,
) -> None:
    """Without a terminal the rank fails with the breakpoint() message; it is alive, so the
    start's story must not call it dead (it was "died during start-up ... not reaped")."""
    result = no_terminal
    result.stdout.fnmatch_lines_random(
        [
            "test_setup_hook.py::test_after_the_setup_hook ERROR*",
            "test_imported.py::test_after_the_import ERROR*",
            "rank 1/4 failed to start: start-up failed:",
            "Failed: breakpoint() on rank 1/4 (pid *): no debugger can open: the controller's "
            "stdin is not a terminal (CI, a pipe or /dev/null).*",
            "test_imported.py: breakpoint() on rank 2/3 (pid *): no debugger can open: the "
            "controller's stdin is not a terminal (CI, a pipe or /dev/null).*",
        ]
    )
    assert "died" not in result.stdout.str()


def test_breakpoint_while_a_pool_starts_opens_the_debugger(pdb_session: TerminalRun) -> None:
    run = pdb_session
    lines = _region(run, "test_c_pool_start.py::test_after_the_setup_hook")
    assert any(
        ">>> PDB set_trace in rank 1/3 (pid " in line
        and "for the start of pool world_size=3, backend=gloo" in line
        for line in lines
    ), run.output
    assert _answer(lines, "[rank 1/3] (Pdb) p rank") == "[rank 1/3] 1"
    assert "PASSED test_c_pool_start.py::test_after_the_setup_hook" in run.lines()


def test_pdb_without_a_terminal_says_why_and_goes_on(pdb_no_terminal: pytest.RunResult) -> None:
    result = pdb_no_terminal
    result.stdout.fnmatch_lines_random(
        ["test_both_fail.py::test_both FAILED*", "test_rank_1_fails.py::test_sum FAILED*"]
    )
    result.stdout.fnmatch_lines(
        [
            "distrank: no debugger opened in rank 1/2 for test_both_fail.py::test_both: the "
            "controller's stdin is not a terminal*",
        ]
    )
    # Said once per session; no debugger opened anywhere, so no rank is "the one --pdb debugs".
    assert result.stdout.str().count("distrank: no debugger opened") == 1
    result.stdout.no_fnmatch_line("*--pdb debugs rank*")


def test_breakpoint_in_a_thread_of_the_test_says_why(slow_session: TerminalRun) -> None:
    run = slow_session
    lines = _region(run, "test_b_thread.py::test_thread")
    assert any(line.startswith("FAILED test_b_thread.py::test_thread") for line in run.lines())
    section = "\n".join(failure_section(run.lines(), "test_thread").lines)
    assert "in thread 'helper'; only the main thread of rank 0/2 reaches the controller's " in (
        section
    ), run.output
    assert "(Pdb)" not in "\n".join(lines) and "(Pdb)" not in section


def test_breakpoint_follows_pythonbreakpoint_in_ranks(pdb_no_terminal: pytest.RunResult) -> None:
    # PYTHONBREAKPOINT=0: breakpoint() does nothing, as Python says
    pdb_no_terminal.stdout.fnmatch_lines(["test_pythonbreakpoint.py::test_debug_me PASSED*"])

"""End-to-end: a debugger in one rank (docs/debugging.md), under a pseudo-terminal.

``breakpoint()``, ``--pdb``, ``--trace`` and ``--distrank-debug-rank`` each open pdb in a rank
whose input and output travel through the controller, labelled ``[rank r/n]``; without a
terminal each says why. ``in_terminal`` types the answers at the prompts and checks that no
process outlives the run.
"""

from __future__ import annotations

import pytest

from ..helpers import CTRL_C, InTerminal, RunPytest

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


def test_breakpoint_stops_its_rank_and_continue_passes(
    pytester: pytest.Pytester, in_terminal: InTerminal
) -> None:
    pytester.makepyfile(BREAKPOINT_IN_RANK_1)
    run = in_terminal([], ["p rank", "p x", "c"])
    lines = run.lines()
    assert run.returncode == 0, run.output
    assert any(">>> PDB set_trace in rank 1/2 (pid " in line for line in lines), run.output
    assert "[rank 1/2] -> dist.barrier()" in lines
    assert "[rank 1/2] (Pdb) p rank" in lines
    assert lines[lines.index("[rank 1/2] (Pdb) p rank") + 1] == "[rank 1/2] 1"
    assert lines[lines.index("[rank 1/2] (Pdb) p x") + 1] == "[rank 1/2] 10"
    assert any(">>> PDB continue in rank 1/2 >>>" in line for line in lines)
    assert "2 passed" in lines[-1]
    assert run.typed == ["p rank", "p x", "c"]


def test_the_deadline_stands_still_at_the_prompt(
    pytester: pytest.Pytester, in_terminal: InTerminal
) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch.distributed as dist

        @pytest.mark.world_size(2)
        @pytest.mark.timeout(2)
        def test_slow_person(rank):
            if rank == 0:
                breakpoint()
            dist.barrier()
        """
    )
    run = in_terminal([], ["p rank", "c"], pause=1.5)  # 3 s at the prompt; the deadline is 2 s
    assert run.returncode == 0, run.output
    assert "1 passed" in run.lines()[-1]


def test_ranks_that_stop_take_turns(pytester: pytest.Pytester, in_terminal: InTerminal) -> None:
    pytester.makepyfile(
        """
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
    )
    run = in_terminal([], ["p rank", "c", "p rank", "c"])
    lines = run.lines()
    assert run.returncode == 0, run.output
    heads = [line for line in lines if ">>> PDB set_trace in rank" in line]
    assert len(heads) == 2, run.output
    answers = [lines[i + 1] for i, line in enumerate(lines) if line.endswith("(Pdb) p rank")]
    assert sorted(answers) == ["[rank 0/2] 0", "[rank 1/2] 1"], run.output


def test_a_debugger_stepping_out_of_its_test_lets_go_when_the_test_ends(
    pytester: pytest.Pytester, in_terminal: InTerminal
) -> None:
    pytester.makepyfile(
        """
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
    )
    steps = ["n"] * 2000  # far more than the lines from the test to the end of its protocol
    run = in_terminal([], steps)
    assert run.returncode == 0, run.output[-3000:]
    assert "2 passed" in run.lines()[-1]
    assert run.typed == steps[: len(run.typed)] and len(run.typed) < len(steps)  # never `c`
    assert run.output.count(">>> PDB set_trace in rank 1/2") == 1


def test_pdb_opens_in_the_failing_rank(pytester: pytest.Pytester, in_terminal: InTerminal) -> None:
    pytester.makepyfile(RANK_1_FAILS)
    run = in_terminal(["--pdb"], ["p rank", "p t", "c"])
    lines = run.lines()
    assert run.returncode == 1, run.output
    assert any(">>> PDB post_mortem in rank 1/2 (pid " in line for line in lines), run.output
    assert "[rank 1/2] E           assert tensor(2.) == 5" in lines
    assert lines[lines.index("[rank 1/2] (Pdb) p rank") + 1] == "[rank 1/2] 1"
    assert lines[lines.index("[rank 1/2] (Pdb) p t") + 1] == "[rank 1/2] tensor([1., 1.])"
    assert "[rank 0/2] (Pdb)" not in run.output
    assert "1 failed" in lines[-1]
    # The peer waited for the debugger, then got the usual grace period (not killed at once).
    assert any("rank 0/2  killed in call 5." in line for line in lines), run.output


def test_pdb_opens_even_without_a_failure_grace(
    pytester: pytest.Pytester, in_terminal: InTerminal
) -> None:
    pytester.makepyfile(RANK_1_FAILS)
    run = in_terminal(["--pdb", "--distrank-failure-grace=0"], ["p rank", "c"])
    lines = run.lines()
    assert lines[lines.index("[rank 1/2] (Pdb) p rank") + 1] == "[rank 1/2] 1", run.output
    assert "1 failed" in lines[-1]


def test_pdb_opens_once_when_every_rank_fails(
    pytester: pytest.Pytester, in_terminal: InTerminal
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.world_size(2)
        def test_all_fail(rank):
            assert rank == 7
        """
    )
    run = in_terminal(["--pdb"], ["c"])
    heads = [line for line in run.lines() if ">>> PDB post_mortem in rank" in line]
    assert len(heads) == 1, run.output
    assert "failed too; --pdb debugs rank" in run.output
    assert "1 failed" in run.lines()[-1]


def test_trace_starts_the_debug_rank_in_the_debugger(
    pytester: pytest.Pytester, in_terminal: InTerminal
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.world_size(2)
        def test_traced(rank):
            y = rank + 100
            assert y > 0
        """
    )
    run = in_terminal(["--trace", "--distrank-debug-rank=1"], ["n", "p y", "c"])
    lines = run.lines()
    assert run.returncode == 0, run.output
    assert any(">>> PDB runcall in rank 1/2 (pid " in line for line in lines), run.output
    assert "[rank 1/2] -> y = rank + 100" in lines
    assert lines[lines.index("[rank 1/2] (Pdb) p y") + 1] == "[rank 1/2] 101"
    assert "[rank 0/2]" not in run.output
    assert "1 passed" in lines[-1]


def test_debug_rank_output_is_live_and_its_stdin_is_the_terminal(
    pytester: pytest.Pytester, in_terminal: InTerminal
) -> None:
    pytester.makepyfile(
        """
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
    )
    run = in_terminal(["--distrank-debug-rank=1"], ["ada"])
    lines = run.lines()
    assert run.returncode == 0, run.output
    assert any(
        "distrank: rank 1/2 of pool world_size=2, backend=gloo is pid " in line
        and "(--distrank-debug-rank=1 (command line)); to see its stack: py-spy dump --pid" in line
        for line in lines
    ), run.output
    assert "[rank 1/2] hello from rank 1" in lines
    assert "[rank 1/2] name? ada" in lines
    assert "[rank 1/2] got ada" in lines
    assert "hello from rank 0" not in run.output
    assert "1 passed" in lines[-1]


def test_quit_fails_the_test_and_stops_the_session(
    pytester: pytest.Pytester, in_terminal: InTerminal
) -> None:
    pytester.makepyfile(BREAKPOINT_IN_RANK_1)
    run = in_terminal(["--distrank-failure-grace=1"], ["q"])
    lines = run.lines()
    assert run.returncode == 2, run.output
    assert any(">>> PDB quit in rank 1/2 >>>" in line for line in lines), run.output
    assert "rank 1/2: quit the debugger (q); the session stops" in run.output
    assert any("Interrupted: Quitting debugger (q in rank 1/2)" in line for line in lines)
    assert "1 failed" in lines[-1] and "passed" not in lines[-1]


def test_ctrl_c_at_the_prompt_ends_the_session(
    pytester: pytest.Pytester, in_terminal: InTerminal
) -> None:
    pytester.makepyfile(BREAKPOINT_IN_RANK_1)
    run = in_terminal([], [CTRL_C])
    assert run.returncode == 2, run.output
    assert "KeyboardInterrupt" in run.output
    assert "no tests ran" in run.lines()[-1]  # in_terminal checks that no rank is left


def test_breakpoint_without_a_terminal_fails_its_rank_saying_why(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(BREAKPOINT_IN_RANK_1)
    result = run_pytest("--distrank-failure-grace=1")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "  rank 1/2  failed in call: Failed: breakpoint() on rank 1/2 (pid *): no debugger "
            "can open: the controller's stdin is not a terminal (CI, a pipe or /dev/null).*",
        ]
    )
    assert "BdbQuit" not in result.stdout.str()


#: breakpoint() while pools start: in the rank setup hook (rank 1 of world size 2), and at the
#: import of a test module (rank 2 of world size 3, which alone imports test_imported.py).
BREAKPOINTS_AT_START = {
    "conftest": """
        def pytest_distrank_rank_setup(config, rank, world_size):
            if rank == 1 and world_size == 2:
                breakpoint()
    """,
    "test_setup_hook": """
        import pytest

        @pytest.mark.world_size(2)
        def test_after_the_setup_hook(rank):
            assert rank in (0, 1)
    """,
    "test_imported": """
        import os
        import pytest

        if os.environ.get("RANK") == "2":
            breakpoint()

        @pytest.mark.world_size(3)
        def test_after_the_import(rank):
            pass
    """,
}


def test_breakpoint_while_a_pool_starts_says_why_not_a_death(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    """Without a terminal the rank fails with the breakpoint() message; it is alive, so the
    start's story must not call it dead (it was "died during start-up ... not reaped")."""
    pytester.makepyfile(**BREAKPOINTS_AT_START)
    result = run_pytest("--distrank-failure-grace=1")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines_random(
        [
            "rank 1/2 failed to start: start-up failed:",
            "Failed: breakpoint() on rank 1/2 (pid *): no debugger can open: the controller's "
            "stdin is not a terminal (CI, a pipe or /dev/null).*",
            "test_imported.py: breakpoint() on rank 2/3 (pid *): no debugger can open: the "
            "controller's stdin is not a terminal (CI, a pipe or /dev/null).*",
        ]
    )
    assert "died" not in result.stdout.str()


def test_breakpoint_while_a_pool_starts_opens_the_debugger(
    pytester: pytest.Pytester, in_terminal: InTerminal
) -> None:
    pytester.makepyfile(
        conftest=BREAKPOINTS_AT_START["conftest"],
        test_setup_hook=BREAKPOINTS_AT_START["test_setup_hook"],
    )
    run = in_terminal([], ["p rank", "c"])
    lines = run.lines()
    assert run.returncode == 0, run.output
    assert any(
        ">>> PDB set_trace in rank 1/2 (pid " in line
        and "for the start of pool world_size=2, backend=gloo" in line
        for line in lines
    ), run.output
    assert lines[lines.index("[rank 1/2] (Pdb) p rank") + 1] == "[rank 1/2] 1"
    assert "1 passed" in lines[-1]


def test_pdb_without_a_terminal_says_why_and_goes_on(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(RANK_1_FAILS)
    pytester.makepyfile(
        test_both_fail="""
        import time, pytest

        @pytest.mark.world_size(2)
        def test_both(rank):
            if rank == 0:
                time.sleep(0.5)
            assert False, f"rank {rank} fails"
        """
    )
    result = run_pytest("--pdb", "--distrank-failure-grace=1")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "distrank: no debugger opened in rank 1/2 for test_both_fail.py::test_both: the "
            "controller's stdin is not a terminal*",
        ]
    )
    # Said once per session; no debugger opened anywhere, so no rank is "the one --pdb debugs".
    result.stdout.no_fnmatch_line("*--pdb debugs rank*")


def test_breakpoint_under_xdist_says_why(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    pytester.makepyfile(BREAKPOINT_IN_RANK_1)
    result = run_pytest("-n", "1", "--distrank-failure-grace=1")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*no debugger can open: this pytest process is a pytest-xdist*"])


def test_breakpoint_in_a_thread_of_the_test_says_why(
    pytester: pytest.Pytester, in_terminal: InTerminal
) -> None:
    pytester.makepyfile(
        """
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
    )
    run = in_terminal(["--distrank-failure-grace=1"], [])
    assert run.returncode == 1, run.output
    assert "in thread 'helper'; only the main thread of rank 0/2 reaches the controller's " in (
        run.output
    )
    assert "(Pdb)" not in run.output


def test_breakpoint_follows_pythonbreakpoint_in_ranks(
    pytester: pytest.Pytester, run_pytest: RunPytest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONBREAKPOINT", "0")  # breakpoint() does nothing, as Python says
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.world_size(2)
        def test_debug_me(rank):
            breakpoint()
        """
    )
    result = run_pytest()
    result.assert_outcomes(passed=1)

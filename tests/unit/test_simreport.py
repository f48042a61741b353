"""Unit tests of the reports of simulated tests (pool/simreport.py): labels and explanations."""

from __future__ import annotations

from pytest import TestReport

from pytest_distrank._compat import ExceptionChainRepr
from pytest_distrank.outcome.merge import merge_test
from pytest_distrank.outcome.reports import synthesized_failure
from pytest_distrank.planning.meshes import Simulated
from pytest_distrank.pool.simreport import explain, relabel, who

LOCATION = ("test_x.py", 3, "test_x")
LOCAL64 = Simulated("local", 64, 0)
FAKE1024 = Simulated("fake", 1024, 1023, named_rank=True)


def failed_call(message: str) -> list[TestReport]:
    def rep(when: str, outcome: str, longrepr: object = None) -> TestReport:
        return TestReport(
            "test_x.py::test_x",
            LOCATION,
            {},
            outcome,  # type: ignore[arg-type]
            longrepr,  # type: ignore[arg-type]
            when,  # type: ignore[arg-type]
            sections=[("Captured stdout call", "hi\n")] if when == "call" else [],
        )

    failure = synthesized_failure("test_x.py::test_x", LOCATION, "call", message, "tb", note="")
    call = rep("call", "failed", failure.longrepr)
    return [rep("setup", "passed"), call, rep("teardown", "passed")]


def test_the_world_is_named_where_the_merge_named_the_process() -> None:
    merged = merge_test({0: failed_call("AssertionError: 3 != 4")}, 1)
    relabel(merged, FAKE1024)
    call = merged[1]
    assert isinstance(call.longrepr, ExceptionChainRepr)
    assert call.longrepr.reprcrash is not None
    assert call.longrepr.reprcrash.message.startswith("[simulated rank 1023/1024] ")
    text = str(call.longrepr)
    assert "rank 0/1" not in text
    assert "distrank: simulated rank 1023/1024 failed" in text
    assert call.sections[0][0] == "Captured stdout call (simulated rank 1023/1024)"
    assert call.sections[0][1].startswith("[simulated rank 1023/1024]\n")
    assert "Fake mode moves no data" in text


def test_names_of_the_two_modes() -> None:
    assert who(LOCAL64) == "ranks 0-63 of 64 (local)"
    assert who(Simulated("fake", 8, 0)) == "simulated rank 0/8"


def test_an_op_local_tensor_lacks_is_named() -> None:
    crash = "NotImplementedError: c10d.reduce_.default not implemented"
    text = explain(LOCAL64, crash, "/x/torch/distributed/_local_tensor/__init__.py")
    assert "LocalTensorMode does not implement c10d.reduce_.default" in text
    assert "Drop 'local'" in text
    # The same words raised by the test's own code are the test's failure, not the mode's.
    assert "does not implement" not in explain(LOCAL64, crash, "/x/test_x.py")


def test_rank_used_as_one_number_is_explained() -> None:
    for crash in (
        "AttributeError: 'LocalIntNode' object has no attribute 'int_'",
        "AssertionError: (LocalIntNode({0: 0, 1: 1}), 0)",
    ):
        assert "used `rank` as one number" in explain(LOCAL64, crash, "/x/sym_node.py")


def test_other_local_failures_say_the_numbers_are_real() -> None:
    text = explain(LOCAL64, "AssertionError: assert 10.0 == 11", "/x/test_x.py")
    assert "the numbers are those of a real run" in text
    assert "moves no data" not in text
    # D5: that holds for the world and mesh dimensions only; the others are refused.
    assert (
        "collectives on the world and on DeviceMesh dimensions compute what real ones would "
        "(local mode refuses those on any other group)" in text
    )


def test_a_collective_local_mode_refuses_is_explained_as_refused() -> None:
    """D5: a refusal is not a wrong number: its section must not claim real-run numbers."""
    crash = (
        "[rank 0/1] pytest_distrank.pool.worker.simulate.LocalModeRefusal: all_reduce on the "
        "group of ranks 0, 1, which is not a DeviceMesh dimension: local mode cannot compute it "
        "exactly."
    )
    text = explain(LOCAL64, crash, "/x/pytest_distrank/pool/worker/simulate.py")
    assert text.startswith(
        "world size 64 simulated (local: every rank at once), in one process. Local mode "
        "refused a collective it cannot compute exactly (the error says which, and why)"
    )
    assert "the numbers are those of a real run" not in text


def test_other_failures_inside_local_tensor_are_the_modes() -> None:
    path = "/x/torch/distributed/_local_tensor/__init__.py"
    crash = "AttributeError: 'LocalTensor' object has no attribute '__src_rank__'"
    assert "raised inside PyTorch's LocalTensor" in explain(LOCAL64, crash, path)


def test_rank_0_of_a_simulated_world_is_named_once() -> None:
    """The text "rank 0/1" is inside "simulated rank 0/1024": the head was replaced twice, reading
    "simulated simulated rank 0/1024024 failed"."""
    merged = merge_test({0: failed_call("AssertionError: 3 != 4")}, 1)
    relabel(merged, Simulated("fake", 1024, 0, named_rank=True))
    text = str(merged[1].longrepr)
    assert "distrank: simulated rank 0/1024 failed\n" in text
    assert "simulated simulated" not in text and "1024024" not in text

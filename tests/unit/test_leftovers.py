"""Unit: the words of what a test left behind (rank/leftovers.py, rank/torchstate.py) and the
summary lines the controller makes of them (outcome/checks.py ``leftover_lines``); what a rank
expects at a test's start (rank/between.py ``expected_start``)."""

from __future__ import annotations

import contextlib
import os
import socket
import types
from typing import Any, cast

import pytest
import torch

from pytest_distrank.envvars import PLUGIN_PORT_ENV
from pytest_distrank.outcome.checks import and_words, leftover_lines, leftover_notes
from pytest_distrank.rank import processstate
from pytest_distrank.rank.between import expected_start, kept
from pytest_distrank.rank.leftoverwords import env_words, few
from pytest_distrank.rank.snapshot import Snapshot, diff, env_key
from pytest_distrank.rank.torchstate import flag_words


def test_lines_group_the_ranks_that_left_the_same() -> None:
    lines = leftover_lines(
        "t.py::test_c",
        {1: ("X set", "the default dtype float64"), 0: ("X set", "the default dtype float64")},
    )
    assert lines == [
        "leftovers: t.py::test_c left X set and the default dtype float64 on ranks 0, 1 (restored)"
    ]


def test_different_leftovers_get_a_line_per_set_of_ranks() -> None:
    lines = leftover_lines("t.py::test_c", {0: ("X set",), 1: ("X set", "grad mode off")})
    assert lines == [
        "leftovers: t.py::test_c left X set on ranks 0, 1 (restored)",
        "leftovers: t.py::test_c left grad mode off on rank 1 (restored)",
    ]


def test_what_changed_between_two_tests_is_credited_to_neither() -> None:
    """The ranks' between words (rank/between.py) get lines of their own, before the test's."""
    between = {r: ("t.py::test_b", ("the default dtype float64",)) for r in (0, 1)}
    lines = leftover_notes("t.py::test_c", {1: ("X set",)}, between)
    assert lines == [
        "leftovers: between t.py::test_b and t.py::test_c, code outside both tests (a fixture "
        "torn down there, a hook, a __del__) left the default dtype float64 on ranks 0, 1 "
        "(restored)",
        "leftovers: t.py::test_c left X set on rank 1 (restored)",
    ]
    assert leftover_notes("t.py::test_c", {}, {}) == []


def test_a_daemon_thread_is_named_not_restored() -> None:
    lines = leftover_lines("t.py::t", {0: ("X set", "daemon thread 'tqdm' still running")})
    assert lines == [
        "leftovers: t.py::t left X set on rank 0 (restored); daemon thread 'tqdm' still "
        "running on rank 0"
    ]


def test_words() -> None:
    assert and_words(["a"]) == "a"
    assert and_words(["a", "b", "c"]) == "a, b and c"
    assert env_words("X", None, "1") == "X set"
    assert env_words("X", "1", None) == "X unset"
    assert env_words("X", "1", "2") == "X changed"  # values are never shown
    assert flag_words("default dtype", torch.float64) == "the default dtype float64"
    assert flag_words("grad mode", False) == "grad mode off"
    assert flag_words("deterministic algorithms", (True, True)) == (
        "deterministic algorithms on (warn only)"
    )
    assert flag_words("torch.backends.cudnn.benchmark", True) == (
        "torch.backends.cudnn.benchmark True"
    )


def test_a_snapshot_reads_the_precision_a_mixed_setting_hides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On torch 2.13 ``get_float32_matmul_precision`` raises once ``fp32_precision`` was set:
    the snapshot says so instead of failing the test."""
    before = torch.backends.cuda.matmul.fp32_precision
    try:
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        flags = Snapshot.take().torch
        assert flags["torch.backends.cuda.matmul.fp32_precision"] == "tf32"
        assert flags["float32 matmul precision"].startswith("(mixed")
    finally:
        torch.backends.cuda.matmul.fp32_precision = before
    monkeypatch.setenv("SNAPSHOT_SEES", "1")
    assert Snapshot.take().env[os.fsencode("SNAPSHOT_SEES")] == b"1"
    assert Snapshot.take().cwd[""] == os.getcwd()


def test_a_change_put_in_a_snapshot_leaves_the_category_other_snapshots_share() -> None:
    """Rule: a category read through a mark is the same object in two snapshots (while
    ``sys.modules`` is unchanged); a wider fixture's change put in one leaves the other, and
    the next read, as read."""
    first, second = Snapshot.take(), Snapshot.take()
    assert first.modules is second.modules  # shared: this Python keeps dicts' versions
    first.put("modules", "left.fake", 1)
    assert first.modules["left.fake"] == 1
    assert "left.fake" not in second.modules and "left.fake" not in Snapshot.take().modules


def test_a_cleared_environment_names_a_few_variables_and_counts_the_rest() -> None:
    words = [f"V{i} unset" for i in range(40)]
    assert few(words, "environment variables") == [
        "V0 unset",
        "V1 unset",
        "V2 unset",
        "V3 unset",
        "V4 unset",
        "35 more environment variables",
    ]
    assert few(words[:6], "environment variables") == words[:6]


def test_what_is_only_named_is_kept_apart_from_what_was_restored() -> None:
    lines = leftover_lines(
        "t.py::t",
        {r: ("autocast on cpu (bfloat16)", "umask 0o077 (not restored)") for r in range(128)},
    )
    assert lines == [
        "leftovers: t.py::t left autocast on cpu (bfloat16) on ranks 0-127 (restored); umask "
        "0o077 (not restored) on ranks 0-127"
    ]


def test_words_of_torch_modes_and_named_state() -> None:
    assert flag_words("autocast cpu", (True, torch.bfloat16)) == "autocast on cpu (bfloat16)"
    assert flag_words("autocast nesting", 1) == "autocast left entered (nesting level 1)"
    assert flag_words("anomaly detection", (True, False)) == (
        "anomaly detection on (without NaN checks)"
    )
    assert (
        flag_words("print options", (1, 1000, 3, 80, None)) == "torch print options (precision 1)"
    )
    assert flag_words("torch._dynamo.config.x", "y" * 100).endswith("...")
    assert processstate.umask_words(0o77) == "umask 0o077"
    assert processstate.signal_words("15", __import__("signal").SIG_IGN) == "SIGTERM ignored"
    assert processstate.module_words("json", object(), object()) == "sys.modules['json'] replaced"
    assert processstate.module_words("json", None, __import__("json")) is None  # an import
    # an alias an import made of a module imported under its own name: no leftover either
    assert processstate.module_words("json_alias", None, __import__("json")) is None
    assert processstate.module_words("fake", None, types.ModuleType("fake")) == (
        "sys.modules['fake'] added"
    )
    assert processstate.path_words(("a",), ("x", "a")) == "sys.path changed ('x' added)"


def test_a_logger_an_import_created_is_not_named_one_the_test_configured_is() -> None:
    fresh = (0, (), True, False)
    configured = (10, (), True, False)
    assert processstate.logging_words("lib.sub", None, configured, {"lib"}) is None
    assert processstate.logging_words("DeepSpeed", None, configured, {"deepspeed"}) is None
    assert (
        processstate.logging_words("mine", None, configured, {"lib"})
        == "logger 'mine': level DEBUG"
    )
    assert processstate.logging_words("mine", None, fresh, set()) is None
    assert processstate.logging_words("", (30, (), True, False), configured, set()) == (
        "the root logger: level DEBUG"
    )


def _drive(wrapper: Any, during: Any = None) -> None:
    """Run a hook wrapper of LeftoverCheck around ``during``, as pluggy would."""
    gen = wrapper
    next(gen)
    if during is not None:
        during()
    with contextlib.suppress(StopIteration):
        gen.send(None)


def test_a_socket_a_wider_fixture_opened_is_its_own_one_the_test_left_is_named() -> None:
    """A module fixture's server (a DeviceMesh's groups listen too) is the fixture's while it
    is set up; a socket the test leaves listening is named, not restored."""
    from pytest_distrank.rank.leftovers import LeftoverCheck

    check = LeftoverCheck(0, "restore", (), ())
    held: list[socket.socket] = []
    fixture = types.SimpleNamespace(scope="module", argname="server")
    item = cast(pytest.Item, types.SimpleNamespace(nodeid="t.py::test_server"))
    try:
        check.start(item, harness=False)
        _drive(
            check.pytest_fixture_setup(cast(Any, fixture), cast(Any, None)),
            lambda: held.append(socket.create_server(("127.0.0.1", 0))),
        )
        _drive(check.pytest_runtest_teardown(item))
        assert check.finish() == ((), "")
        check.start(item, harness=False)
        held.append(socket.create_server(("127.0.0.1", 0)))
        _drive(check.pytest_runtest_teardown(item))
        words, unfit = check.finish()
        port = held[1].getsockname()[1]
        assert words == (f"a socket listening on 127.0.0.1:{port} (not restored)",), words
        assert unfit == ""
    finally:
        for server in held:
            server.close()


def test_the_fail_policy_fails_for_what_is_only_named_too() -> None:
    """Under --distrank-leftovers=fail a umask left changed fails the test's teardown, naming
    it as not restored."""
    from pytest_distrank.rank.leftovers import LeftoverCheck, LeftoverError

    check = LeftoverCheck(1, "fail", (), ())
    item = cast(pytest.Item, types.SimpleNamespace(nodeid="t.py::test_umask"))
    check.start(item, harness=False)
    old = os.umask(0o077)
    try:
        with pytest.raises(
            LeftoverError, match=r"t.py::test_umask left umask 0o077 \(not restored\) on rank 1"
        ):
            _drive(check.pytest_runtest_teardown(item))
    finally:
        os.umask(old)
    assert check.finish() == (("umask 0o077 (not restored)",), "")


def test_children_are_read_without_the_process_helpers() -> None:
    """A child the test started is seen; the helpers that live as long as the process, started
    on first use, are not: inductor's compile-worker pool, multiprocessing's forkserver and
    resource tracker (hostile-4 A6: a DataLoader's forkserver was named)."""
    import subprocess
    import sys
    import time

    helpers = [
        [sys.executable, "-c", "import time; time.sleep(30)", marker]
        for marker in (
            "torch/_inductor/compile_worker",
            "from multiprocessing.forkserver import main",  # as multiprocessing starts them
            "from multiprocessing.resource_tracker import main",
        )
    ]
    started = [subprocess.Popen(["sleep", "30"]), *(subprocess.Popen(h) for h in helpers)]
    try:
        deadline = time.monotonic() + 10
        while str(started[0].pid) not in processstate.children_state():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.2)  # the helpers started too
        children = processstate.children_state()
        assert children[str(started[0].pid)] == "sleep 30"
        assert not {str(p.pid) for p in started[1:]} & children.keys(), children
    finally:
        for child in started:
            child.kill()
            child.wait()


def test_the_port_the_plugin_serves_anew_before_a_test_is_expected_at_its_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rule: an ``init_process_group=False`` pool serves a fresh store before each test and
    exports its port as MASTER_PORT and DISTRANK_MASTER_PORT (pool/worker/rankgroup.py): the
    next start expects that port, not the last end's (put back, every test after the first
    rendezvoused at the previous test's closed store's port); a hook's MASTER_PORT is still
    put back, to the plugin's."""

    def env_changes(start: Snapshot) -> dict[object, object]:
        expected = expected_start(kept(end), {}, {}, start)
        return {key: value for (category, key), value in diff(expected, start) if category == "env"}

    monkeypatch.setenv("MASTER_PORT", "1111")
    monkeypatch.setenv(PLUGIN_PORT_ENV, "1111")
    end = Snapshot.take()
    monkeypatch.setenv("MASTER_PORT", "2222")
    monkeypatch.setenv(PLUGIN_PORT_ENV, "2222")
    assert env_changes(Snapshot.take()) == {env_key(PLUGIN_PORT_ENV): env_key("1111")}
    monkeypatch.setenv("MASTER_PORT", "3333")  # a hook's, after the plugin's
    assert env_changes(Snapshot.take()) == {
        env_key(PLUGIN_PORT_ENV): env_key("1111"),  # ignored by the check: DISTRANK_*
        env_key("MASTER_PORT"): env_key("2222"),
    }


def _run_test(check: Any, item: pytest.Item, body: Any = None) -> tuple[tuple[str, ...], str]:
    """One test as a rank runs it through the check: its start, ``body``, its teardown."""
    check.start(item, harness=False)
    if body is not None:
        body()
    _drive(check.pytest_runtest_teardown(item))
    return cast(tuple[tuple[str, ...], str], check.finish())


def test_a_working_folder_that_cannot_be_put_back_is_named_as_kept(tmp_path: Any) -> None:
    """A test that removes the folder it started in leaves the working folder changed: named
    "(not restored)", never said to be restored."""
    from pytest_distrank.rank.leftovers import LeftoverCheck

    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    start.mkdir()
    elsewhere.mkdir()
    item = cast(pytest.Item, types.SimpleNamespace(nodeid="t.py::test_rmdir"))
    check = LeftoverCheck(0, "restore", (), ())
    old = os.getcwd()
    os.chdir(start)
    try:

        def leave() -> None:
            os.chdir(elsewhere)
            start.rmdir()

        words, _ = _run_test(check, item, leave)
    finally:
        os.chdir(old)
    assert words == ("the working folder changed (not restored)",), words


def test_a_logger_a_module_imported_between_two_tests_configures_is_no_ones(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module imported between two tests (the plugin imports lazily there) that configures
    its own logger is not named on the between line, as it is not within a test; a logger
    configured between them by no import is."""
    import logging

    from pytest_distrank.rank.leftovers import LeftoverCheck

    (tmp_path / "between_configured.py").write_text(
        "import logging\nlogging.getLogger('between_configured').setLevel(logging.DEBUG)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    check = LeftoverCheck(0, "restore", (), ())
    first = cast(pytest.Item, types.SimpleNamespace(nodeid="t.py::test_first"))
    second = cast(pytest.Item, types.SimpleNamespace(nodeid="t.py::test_second"))
    other = logging.getLogger("between_other")
    try:
        assert _run_test(check, first) == ((), "")
        __import__("between_configured")
        other.setLevel(logging.ERROR)
        assert _run_test(check, second) == ((), "")
        assert check.between == (
            "t.py::test_first",
            ("logger 'between_other': level ERROR (not restored)",),
        ), check.between
    finally:
        other.setLevel(logging.NOTSET)
        monkeypatch.delitem(__import__("sys").modules, "between_configured", raising=False)


def test_a_thread_started_between_two_tests_that_is_no_daemon_makes_the_pool_go() -> None:
    """A non-daemon thread a hook starts between two tests (a fresh process would wait for it
    at exit) makes the rank unfit, said as started between them; a daemon thread started there
    (the plugin starts its own) is not named."""
    import threading

    from pytest_distrank.rank.leftovers import LeftoverCheck

    check = LeftoverCheck(0, "fail", (), ())
    first = cast(pytest.Item, types.SimpleNamespace(nodeid="t.py::test_first"))
    second = cast(pytest.Item, types.SimpleNamespace(nodeid="t.py::test_second"))
    stop = threading.Event()
    held = threading.Thread(target=stop.wait, name="held-up", daemon=False)
    helper = threading.Thread(target=stop.wait, name="a-daemon", daemon=True)
    try:
        assert _run_test(check, first) == ((), "")
        held.start()
        helper.start()
        words, unfit = _run_test(check, second)  # under "fail": not failed for it
        assert words == ()
        assert unfit == (
            "started with thread 'held-up' running (not a daemon: a fresh process would wait "
            "for it), left between t.py::test_first and it outside both tests on rank 0"
        ), unfit
        assert check.between is None, check.between
    finally:
        stop.set()
        held.join()
        helper.join()


def test_a_child_whose_command_line_is_empty_is_named_by_the_kernels_name() -> None:
    """A child read amid its exec (or one that cleared its arguments) has an empty command
    line: named by /proc's comm, never as "()"."""
    pid = str(os.getpid())
    with open(f"/proc/{pid}/comm") as f:
        comm = f.read().strip()
    assert processstate.child_words(pid, "") == (
        f"child process {pid} ({comm}, its command line empty) still running"
    )
    assert (
        processstate.child_words(pid, "sleep 60") == f"child process {pid} (sleep 60) still running"
    )


def test_a_listening_socket_only_garbage_holds_is_no_leftover() -> None:
    """A socket held only by garbage (a process group the test or a harness's tearDown
    destroyed and dropped, in a reference cycle) closes once collected: not named. One a live
    object holds is."""
    import gc
    import warnings

    from pytest_distrank.rank.leftovers import LeftoverCheck

    item = cast(pytest.Item, types.SimpleNamespace(nodeid="t.py::test_drops_a_server"))
    check = LeftoverCheck(0, "restore", (), ())
    kept: list[socket.socket] = []

    def body() -> None:
        cycle: dict[str, Any] = {"server": socket.create_server(("127.0.0.1", 0))}
        cycle["self"] = cycle  # only a collection frees it
        kept.append(socket.create_server(("127.0.0.1", 0)))

    enabled = gc.isenabled()
    gc.disable()  # no collection before the check's own (the switch reads the same throughout)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            words, _ = _run_test(check, item, body)
        port = kept[0].getsockname()[1]
    finally:
        if enabled:
            gc.enable()
        for server in kept:
            server.close()
    assert words == (f"a socket listening on 127.0.0.1:{port} (not restored)",), words


DYNAMO_BETWEEN = """
import contextlib, types, torch, sys
assert "torch._dynamo" not in sys.modules
from pytest_distrank.rank.leftovers import LeftoverCheck

def run(check, item, body=lambda: None):
    check.start(item, harness=False)
    body()
    gen = check.pytest_runtest_teardown(item)  # the check's wrapper around an empty teardown
    next(gen)
    with contextlib.suppress(StopIteration):
        gen.send(None)
    return check.finish()

check = LeftoverCheck(0, "restore", (), ())
first = types.SimpleNamespace(nodeid="t.py::test_first")
second = types.SimpleNamespace(nodeid="t.py::test_second")

def compile_and_set():
    import torch._dynamo.config as config  # imported during the test: compared with defaults
    config.suppress_errors = not config.suppress_errors

words, _ = run(check, first, compile_and_set)
assert any("suppress_errors" in w for w in words), words
import torch._dynamo.config as config
config.suppress_errors = not config.suppress_errors  # between the two tests
words, _ = run(check, second)
assert not words, words
assert check.between and "suppress_errors" in " ".join(check.between[1]), check.between
print("ok")
"""


def test_a_dynamo_setting_reset_after_a_test_is_compared_between_tests() -> None:
    """A ``torch._dynamo.config`` entry a test set (dynamo imported during the test) is reset to
    its default; set again between two tests, the next start names it on the between line."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", DYNAMO_BETWEEN], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-2000:]

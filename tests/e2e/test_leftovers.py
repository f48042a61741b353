"""End-to-end: what a test leaves behind in its warm ranks is named with the test and the ranks,
restored where it can be, and the next test starts as if in fresh processes (#26, item 2).

One inner session (``LEFTOVERS``): each case plants one kind of leftover and the test after it
checks that the rank is clean again; a second, tiny one (``FAIL``) runs under
``--distrank-leftovers=fail``. The text of the summary lines is made by
``outcome.checks.leftover_lines`` (tests/unit/test_leftovers.py).
"""

from __future__ import annotations

import re

import pytest

from ..helpers import SharedSession
from .test_faults import Session, Shared

CLEAN = """
import os, decimal, gc, socket, sys, threading, time
import numpy as np, pytest, torch, torch.distributed as dist
from pytest_distrank import _compat
from pytest_distrank.rank.ownedgroups import is_owned

START = os.getcwd()
RENDEZVOUS = {name: os.environ.get(name) for name in ("MASTER_PORT", "MASTER_ADDR")}
ZONE = time.tzname


def assert_clean():
    assert "LEAKED_BY_A" not in os.environ
    assert os.getcwd() == START
    assert torch.get_default_dtype() == torch.float32
    assert torch.is_grad_enabled()
    assert not torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.benchmark is False
    assert torch.backends.cuda.matmul.fp32_precision == "none"
    # the pool's own default group (and the plugin's own twins, which live with the pool)
    assert len([pg for pg in _compat.process_groups() if not is_owned(pg)]) == 1
    assert _compat.compile_state() == 0
    assert not torch.is_autocast_enabled("cpu")
    assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    assert not torch.is_anomaly_enabled()
    assert torch._tensor_str.PRINT_OPTS.precision == 4
    assert {name: os.environ.get(name) for name in RENDEZVOUS} == RENDEZVOUS
    assert time.tzname == ZONE and "TZ" not in os.environ
    assert gc.isenabled() and sys.getrecursionlimit() == 1000
    assert socket.getdefaulttimeout() is None
    assert np.geterr()["divide"] == "warn" and decimal.getcontext().prec == 28
    assert not torch.is_warn_always_enabled() and torch.backends.mkldnn.enabled
    assert torch.autograd.is_multithreading_enabled()
    assert torch._C._autograd._top_saved_tensors_default_hooks(True) is None
    assert not torch.nn.modules.module._global_forward_hooks
    assert torch.ones(1).device.type == "cpu"
"""

CASES = (
    CLEAN
    + """

@pytest.mark.world_size(2)
def test_a_env_and_dtype(rank):
    os.environ["LEAKED_BY_A"] = "1"
    torch.set_default_dtype(torch.float64)


@pytest.mark.world_size(2)
def test_a_then_clean(rank):
    assert_clean()


@pytest.mark.world_size(2)
def test_a_dynamo_config_first_import(rank):
    import torch._dynamo as dynamo  # the first import of dynamo in these ranks

    dynamo.config.recompile_limit = 64


@pytest.mark.world_size(2)
def test_a_then_compiles(rank):
    # hostile-4 A3: the entry was deleted, not reset: every later compile raised AttributeError
    import torch._dynamo as dynamo

    assert dynamo.config.recompile_limit == 8
    assert_clean()
    assert torch.compile(lambda x: x * 3, backend="eager")(torch.ones(1)).item() == 3


@pytest.mark.world_size(2)
def test_b_flags_and_folder(rank, tmp_path):
    torch.set_grad_enabled(False)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    os.chdir(tmp_path)


@pytest.mark.world_size(2)
def test_b_then_clean(rank):
    assert_clean()


@pytest.mark.world_size(2)
def test_c_group_and_compile(rank):
    dist.new_group([0, 1])
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(1))


@pytest.mark.world_size(2)
def test_c_then_clean(rank, module_env):
    assert_clean()


@pytest.mark.world_size(2)
def test_d_module_fixture_kept(rank, module_env):
    # A module fixture's setting is not a leftover while the module's tests run.
    assert os.environ["SET_BY_MODULE_FIXTURE"] == "1"
    global EXECUTOR  # a library's executor, living as long as the process: not a reason to go
    EXECUTOR = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lib")
    EXECUTOR.submit(int).result()
    if rank == 1:
        threading.Thread(target=time.sleep, args=(60,), daemon=True, name="sleeper").start()
    # A thread Python did not start, that called into Python (RPC's C++ threads do): threading
    # lists it as a dummy thread, which cannot be joined. No leftover of the test.
    registered = threading.Event()

    def foreign():
        threading.current_thread()
        registered.set()
        time.sleep(60)

    _thread.start_new_thread(foreign, ())
    assert registered.wait(10)


@pytest.fixture
def mixed_precision():
    ctx = torch.autocast("cpu", dtype=torch.bfloat16)
    ctx.__enter__()
    yield
    # forgot ctx.__exit__(None, None, None): hostile-4 D4


@pytest.mark.world_size(2)
def test_f_autocast_left(rank, mixed_precision):
    x = torch.ones(8, 8)
    assert (x @ x).dtype == torch.bfloat16
    torch.set_anomaly_enabled(True)
    torch.set_printoptions(precision=1)


@pytest.mark.world_size(2)
def test_f_then_clean(rank):
    assert_clean()


@pytest.mark.world_size(2)
def test_g_named_only(rank):
    import logging, signal, socket, subprocess, sys
    logging.getLogger().setLevel(logging.DEBUG)
    sys.path.insert(0, "left-by-g")
    os.umask(0o077)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    global SERVER, CHILD
    SERVER = socket.create_server(("127.0.0.1", 0))
    CHILD = subprocess.Popen(["sleep", "60"])


@pytest.mark.world_size(2)
def test_g_then_named_state_is_still_there(rank):
    import logging, signal, sys
    # Named, not restored: the next test sees them (a fresh process would not).
    assert sys.path[0] == "left-by-g" and signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
    sys.path.remove("left-by-g")
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    logging.getLogger().setLevel(logging.WARNING)
    os.umask(0o022)
    SERVER.close()
    CHILD.kill()
    CHILD.wait()


@pytest.mark.world_size(2)
def test_h_mesh(rank):
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp", "tp"))
    assert mesh["dp"].size() == 2


@pytest.mark.world_size(2)
def test_h_then_clean(rank):
    assert_clean()


@pytest.mark.world_size(2)
def test_i_keeps_a_mesh(rank):
    from torch.distributed.device_mesh import init_device_mesh

    global MESH  # its groups are destroyed after the test, but their listeners stay open
    MESH = init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp", "tp"))


@pytest.mark.world_size(2)
def test_k_switches(rank):
    gc.disable()
    sys.setrecursionlimit(5000)
    socket.setdefaulttimeout(0.5)
    np.seterr(all="raise")
    decimal.getcontext().prec = 3
    torch.set_warn_always(True)
    torch.backends.mkldnn.enabled = False
    torch.autograd.set_multithreading_enabled(False)
    torch.autograd.graph.saved_tensors_hooks(abs, abs).__enter__()
    torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: o * 0)
    os.environ["TZ"] = "Asia/Tokyo"
    time.tzset()
    os.environ["MASTER_PORT"] = "29500"  # an old test pinning a port for its own store
    os.environ.pop("MASTER_ADDR", None)


@pytest.mark.world_size(2)
def test_k_then_clean(rank):
    assert_clean()


@pytest.mark.world_size(2)
def test_j_device_left_entered(rank):
    pathlib.Path(f"pid-j-{rank}").write_text(str(os.getpid()))
    torch.device("meta").__enter__()


@pytest.mark.world_size(2)
def test_j_then_fresh_ranks(rank):
    assert pathlib.Path(f"pid-j-{rank}").read_text() != str(os.getpid())
    assert_clean()


@pytest.mark.world_size(2)
def test_e_thread(rank):
    if rank == 1:
        threading.Thread(target=time.sleep, args=(60,), name="worker").start()
    pathlib.Path(f"pid-e-{rank}").write_text(str(os.getpid()))


@pytest.mark.world_size(2)
def test_e_then_fresh_ranks(rank):
    assert pathlib.Path(f"pid-e-{rank}").read_text() != str(os.getpid())
    assert_clean()
"""
).replace("import os,", "import _thread, concurrent.futures, os, pathlib,")

#: The module fixture's teardown leaves its variable: named when its module ends, in a
#: module of its own so that no fault ends the pool first.
SCOPED = (
    CLEAN
    + """

@pytest.mark.world_size(2)
def test_first(rank, module_env):
    pass


@pytest.mark.world_size(2)
def test_last(rank, module_env):
    assert os.environ["SET_BY_MODULE_FIXTURE"] == "1"
"""
)

#: A fixture of module scope that sets a variable and never unsets it: its teardown leaves it.
CONFTEST = """
import os, pytest


@pytest.fixture(scope="module")
def module_env():
    os.environ["SET_BY_MODULE_FIXTURE"] = "1"
    yield
"""

#: A module fixture's group, never destroyed: its module's last distributed test is followed by
#: a test in the controller, so the pool's next test (test_left.py's first) is of another module
#: and the fixture is torn down between the two (rank/between.py).
TORN = """
import pytest, torch.distributed as dist

KEPT = []


@pytest.fixture(scope="module")
def module_group(rank):
    KEPT.append(dist.new_group([0, 1]))
    yield
    KEPT.clear()


@pytest.mark.world_size(2)
def test_makes_a_group_in_a_module_fixture(rank, module_group):
    pass


def test_in_the_controller():
    pass
"""

LEFTOVERS = Session(
    "leftovers",
    {
        "conftest.py": CONFTEST,
        "test_between.py": TORN,
        "test_left.py": CASES,
        "test_scoped.py": SCOPED,
    },
    ("-v", "-p", "no:randomly"),
)


@pytest.fixture
def left(shared_session: SharedSession) -> Shared:
    return LEFTOVERS.run(shared_session)


def test_every_test_passes_the_next_one_starting_clean(left: Shared) -> None:
    tests = [
        "test_makes_a_group_in_a_module_fixture",
        "test_a_env_and_dtype",
        "test_a_then_clean",
        "test_a_dynamo_config_first_import",
        "test_a_then_compiles",
        "test_b_flags_and_folder",
        "test_b_then_clean",
        "test_c_group_and_compile",
        "test_c_then_clean",
        "test_d_module_fixture_kept",
        "test_f_autocast_left",
        "test_f_then_clean",
        "test_g_named_only",
        "test_g_then_named_state_is_still_there",
        "test_h_mesh",
        "test_h_then_clean",
        "test_i_keeps_a_mesh",
        "test_k_switches",
        "test_k_then_clean",
        "test_j_device_left_entered",
        "test_j_then_fresh_ranks",
        "test_e_thread",
        "test_e_then_fresh_ranks",
        "test_first",
        "test_last",
    ]
    assert left.outcomes(*tests) == ["passed"] * len(tests), left.text
    assert left.result.ret == 0


def test_environment_and_dtype_are_restored_and_named_with_the_test(left: Shared) -> None:
    left.result.stdout.fnmatch_lines(
        [
            "leftovers: test_left.py::test_a_env_and_dtype left LEAKED_BY_A set and the default "
            "dtype float64 on ranks 0, 1 (restored)"
        ]
    )


def test_a_group_a_fixture_torn_down_between_two_tests_left_is_destroyed_and_named(
    left: Shared,
) -> None:
    """On the between line, not on either test; destroyed (test_a_then_clean finds the pool's
    group alone; was: neither named nor destroyed, alive in every later test)."""
    left.result.stdout.fnmatch_lines(
        [
            "leftovers: between test_between.py::test_makes_a_group_in_a_module_fixture and "
            "test_left.py::test_a_env_and_dtype, code outside both tests (*) left process group "
            "'*' (ranks 0, 1) on ranks 0, 1 (restored)"
        ]
    )


def test_flags_and_the_working_folder_are_restored(left: Shared) -> None:
    line = left.about("test_b_flags_and_folder").lines
    assert len(line) == 2, line  # its -v progress line and its leftovers line
    for words in (
        "grad mode off",
        "deterministic algorithms on",
        "torch.backends.cudnn.benchmark True",
        "torch.backends.cuda.matmul.fp32_precision tf32",
        "the working folder changed",
    ):
        assert words in line[1], line
    assert line[1].startswith("leftovers: test_left.py::test_b_flags_and_folder left ")
    assert line[1].endswith(" on ranks 0, 1 (restored)")


def test_a_group_left_is_destroyed_and_compile_state_reset(left: Shared) -> None:
    left.result.stdout.fnmatch_lines(
        [
            "leftovers: test_left.py::test_c_group_and_compile left process group '*' "
            "(ranks 0, 1) on ranks 0, 1 (restored)"
        ]
    )


def test_a_daemon_thread_is_named_and_a_thread_gets_the_next_test_fresh_ranks(
    left: Shared,
) -> None:
    left.result.stdout.fnmatch_lines(
        [
            "pool killed after a fault: world_size=2, backend=gloo: test_left.py::test_e_thread "
            "left thread 'worker' running (not a daemon: a fresh process would wait for it) on "
            "rank 1",
        ]
    )
    left.result.stdout.fnmatch_lines(
        [
            "leftovers: test_left.py::test_d_module_fixture_kept left executor thread 'lib_0' "
            "still running on ranks 0, 1",
            "leftovers: test_left.py::test_d_module_fixture_kept left daemon thread 'sleeper' "
            "still running on rank 1",
        ]
    )
    # Only the non-daemon thread replaced the pool; a dummy thread (started outside Python's
    # threading) is neither named nor joined (joining one raises: RPC's tests failed on it).
    assert len([line for line in left.result.outlines if "test_e_thread left" in line]) == 1
    left.result.stdout.no_fnmatch_line("*Dummy-*")
    left.result.stdout.no_fnmatch_line("*cannot join a dummy thread*")


def test_a_wider_fixture_owns_its_changes_until_its_teardown(left: Shared) -> None:
    # Kept while its module runs (test_d passed, no line names test_c or test_d for it) ...
    assert "SET_BY_MODULE_FIXTURE" not in "\n".join(left.about("test_c_then_clean").lines)
    # ... and named when its teardown leaves it, with the fixture.
    left.result.stdout.fnmatch_lines(
        [
            "leftovers: test_scoped.py::test_last left SET_BY_MODULE_FIXTURE set by fixture "
            "'module_env' on ranks 0, 1 (restored)"
        ]
    )


FAIL = Session(
    "leftovers-fail",
    {
        "test_fail.py": """
import os, pytest


@pytest.mark.world_size(2)
def test_leaves_a_variable(rank):
    os.environ["LEAKED"] = str(rank)


@pytest.mark.world_size(2)
def test_next(rank):
    assert "LEAKED" not in os.environ


@pytest.mark.world_size(2)
def test_builds_a_mesh(rank):
    from torch.distributed.device_mesh import init_device_mesh

    assert init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp", "tp"))["dp"].size() == 2


@pytest.mark.world_size(2)
def test_compiles(rank):
    import torch

    assert torch.compile(lambda x: x * 2 + 1, backend="eager")(torch.ones(2)).sum() == 6


@pytest.mark.world_size(2)
def test_loads_with_workers(rank):
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.arange(32.0))
    assert sum(b[0].sum().item() for b in DataLoader(data, batch_size=4, num_workers=2)) == 496
    # multiprocessing's forkserver (and its resource tracker) live as long as the rank
    loader = DataLoader(data, batch_size=4, num_workers=1, multiprocessing_context="forkserver")
    assert sum(b[0].sum().item() for b in loader) == 496
"""
    },
    ("--distrank-leftovers=fail",),
)


def test_the_fail_policy_fails_the_leaking_test_at_teardown(shared_session: SharedSession) -> None:
    fail = FAIL.run(shared_session)
    # A DeviceMesh the test built is normal: its groups are destroyed, the test does not fail
    # (issue 37: every test that built a mesh failed under fail).
    # Nor is compiling, nor a DataLoader with workers (hostile-4 A6: both failed under fail).
    tests = ("test_leaves_a_variable", "test_next", "test_builds_a_mesh", "test_compiles")
    assert fail.outcomes(*tests, "test_loads_with_workers") == [
        "passed, error at teardown",
        *["passed"] * len(tests),
    ], fail.text
    fail.result.stdout.no_fnmatch_line("*leftovers: *test_compiles*")
    fail.result.stdout.no_fnmatch_line("*leftovers: *test_loads_with_workers*")
    fail.section("test_leaves_a_variable").fnmatch_lines(
        [
            "*LeftoverError: test_fail.py::test_leaves_a_variable left LEAKED set on rank *; "
            "what can be restored was restored*",
            "*--distrank-leftovers=fail fails a test for what it leaves behind*",
        ]
    )


def test_autocast_and_torch_modes_are_restored_and_named_with_the_polluter(left: Shared) -> None:
    """hostile-4 D4: an autocast a fixture left entered made the next test pass that fails on
    fresh ranks; now the next test starts without it (test_f_then_clean passed) and the line
    names the test that left it."""
    left.result.stdout.fnmatch_lines(
        [
            "leftovers: test_left.py::test_f_autocast_left left autocast on cpu (bfloat16), "
            "autocast left entered (nesting level 1), anomaly detection on and torch print "
            "options (precision 1) on ranks 0, 1 (restored)"
        ]
    )


def test_what_cannot_be_restored_is_named_not_restored(left: Shared) -> None:
    lines = [line for line in left.about("test_g_named_only").lines if "leftovers:" in line]
    text = "\n".join(lines)
    for words in (
        "sys.path changed ('left-by-g' added) (not restored)",
        "umask 0o077 (not restored)",
        "SIGUSR2 ignored (not restored)",
        "the root logger: level DEBUG (not restored)",
        "(sleep 60) still running",
        "a socket listening on 127.0.0.1:",
    ):
        assert words in text, text
    assert all(
        line.startswith("leftovers: test_left.py::test_g_named_only left ") for line in lines
    )
    assert "(restored)" not in text, text


def test_a_device_mesh_the_test_built_is_cleaned_up_unnamed(left: Shared) -> None:
    """Issue 37 item 4: a DeviceMesh's groups are normal (no line names them) but destroyed
    (test_h_then_clean saw only the pool's group), and their sockets do not pile up (a socket
    still listening would be named)."""
    assert [line for line in left.about("test_h_mesh").lines if "leftovers:" in line] == []


def test_a_mesh_kept_in_a_global_names_the_sockets_it_holds_open(left: Shared) -> None:
    """Its groups are destroyed (not named), but a DeviceMesh kept alive holds them, and their
    listeners, open: the sockets are named with why."""
    lines = [line for line in left.about("test_i_keeps_a_mesh").lines if "leftovers:" in line]
    assert len(lines) == 1, lines  # one line for both ranks, each rank's port in it
    assert re.fullmatch(
        r"leftovers: test_left\.py::test_i_keeps_a_mesh left a socket listening on "
        r"127\.0\.0\.1:\d+ \(rank 0\), :\d+ \(rank 1\) \(a process group destroyed after the "
        r"test listens until freed: a DeviceMesh or group the test kept in a global holds it\) "
        r"\(not restored\) on ranks 0, 1",
        lines[0].strip(),
    ), lines


def test_a_dynamo_entry_set_on_its_first_import_is_reset_not_deleted(left: Shared) -> None:
    """hostile-4 A3: the entry was deleted (``delattr``): every later torch.compile of the pool
    raised AttributeError, blamed on an innocent test. test_a_then_compiles passed above; the
    compile it made is normal and named nowhere."""
    left.result.stdout.fnmatch_lines(
        [
            "leftovers: test_left.py::test_a_dynamo_config_first_import left "
            "torch._dynamo.config.recompile_limit 64 on ranks 0, 1 (restored)"
        ]
    )
    assert [line for line in left.about("test_a_then_compiles").lines if "leftovers:" in line] == []


def test_process_wide_switches_are_restored_and_named(left: Shared) -> None:
    """hostile-4 A4/A5: switches outside torch's flags leaked unnamed; TZ came back but libc's
    zone did not; MASTER_PORT/MASTER_ADDR were neither restored nor named. test_k_then_clean
    passed above; the rendezvous variables come back unnamed (they are the rank's)."""
    text = "\n".join(line for line in left.about("test_k_switches").lines if "leftovers:" in line)
    for words in (
        "TZ set",
        "the garbage collector disabled",
        "sys.setrecursionlimit(5000)",
        "socket.setdefaulttimeout(0.5)",
        "numpy.seterr(",
        "the decimal context (prec 3, ...)",
        "torch.set_warn_always on",
        "torch.backends.mkldnn.enabled False",
        "autograd multithreading off",
        "torch.autograd.graph.saved_tensors_hooks left entered",
        "global nn.Module hooks (forward_hooks)",
    ):
        assert words in text, text
    assert "MASTER_" not in text and "(not restored)" not in text, text


def test_a_function_mode_left_entered_gets_the_next_test_fresh_ranks(left: Shared) -> None:
    """hostile-4 A1: a ``torch.device("meta")`` left entered (a function mode) was neither
    named nor restored, the summary said the default device was "restored", and a phantom
    flush-denormal change was named (read by arithmetic on meta)."""
    left.result.stdout.fnmatch_lines(
        [
            "pool killed after a fault: world_size=2, backend=gloo: test_left.py::"
            "test_j_device_left_entered left torch function modes entered: DeviceContext on rank*"
        ]
    )
    text = "\n".join(left.about("test_j_device_left_entered").lines)
    assert "default device" not in text and "flush-denormal" not in text, text

"""Unit, property with real process state: whatever a generated test body changes in a process,
the leftover check (rank/leftovers.py) either restores it or names it, never keeps it silently;
and what changes between two tests is named apart, credited to neither (rank/between.py).

The bodies run in one subprocess (torch's global state of this test process is left alone):
200 generated subsets of the changes below, each applied, then the check's teardown and finish
as a rank runs them, then every change compared with the state before; then 100 subsets made
between two clean tests. Budget: < 30 s.
"""

# ruff: noqa: E501  (the body below is a script, one change a line)
from __future__ import annotations

import subprocess
import sys

import pytest

#: The changes a generated test body makes (tests/unit/test_leftovers_fingerprint.py uses them too).
CHANGES = r"""
import decimal, gc, logging, os, signal, socket, subprocess, sys, time, traceback, types
import numpy, torch, torch._dynamo.config as dynamo_config
from hypothesis import given, settings, strategies as st
from pytest_distrank.rank import leftovers
from pytest_distrank.rank.leftovers import LeftoverCheck

leftovers.ENDING_WAIT = 0.02
held = []
modules = []
entered = {}
hooks = torch.nn.modules.module._global_forward_hooks
saved_top = lambda: torch._C._autograd._top_saved_tensors_default_hooks(True)

def denormal_read():
    with torch._C.DisableTorchFunction():
        return (torch.tensor([1e-310], dtype=torch.float64, device="cpu") * 1.0).item()

def precision_read():  # every float32 precision setting: one set may set others
    try:
        legacy = torch.get_float32_matmul_precision()
    except RuntimeError:  # mixed legacy and new settings
        legacy = None
    paths = ("", ".cuda.matmul", ".cudnn", ".cudnn.conv", ".cudnn.rnn", ".mkldnn", ".mkldnn.matmul",
             ".mkldnn.conv", ".mkldnn.rnn")
    return legacy, *(eval("torch.backends" + path).fp32_precision for path in paths)

def enter(name, ctx):
    entered[name] = ctx
    ctx.__enter__()

def leave(name):
    entered.pop(name).__exit__(None, None, None)

def change(apply, read, words, undo=None):
    return (apply, read, words, undo)

CHANGES = {
    "env": change(lambda: os.environ.__setitem__("LEFT_X", "1"), lambda: os.environ.get("LEFT_X"), "LEFT_X set"),
    "cwd": change(lambda: os.chdir("/"), os.getcwd, "the working folder changed"),
    "dtype": change(lambda: torch.set_default_dtype(torch.float64), torch.get_default_dtype, "the default dtype"),
    "grad": change(lambda: torch.set_grad_enabled(False), torch.is_grad_enabled, "grad mode"),
    "autocast": change(lambda: torch.autocast("cpu", dtype=torch.bfloat16).__enter__(),
                       lambda: (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")), "autocast on cpu"),
    "autocast_dtype": change(lambda: torch.set_autocast_dtype("cpu", torch.float16),
                             lambda: torch.get_autocast_dtype("cpu"), "autocast off on cpu"),
    "anomaly": change(lambda: torch.set_anomaly_enabled(True), torch.is_anomaly_enabled, "anomaly detection"),
    "denormal": change(lambda: torch.set_flush_denormal(True),
                       denormal_read, "flush-denormal"),
    "print": change(lambda: torch.set_printoptions(precision=1), lambda: torch._tensor_str.PRINT_OPTS.precision, "print options"),
    "dynamo": change(lambda: setattr(dynamo_config, "suppress_errors", True), lambda: dynamo_config.suppress_errors,
                     "torch._dynamo.config.suppress_errors"),
    "path": change(lambda: sys.path.insert(0, "/left/path"), lambda: list(sys.path), "sys.path changed",
                   lambda: sys.path.remove("/left/path")),
    "module": change(lambda: modules.append(sys.modules.get("json")) or sys.modules.__setitem__("json", types.ModuleType("json")),
                     lambda: id(sys.modules.get("json")), "sys.modules['json'] replaced",
                     lambda: sys.modules.__setitem__("json", modules.pop())),
    "umask": change(lambda: os.umask(0o077), lambda: (lambda m: (os.umask(m), m)[1])(os.umask(0o022)), "umask",
                    lambda: os.umask(0o022)),
    "signal": change(lambda: signal.signal(signal.SIGUSR1, signal.SIG_IGN), lambda: signal.getsignal(signal.SIGUSR1),
                     "SIGUSR1 ignored", lambda: signal.signal(signal.SIGUSR1, signal.SIG_DFL)),
    "level": change(lambda: logging.getLogger().setLevel(logging.DEBUG), lambda: logging.getLogger().level,
                    "the root logger: level DEBUG", lambda: logging.getLogger().setLevel(logging.WARNING)),
    "handler": change(lambda: logging.getLogger("left.lib").addHandler(logging.NullHandler()),
                      lambda: len(logging.getLogger("left.lib").handlers), "logger 'left.lib'",
                      lambda: logging.getLogger("left.lib").handlers.clear()),
    "child": change(lambda: held.append(subprocess.Popen(["sleep", "30"])),
                    lambda: sum(1 for p in held if isinstance(p, subprocess.Popen) and p.poll() is None),
                    "child process", lambda: [p.kill() or p.wait() for p in held if isinstance(p, subprocess.Popen)] and held.clear()),
    "socket": change(lambda: held.append(socket.create_server(("127.0.0.1", 0))),
                     lambda: sum(1 for s in held if isinstance(s, socket.socket)),
                     "a socket listening on 127.0.0.1",
                     lambda: [s.close() for s in held if isinstance(s, socket.socket)] and held.clear()),
    # None: never named, so always restored (the rank's rendezvous; libc's zone with TZ)
    "tz": change(lambda: os.environ.__setitem__("TZ", "Asia/Tokyo") or time.tzset(), lambda: time.tzname, None),
    "master_port": change(lambda: os.environ.__setitem__("MASTER_PORT", "1"), lambda: os.environ.get("MASTER_PORT"), None),
    "meta_device": change(lambda: enter("meta_device", torch.device("meta")), lambda: torch.ones(1).device.type,
                          "function modes entered", lambda: leave("meta_device")),
    "inference": change(lambda: enter("inference", torch.inference_mode()), torch.is_inference_mode_enabled,
                        "torch.inference_mode entered", lambda: leave("inference")),
    "gc": change(gc.disable, gc.isenabled, "the garbage collector"),
    "recursion": change(lambda: sys.setrecursionlimit(5000), sys.getrecursionlimit, "sys.setrecursionlimit"),
    "sock_timeout": change(lambda: socket.setdefaulttimeout(0.5), socket.getdefaulttimeout, "socket.setdefaulttimeout"),
    "warn_always": change(lambda: torch.set_warn_always(True), torch.is_warn_always_enabled, "torch.set_warn_always"),
    # a parent's precision and cudnn's legacy allow_tf32 (restored: cudnn.conv's and rnn's too)
    "precision": change(lambda: setattr(torch.backends, "fp32_precision", "tf32") or torch._C._set_cudnn_allow_tf32(False),
                        precision_read, "torch.backends.fp32_precision tf32"),
    # read with the legacy matmul precision only, whose setter sets cuda.matmul's too
    "mkldnn_matmul": change(lambda: setattr(torch.backends.mkldnn.matmul, "fp32_precision", "bf16"), precision_read,
                            "torch.backends.mkldnn.matmul.fp32_precision bf16"),
    "mkldnn": change(lambda: setattr(torch.backends.mkldnn, "enabled", False), lambda: torch.backends.mkldnn.enabled,
                     "torch.backends.mkldnn.enabled"),
    "multithreading": change(lambda: torch.autograd.set_multithreading_enabled(False),
                             torch.autograd.is_multithreading_enabled, "autograd multithreading"),
    "saved_hooks": change(lambda: enter("saved_hooks", torch.autograd.graph.saved_tensors_hooks(abs, abs)), saved_top,
                          "saved_tensors_hooks"),
    "module_hook": change(lambda: torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: o),
                          lambda: len(hooks), "global nn.Module hooks"),
    "numpy": change(lambda: numpy.seterr(all="raise"), lambda: numpy.geterr()["divide"], "numpy.seterr"),
    "decimal": change(lambda: setattr(decimal.getcontext(), "prec", 3), lambda: decimal.getcontext().prec,
                      "the decimal context"),
    "profiler": change(lambda: enter("profiler", torch.profiler.profile()), torch._C._autograd._profiler_enabled,
                       "a torch profiler left entered", lambda: leave("profiler")),
}

#: What is left entered and cannot be exited from outside: the pool goes (named in unfit).
ENTERED = {"meta_device", "profiler", "inference"}

def teardown(check, item):  # the check's teardown wrapper around an empty one, as pluggy runs it
    gen = check.pytest_runtest_teardown(item)
    next(gen)
    try:
        gen.send(None)
    except StopIteration:
        pass
"""

BODY = (
    CHANGES
    + r"""
ITEM = types.SimpleNamespace(nodeid="t.py::test_body")

@settings(max_examples=200, deadline=None, database=None)
@given(st.sets(st.sampled_from(sorted(CHANGES))))
def body(chosen):
    check = LeftoverCheck(0, "restore", (), ())
    reads = {name: CHANGES[name][1]() for name in CHANGES}
    check.start(ITEM, harness=False)
    for name in sorted(chosen):
        CHANGES[name][0]()
    teardown(check, ITEM)
    words, unfit = check.finish()
    said = " | ".join([*words, unfit])
    # What is kept must be named as kept: "(not restored)", "still running", or why the pool goes.
    kept_words = " | ".join([w for w in words if w.endswith(("(not restored)", "still running"))] + [unfit])
    try:
        for name in sorted(chosen):
            _, read, pattern, _ = CHANGES[name]
            kept = read() != reads[name]
            # (once the pool goes for what was left entered, the next test gets fresh ranks)
            replaced = unfit and name not in ENTERED
            assert not kept or replaced or (pattern is not None and pattern in kept_words), (
                f"{name}: kept and not named as kept in {said!r}")
        for name in set(CHANGES) - chosen:  # nothing is named that the body did not change
            assert CHANGES[name][2] is None or CHANGES[name][2] not in said or name in ("autocast", "autocast_dtype"), (name, said)
        assert "flush-denormal" not in said or "denormal" in chosen, said
        assert not unfit or ENTERED & chosen, unfit
    finally:
        for name in sorted(chosen):  # what is only named is undone here, for the next body
            undo = CHANGES[name][3]
            if undo is not None:
                undo()

from pytest_distrank.rank.between import BETWEEN

FIRST = types.SimpleNamespace(nodeid="t.py::test_first")
SECOND = types.SimpleNamespace(nodeid="t.py::test_second")
#: Changes of categories not compared between two tests (the plugin's own code changes them there).
NOT_COMPARED = {"module", "child", "socket"}

def run(check, item):
    check.start(item, harness=False)
    teardown(check, item)

@settings(max_examples=100, deadline=None, database=None)
@given(st.sets(st.sampled_from(sorted(CHANGES))))
def between(chosen):
    check = LeftoverCheck(0, "fail", (), ())
    reads = {name: CHANGES[name][1]() for name in CHANGES}
    run(check, FIRST)
    assert check.finish() == ((), ""), "a clean first test"
    for name in sorted(chosen):
        CHANGES[name][0]()
    made = {name for name in chosen if CHANGES[name][1]() != reads[name]}
    try:
        run(check, SECOND)  # under "fail": a teardown that raised would fail this body
        words, unfit = check.finish()
        previous, said = check.between or ("", ())
        said = " | ".join(said)
        assert not words, f"credited to the second test: {words}"
        assert not check.between or previous == FIRST.nodeid, check.between
        kept_words = " | ".join(
            [w for w in check.between[1] if w.endswith(("(not restored)", "still running"))]
            if check.between else []
        ) + " | " + unfit
        for name in sorted(chosen - NOT_COMPARED):
            _, read, pattern, _ = CHANGES[name]
            kept = read() != reads[name]
            replaced = unfit and name not in ENTERED
            assert not kept or replaced or (pattern is not None and pattern in kept_words), (
                f"{name}: kept and not named as kept in {said!r} / {unfit!r}")
            if pattern is None or kept or name not in made:
                continue
            named = pattern in said or (name.startswith("autocast") and "autocast" in said)
            assert named, f"{name}: restored unnamed: {said!r}"
        for name in set(CHANGES) - chosen:  # nothing is named that was not changed
            assert CHANGES[name][2] is None or CHANGES[name][2] not in said or name in ("autocast", "autocast_dtype"), (name, said)
        assert not unfit or ENTERED & chosen, unfit
    finally:
        for name in sorted(chosen):
            undo = CHANGES[name][3]
            if undo is not None:
                undo()

def check(name, prop):  # each property's verdict on its own line (one torch import for both)
    try:
        prop()
    except BaseException:
        traceback.print_exc()
        print(f"{name} failed")
    else:
        print(f"{name} ok")

logging.getLogger().setLevel(logging.WARNING)
os.umask(0o022)
os.environ["TZ"] = "UTC"  # a zone that differs from Asia/Tokyo, as the rank's own
time.tzset()
os.environ["MASTER_PORT"] = "29400"
check("body", body)
check("between", between)
"""
)


@pytest.fixture(scope="module")
def generated() -> subprocess.CompletedProcess[str]:
    """Both properties' run (200 bodies, then 100 sets of changes between two tests)."""
    return subprocess.run(
        [sys.executable, "-c", BODY], capture_output=True, text=True, timeout=180, check=False
    )


def _verdict(done: subprocess.CompletedProcess[str], name: str) -> None:
    assert f"{name} ok" in done.stdout.splitlines(), done.stdout[-3000:] + done.stderr[-3000:]


def test_every_change_a_generated_test_makes_is_restored_or_named(
    generated: subprocess.CompletedProcess[str],
) -> None:
    """Rule: after the check, each change the body made either reads as before it (restored)
    or is named in the check's words (only named); a change is never kept silently, and
    nothing the body did not change is named. 200 bodies."""
    _verdict(generated, "body")


def test_what_changes_between_two_tests_is_named_apart_and_credited_to_neither(
    generated: subprocess.CompletedProcess[str],
) -> None:
    """Rule (rank/between.py): after a change made between two tests, outside both, the second
    test's start names it on the between line (as kept, where it is kept), the second test is
    credited with nothing (and not failed under ``fail``), and nothing unchanged is named. 100
    generated sets of changes."""
    _verdict(generated, "between")

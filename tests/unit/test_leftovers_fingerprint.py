"""Unit, property with real process state: the cheap marks of rank/fingerprint.py never hide a
change. After every step of a generated sequence (the changes of the leftover property test in
test_leftovers_process.py, their undoing, children started, orphaned, adopted and ended), what
the leftover check reads through a mark or a cheaper read equals what a full walk reads now:
child processes, ``sys.modules`` (its dict's version), loggers (their list
kept by ``loggerDict``'s version, the category by their raw state), torch's flags (read through
its C getters, against the public API), sockets, signal dispositions, flush-denormal (read on
floats, against a tensor), and the whole snapshot. One subprocess (a child subreaper, as a rank
is); budget < 30 s.
"""

# ruff: noqa: E501  (the script below is one change a line)
from __future__ import annotations

import subprocess
import sys

from tests.unit.test_leftovers_process import CHANGES

PROPERTY = r"""
import functools, threading
from pytest_distrank.rank import fingerprint, processstate as ps, reaper, torchstate
from pytest_distrank.rank.snapshot import Snapshot, diff

reaper.become_subreaper()  # as a rank: orphans of its children are adopted

def walked_signals():
    state = {name: signal.getsignal(number) for name, number in ps._signals()}
    key = str(int(signal.SIGCHLD))
    state[key] = ps._before_torch(state.get(key))
    return state

def walked_sockets():  # readlink of each /proc/self/fd/N, as the check read them before
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(int(target[8:-1]))
    return found

def walked_logging():  # every logger's attributes read one by one, as the check read them before
    manager = logging.Logger.manager
    loggers = [("", logging.getLogger())] + [(n, lg) for n, lg in list(manager.loggerDict.items()) if isinstance(lg, logging.Logger)]
    state = {ps.DISABLE: manager.disable}
    for name, lg in loggers:
        if name == "torch" or name.startswith("torch."):
            continue
        state[name] = (lg.level, tuple(h for h in lg.handlers if not ps._own_handler(h)), lg.propagate, lg.disabled)
    return state

def walked_torch():  # torch's public getters and properties, as the check read them before
    flags = {"default dtype": torch.get_default_dtype(), "default device": str(torch.get_default_device()),
             "grad mode": torch.is_grad_enabled(),
             "deterministic algorithms": (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()),
             "torch threads": torch.get_num_threads(), "float32 matmul precision": torchstate._matmul_precision(torch)}
    for path in torchstate.BACKEND_FLAGS:
        try:
            flags["torch." + path] = functools.reduce(getattr, path.split("."), torch)
        except (AttributeError, RuntimeError):
            pass
    for device in torchstate._autocast_devices(torch):
        flags[f"autocast {device}"] = (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
    flags.update({"autocast nesting": torchstate._nesting(torch), "autocast cache": torch.is_autocast_cache_enabled(),
                  "anomaly detection": (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
                  "flush denormal": denormal_read() == 0.0, "warn always": torch.is_warn_always_enabled(),
                  "autograd multithreading": torch.autograd.is_multithreading_enabled(),
                  torchstate.FUNCTION_MODES: torchstate.function_modes(torch), torchstate.INFERENCE: torch.is_inference_mode_enabled(),
                  "print options": tuple(getattr(torch._tensor_str.PRINT_OPTS, f) for f in torchstate.PRINT_FIELDS)})
    flags.update((torchstate.DYNAMO + k, v) for k, v in dynamo_config.get_config_copy().items())
    return flags

swapped = logging.getLogger("left.swap")
swapped.addHandler(logging.NullHandler())
made = []

def new_logger():  # under a placeholder first: "left.made.N.child" makes "left.made.N" one
    name = f"left.made.{len(made)}"
    made.append(logging.getLogger(name + ".child"))
    made.append(logging.getLogger(name))

def listed_children():  # a thread that ended since the listing lists none
    return [p for t in os.listdir("/proc/self/task") for p in (ps._read(f"/proc/self/task/{t}/children") or b"").split()]

def spawn():
    held.append(subprocess.Popen(["sleep", "30"]))

def settled():  # until every child runs its program (a fork of this process, or one amid its exec, reads otherwise)
    own, until = ps._command("self"), time.monotonic() + 5
    while any(ps._command(p.decode()) in (own, "") for p in listed_children()) and time.monotonic() < until:
        time.sleep(0.001)

def orphan():  # a grandchild whose parent exits: adopted by this process once its parent ended
    subprocess.run(["sh", "-c", "sleep 30 & exit 0"], check=True)
    while any(c != "sleep 30" for c in ps._walk_children().values()):
        time.sleep(0.001)  # the adopted fork of sh, until it runs sleep

def end_children():
    for pid in [int(p) for p in ps._walk_children()] + [p.pid for p in held if isinstance(p, subprocess.Popen)]:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    held[:] = [h for h in held if not isinstance(h, subprocess.Popen)]

stop = threading.Event()
daemons = []

def daemon():  # a thread left running, until "end threads"
    daemons.append(threading.Thread(target=stop.wait, daemon=True))
    daemons[-1].start()

def end_threads():
    stop.set()
    for t in daemons:
        t.join()
    daemons.clear()
    stop.clear()

def thread():  # moves the pid mark without making a child
    t = threading.Thread(target=lambda: None)
    t.start()
    t.join()

applied = set()

def applying(name):  # each change at most once before its undo: undone exactly
    def step():
        if name not in applied:
            applied.add(name)
            CHANGES[name][0]()
    return step

def undoing(name):
    def step():
        if name in applied:
            applied.discard(name)
            CHANGES[name][3]()
    return step

# Every change but what stays entered (a profiler, inference mode); those without an undo stay.
STEPS = {f"apply {name}": applying(name) for name in CHANGES if name not in ENTERED}
STEPS.update({f"undo {name}": undoing(name) for name in CHANGES if CHANGES[name][3] is not None})
STEPS.update({"spawn": spawn, "orphan": orphan, "end children": end_children, "thread": thread,
              "daemon": daemon, "end threads": end_threads,
              "import": lambda: __import__("colorsys"), "forget import": lambda: sys.modules.pop("colorsys", None),
              "denormals kept": lambda: torch.set_flush_denormal(False), "nothing": lambda: None,
              # each kind of change a mark must see, with the same length or count
              "swap module": lambda: sys.modules.__setitem__("colorsys", types.ModuleType("colorsys")),
              "same module": lambda: sys.modules.__setitem__("os", os),
              "env value": lambda: os.environ.__setitem__("LEFT_V", "ab"[os.environ.get("LEFT_V") == "a"]),
              "env same": lambda: os.environ.__setitem__("LEFT_V", os.environ.get("LEFT_V", "a")),
              "swap handler": lambda: swapped.handlers.__setitem__(0, logging.NullHandler()),
              "propagate": lambda: setattr(swapped, "propagate", not swapped.propagate),
              "disabled": lambda: setattr(swapped, "disabled", not swapped.disabled),
              "logger level": lambda: swapped.setLevel(logging.DEBUG if swapped.level != logging.DEBUG else logging.NOTSET),
              "logging.disable": lambda: logging.disable(logging.INFO if not logging.root.manager.disable else logging.NOTSET),
              "new logger": new_logger,
              "default device": lambda: torch.set_default_device(None if str(torch.get_default_device()) == "meta" else "meta"),
              "cudnn benchmark": lambda: setattr(torch.backends.cudnn, "benchmark", not torch.backends.cudnn.benchmark),
              "fp32 precision": lambda: setattr(torch.backends.mkldnn, "fp32_precision", "bf16" if torch.backends.mkldnn.fp32_precision != "bf16" else "none")})
skipped = [0]

def differences(a, b):  # threads, sockets and children: compared with their walks above
    return [key for key, _ in diff(a, b) if key[0] not in ("threads", "sockets", "children")]

@settings(max_examples=150, deadline=None, database=None)
@given(st.lists(st.sampled_from(sorted(STEPS)), min_size=1, max_size=8))
def sequence(steps):
    try:
        for step in ["nothing", *steps, "nothing"]:
            STEPS[step]()
            settled()
            skipping = fingerprint.has_children() is False
            before = Snapshot.take()  # through the marks
            listed = listed_children()  # every child of every thread, helpers and forks too
            walk = ps._walk_children()
            assert ps.children_state() == walk, (step, walk)
            assert not (skipping and listed), (step, listed)  # no child at all when skipped
            assert before.children == walk, (step, walk)
            skipped[0] += skipping
            assert before.modules == dict(sys.modules), (step, before.modules.keys() ^ sys.modules.keys())
            assert ps.modules_state() == dict(sys.modules), step
            assert before.threads == {t.ident: t for t in threading.enumerate()} == Snapshot.take().threads, step
            assert before.env == dict(os.environ._data) and fingerprint.dict_mark(sys.modules), step  # marks in use
            assert before.logging == walked_logging() == ps.logging_state(), step
            assert before.torch == walked_torch() == torchstate.torch_flags(), (step, before.torch.items() ^ walked_torch().items())
            assert ps.socket_inodes() == walked_sockets(), step
            signals = ps.signal_state()
            assert signals == walked_signals(), step
            assert all(type(a) is type(b) for a, b in zip(signals.values(), walked_signals().values()))
            after = Snapshot.take()
            assert after.children == ps._walk_children(), (step, after.children, ps._walk_children(), listed_children())
            assert not differences(before, after), (step, differences(before, after))
            # flush-denormal read on plain floats, as a torch kernel reads it
            assert torchstate._flushes_denormals() == (denormal_read() == 0.0), step
    finally:
        end_children()
        end_threads()
        torch.set_default_device(None)
        for name in sorted(applied):  # back to the start, for the next sequence
            if CHANGES[name][3] is not None:
                undoing(name)()

sequence()
assert skipped[0], "the children mark never let a walk be skipped"
assert fingerprint.has_children() is False  # every child ended and waited for
print("ok", skipped[0])
"""


def test_a_read_through_a_mark_equals_the_walk_after_any_change() -> None:
    """Rule: whatever a sequence of generated changes did, the children, ``sys.modules``, the
    environment, threads, loggers, torch's flags and signal dispositions read as a snapshot
    reads them (through marks, raw reads, C getters) equal a full walk's, and the children walk
    is skipped only when the process has no child at all (the kernel lists none); the skip
    happens. 150 sequences of up to 8 steps, one subprocess."""
    done = subprocess.run(
        [sys.executable, "-c", CHANGES + PROPERTY],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.strip().startswith("ok"), (
        done.stdout[-3000:] + done.stderr[-3000:]
    )

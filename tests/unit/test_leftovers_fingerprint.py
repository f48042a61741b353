"""Unit, property with real process state: the cheap marks of rank/fingerprint.py never hide a
change. After every step of a generated sequence (the changes of the leftover property test in
test_leftovers_process.py, their undoing, children started, orphaned, adopted and ended), what
the leftover check reads through a mark or a cheaper read equals what a full walk reads now:
child processes, ``sys.modules``, sockets, signal dispositions, flush-denormal (read on floats, against a
tensor), and the whole snapshot. One subprocess (a child subreaper,
as a rank is); budget < 30 s.
"""

# ruff: noqa: E501  (the script below is one change a line)
from __future__ import annotations

import subprocess
import sys

from tests.unit.test_leftovers_process import CHANGES

PROPERTY = r"""
import threading
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

def spawn():
    held.append(subprocess.Popen(["sleep", "30"]))

def orphan():  # a grandchild whose parent exits: adopted by this process once its parent ended
    subprocess.run(["sh", "-c", "sleep 30 & exit 0"], check=True)
    while any(c != "sleep 30" for c in ps._walk_children()[0].values()):
        time.sleep(0.001)  # the adopted fork of sh, until it runs sleep

def end_children():
    for pid in [int(p) for p in ps._walk_children()[0]] + [p.pid for p in held if isinstance(p, subprocess.Popen)]:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    held[:] = [h for h in held if not isinstance(h, subprocess.Popen)]

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
              "import": lambda: __import__("colorsys"), "forget import": lambda: sys.modules.pop("colorsys", None),
              "denormals kept": lambda: torch.set_flush_denormal(False), "nothing": lambda: None})
skipped = [0]

def differences(a, b):  # threads, sockets and children: compared with their walks above
    return [key for key, _ in diff(a, b) if key[0] not in ("threads", "sockets", "children")]

@settings(max_examples=150, deadline=None, database=None)
@given(st.lists(st.sampled_from(sorted(STEPS)), min_size=1, max_size=8))
def sequence(steps):
    try:
        for step in ["nothing", *steps, "nothing"]:
            STEPS[step]()
            quiet = fingerprint.CHILDREN.quiet
            mark = fingerprint.last_pid()
            before = Snapshot.take()  # through the marks
            skipping = quiet is not None and mark == quiet
            walk = ps._walk_children()[0]
            assert ps.children_state() == walk, (step, walk)
            assert before.children == walk or not skipping, (step, walk)
            skipped[0] += skipping
            assert before.modules == dict(sys.modules), (step, before.modules.keys() ^ sys.modules.keys())
            assert ps.modules_state() == dict(sys.modules), step
            assert ps.socket_inodes() == walked_sockets(), step
            signals = ps.signal_state()
            assert signals == walked_signals(), step
            assert all(type(a) is type(b) for a, b in zip(signals.values(), walked_signals().values()))
            after = Snapshot.take()
            assert after.children == ps._walk_children()[0], step
            assert not differences(before, after), (step, differences(before, after))
            # flush-denormal read on plain floats, as a torch kernel reads it
            assert torchstate._flushes_denormals() == (denormal_read() == 0.0), step
    finally:
        end_children()
        for name in sorted(applied):  # back to the start, for the next sequence
            if CHANGES[name][3] is not None:
                undoing(name)()

sequence()
assert skipped[0], "the children mark never let a walk be skipped"
print("ok", skipped[0])
"""


def test_a_read_through_a_mark_equals_the_walk_after_any_change() -> None:
    """Rule: whatever a sequence of generated changes did, the children, ``sys.modules`` and
    signal dispositions read as a snapshot reads them equal a full walk's, and a
    skipped children walk would have found none; the skip happens (the mark is not always
    moved). 150 sequences of up to 8 steps, one subprocess."""
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

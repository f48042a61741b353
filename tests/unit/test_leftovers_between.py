"""Unit, property with real process state: what changes in a warm rank between two tests,
outside both (a hook, a fixture torn down there, a ``__del__``), is named on a line of its own,
put back where it can be, and never credited to either test (rank/between.py).

As tests/unit/test_leftovers_process.py (whose generated changes it reuses), in one subprocess:
for 100 generated subsets of the changes, a first test runs clean, the changes are made after its
end, and a second test starts, runs clean and ends. Budget: < 30 s.
"""

from __future__ import annotations

import subprocess
import sys

from tests.unit.test_leftovers_process import CHANGES

# ruff: noqa: E501  (the body below is a script)

BODY = (
    CHANGES
    + r"""
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

logging.getLogger().setLevel(logging.WARNING)
os.umask(0o022)
os.environ["TZ"] = "UTC"
time.tzset()
os.environ["MASTER_PORT"] = "29400"
between()
print("ok")
"""
)


def test_what_changes_between_two_tests_is_named_apart_and_credited_to_neither() -> None:
    """Rule: after a change made between two tests, the second test's start names it on the
    between line (as kept, where it is kept), the second test is credited with nothing, and
    nothing unchanged is named. 100 generated sets of changes, one subprocess."""
    done = subprocess.run(
        [sys.executable, "-c", BODY], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), (
        done.stdout[-3000:] + done.stderr[-3000:]
    )

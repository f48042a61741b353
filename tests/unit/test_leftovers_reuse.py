"""Unit, property with real process state: a rank's leftover check that takes a test's start
from the last teardown's snapshot (rank/leftovers.py ``LeftoverCheck.start``, ``reuse``) names
and restores exactly what a check taking a snapshot of its own at every start does.

Generated sequences of tests (each a subset of the changes of test_leftovers_process.py, kept
as a rank keeps them: nothing is undone between tests) run twice in one subprocess, with and
without reuse, everything undone in between; a fixture torn down between two tests (its
finalizer) configures a logger there, which neither names on the next test. Budget < 30 s.
"""

# ruff: noqa: E501  (the body below is a script, one change a line)
from __future__ import annotations

import subprocess
import sys

from tests.unit.test_leftovers_process import CHANGES

BODY = CHANGES + r"""
import re, types

FINALIZED = types.SimpleNamespace(scope="module", argname="server")

def run(tests, reuse):
    check = LeftoverCheck(0, "restore", (), ())
    said = []
    for chosen, finalizer in tests:
        if finalizer:  # a wider fixture torn down between two tests, configuring a logger
            check.pytest_fixture_post_finalizer(FINALIZED)
            logging.getLogger("between.tests").setLevel(10 + len(said))
        check.start(None, harness=False, reuse=reuse)
        for name in sorted(chosen):
            CHANGES[name][0]()
        teardown(check)
        words, unfit = check.finish()
        said.append(re.sub(r"\d+", "N", " | ".join([*words, unfit])))
    return said

def undo_all():
    for name in sorted(CHANGES):
        undo = CHANGES[name][3]
        if undo is not None:
            try:
                undo()
            except Exception:
                pass
    for name in list(entered):  # the check may have left it already (restored)
        try:
            leave(name)
        except Exception:
            pass
    logging.getLogger("between.tests").setLevel(logging.NOTSET)
    sys.path[:] = PATH  # inserted once per test that chose it: undone once each above

# Never the ones a fresh snapshot at the start cannot tell from a leftover of the last test
# (each is covered by the single-test property): what is entered and makes the pool go.
SAFE = sorted(set(CHANGES) - ENTERED - {"autocast", "child"})
TESTS = st.lists(st.tuples(st.sets(st.sampled_from(SAFE), max_size=3), st.booleans()), min_size=2, max_size=4)

@settings(max_examples=40, deadline=None, database=None)
@given(TESTS)
def body(tests):
    try:
        fresh = run(tests, reuse=False)
    finally:
        undo_all()
    try:
        reused = run(tests, reuse=True)
    finally:
        undo_all()
    assert reused == fresh, (tests, fresh, reused)
    assert not any("between.tests" in words for words in reused), reused

PATH = list(sys.path)
logging.getLogger().setLevel(logging.WARNING)
os.umask(0o022)
os.environ["TZ"] = "UTC"
time.tzset()
os.environ["MASTER_PORT"] = "29400"
body()
print("ok")
"""


def test_a_start_taken_from_the_last_teardown_names_what_a_fresh_one_does() -> None:
    """Rule: over generated sequences of tests, the words and the verdict of every test are the
    same whether its start is the last teardown's snapshot (nothing restored since) or one of
    its own; a change a fixture's finalizer makes between two tests is named on neither."""
    done = subprocess.run(
        [sys.executable, "-c", BODY], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), (
        done.stdout[-3000:] + done.stderr[-3000:]
    )

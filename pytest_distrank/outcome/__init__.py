"""After the ranks report: one outcome per test, from what the ranks sent.

Runs where a test's outcome is decided: the controller (pool mode) and rank 0 of a launched world
(launcher mode); records and stacks are also read and written in ranks. Pure logic over records,
reports and text: no torch, no processes, so that it is unit-tested without ranks.

- ``records``: what both modes pass around: a test to run, one rank's reports, a warning.
- ``endgame``: when a test is over (the end-of-test rule), and where a rank that did not finish
  was.
- ``merge``: N per-rank reports to one per phase; the rerun line.
- ``reports``: every report made up, for both modes (a crash, a hang, a failed check, an error).
- ``finish``: the end-of-test tail both modes call (merge hook, warnings, rerun line).
- ``checks``: the checks after each test (unmatched collectives, forks) and their crash lines.
- ``collectives``: a hang explained: which collective each rank is in, who is out of step.
- ``frcalls``: a rank's flight records read as its collectives, numbered per group identity.
- ``stacks``: stack dumps, "blocked in ...", log tails, exit statuses and signals in words.
- ``warnings``: the ranks' warnings, each shown once.
- ``childverdict``: ``in_child``'s verdict: what a test's child process came back with.

Import rules (checked by ``tests/unit/test_imports.py``): the standard library, pytest,
:mod:`~pytest_distrank._compat` and this folder; never torch, never a mode.
"""

"""Inside a rank process of either mode: who the rank is, and what it checks around a test.

Runs in pool ranks (:mod:`pytest_distrank.pool.worker`) and in the ranks of a launched world
(:mod:`pytest_distrank.launch`); the reaper also in pool mode's controller, which ends a pool's
processes.

- ``context``: :class:`~context.RankContext`, what the fixtures read; built by either mode; pool
  mode's channel from a rank to its controller during a test.
- ``hygiene``: around a test: what earlier tests left set up, huge output sections, forks a test
  left running (pytest and the standard library).
- ``groupstate``: the rank's process groups after a test: sequence numbers, flight records,
  dispatch modes left entered (torch, imported when called).
- ``reaper``: ending what ranks started: descendants, tagged processes, the subreaper.

What a test calls (checks across ranks, the reference, injected faults) is :mod:`api`.

Import rules (checked by ``tests/unit/test_imports.py``): nothing here imports either mode, nor
:mod:`api` (which runs on this).
"""

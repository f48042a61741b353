"""Pool mode, rank side: the fork server and the rank processes it forks.

- ``entry``: :func:`~entry.rank_main`, the rank process from the fork to ``os._exit``: its log,
  environment, coverage, and ``pytest.main``.
- ``main``: :class:`~main.WorkerPlugin`: the rank's pytest session and its serve loop.
- ``rankproc``: detach from the fork server; the rank's environment; dying with the controller.
- ``rankgroup``: the rank's store and process group.
- ``ranklogs``: cheap log capture.
- ``rankfr``: flight-recorder dumps on request, even inside a collective.
- ``rankgpu``: CUDA memory a test leaves; the gloo fallback's skips.
- ``rankpdb``: pdb whose terminal is the controller's (breakpoint, ``--pdb``, ``--trace``).
- ``rankreruns``: pytest-rerunfailures' verdict on a failure, made where the exception is.
- ``suiterank``, ``suiteclass``: tests of PyTorch's own harness classes, run as it runs them.
- ``harnessenv``: a harness test's environment is its child's (the controller's), not the pool's.
- ``simulate``: a simulated world: the fake group, LocalTensorMode around tests.
- ``preload``: the fork server's last preload: freezes its heap.

Import rules (checked by ``tests/unit/test_imports.py``): nothing here imports pool mode's
controller side or launcher mode; only :mod:`~pytest_distrank.pool.protocol`,
:mod:`~pytest_distrank.pool.workerinput` and :mod:`~pytest_distrank.pool.suites` (both sides) of
pool mode.
"""

"""Planning: what a test needs and what this machine has, decided before any rank process starts.

Runs where tests are planned: the controller (pool mode) and rank 0 of a launched world (launcher
mode, whose decisions every rank follows). Imports no torch at module level: a probe that needs
torch imports it when called.

- ``spec``: the markers of a test -> its :class:`~spec.DistSpec` (``meshes``: meshes, backend
  tuples and simulated worlds as test ids); ``plan``: :func:`~plan.plan_item`, one test's spec,
  deadline, error or skip, the same in both modes (each adds its own part).
- ``capabilities``: backends built in, visible GPUs, the NCCL version, the process limit -> skip
  reasons; ordinary tests that ask for a rank fixture; the test seams
  (``DISTRANK_FAKE_GPU_COUNT``).
- ``gpuplan``: which GPU each rank gets: one each, shared (opt-in), or a skip that says why
  (``DISTRANK_FAKE_NCCL_VERSION``).
- ``tiers``: how many GPUs a test needs, from its markers and the options only, for
  ``--distrank-gpus``; ``tierselect``: the collection hook that keeps one tier's tests.

Import rules (checked by ``tests/unit/test_imports.py``): nothing here imports either mode
(:mod:`pytest_distrank.pool`, :mod:`pytest_distrank.launch`), ``rank/``, ``api/``, the fixtures
or torch at module level; a mode hands planning what it reads of those (the rank fixtures a
test uses).
"""

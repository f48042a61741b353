"""Pool mode: the pytest process keeps warm pools of rank processes forked from a fork server.

The processes of pool mode and the modules that run in each:

- **The controller** (the pytest process the user started), in three rooms, lowest first:
  ``onetest/`` (one test on one pool: ``attempt``, ``exits``, ``deadlock``, ``probes``,
  ``debugrelay``, ``interrupts``; it reaches the ranks only through the ``ranks.Ranks``
  protocol and returns its verdict for the pool to apply), ``pools/`` (the pools: ``poolset``,
  ``pool``, ``poolkey``, ``stats``, ``forkserver``, ``preloads``, ``cmdline``, ``gpus``,
  ``lockfolder``, ``gpumemory``), and the session here on top (``controller``, ``earlystart``,
  ``plan``, ``crossize``, ``replay``, ``replaysearch``, ``freshretry``, ``repro``,
  ``ownreports``, ``simreport``, ``reruns``, ``terminal``). A room imports only the rooms below.
- **The fork server and the ranks** it forks: the package :mod:`~pytest_distrank.pool.worker`
  (the rank's pytest session and serve loop, its process, group, logs, GPU, debugger, harness
  classes, simulated worlds; the fork server's heap freeze).
- **Both**: ``protocol``, the typed messages between them (standard library only),
  ``workerinput`` (plugins' configure-time values, as pytest-xdist hands them to its workers, and
  the options a rank owns, set after it parsed the controller's command line) and
  ``suites`` (which classes of PyTorch's own harness run on pools: the controller and the ranks
  collect alike).

Import rules (checked by ``tests/unit/test_imports.py``): nothing here imports launcher mode
(:mod:`pytest_distrank.launch`); the controller's rooms import only the rooms below; the rank
side (``worker/``) imports none of the controller-side modules, and the modules of both sides
import neither side; the shared folders import nothing from here except the plugin's gate,
lazily.
"""

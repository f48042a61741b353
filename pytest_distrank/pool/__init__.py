"""Pool mode: the pytest process keeps warm pools of rank processes forked from a fork server.

The processes of pool mode and the modules that run in each:

- **The controller** (the pytest process the user started), the modules here: ``controller``
  (the pytest hooks: plan, dispatch, rerun loop, replay of merged reports), ``poolset`` (pools by
  key, the fork server), ``stats`` (the numbers of the summary and ``DISTRANK_STATS_FILE``),
  ``forkserver`` (its socket folder and its end), ``preloads`` (what it
  imports), ``pool`` (one pool: start, run one test, stop), ``poolkey`` (what makes pools
  incompatible), ``attempt`` (one test on one pool: its evidence and its end), ``probes`` (a
  rank's stacks and flight records, asked by signal), ``ownreports`` (reports it builds itself),
  ``simreport`` (a simulated test's reports), ``plan`` (what each test needs before anything
  runs), ``crossize`` (fixtures at another world size), ``deadlock`` (a proven deadlock ends
  early), ``interrupts`` (signals, ``--session-timeout``), ``exits`` (expected deaths, injected
  faults), ``replay`` and ``repro`` (order-dependent failures; the rerun command), ``freshretry`` (a
  harness test that failed in a warm pool runs again on fresh ranks), ``reruns``
  (pytest-rerunfailures, all ranks as one), ``cmdline`` (a rank's pytest command line and
  coverage settings), ``gpus``, ``lockfolder`` and ``gpumemory`` (GPU leases), ``debugrelay``
  (the terminal lent to a rank's debugger) and ``terminal`` (header and summary lines).
- **The fork server and the ranks** it forks: the package :mod:`~pytest_distrank.pool.worker`
  (the rank's pytest session and serve loop, its process, group, logs, GPU, debugger, harness
  classes, simulated worlds; the fork server's heap freeze).
- **Both**: ``protocol``, the typed messages between them (standard library only),
  ``workerinput`` (plugins' configure-time values, as pytest-xdist hands them to its workers, and
  the options a rank owns, set after it parsed the controller's command line) and
  ``suites`` (which classes of PyTorch's own harness run on pools: the controller and the ranks
  collect alike).

Import rules (checked by ``tests/unit/test_imports.py``): nothing here imports launcher mode
(:mod:`pytest_distrank.launch`); the rank side (``worker/``) imports none of the controller-side
modules, and the modules of both sides import neither side; the shared folders import nothing
from here except the plugin's gate, lazily.
"""

"""Launcher mode: under torchrun, srun or mpirun, each pytest process is one rank.

Every rank collects the same tests and runs them in the same order (tests of a smaller world size
on sub-worlds, several at once); rank 0 gathers each test's reports from its peers through a
control store, merges them and is the only one to print.

- ``plugin``: :class:`~plugin.LaunchPlugin`, the pytest hooks, delegating to the objects below.
- ``env``: the launcher's environment read into a :class:`~env.Launch`; the rerun command.
- ``keys``: the wire protocol: the control store's keys (a function each) and payloads
  (a ``TypedDict`` each), with who writes them, and each payload's reader (every key checked).
- ``channel``: the control store connection: short operations, heartbeats, waiting for keys.
- ``auth``: the run's secret (never from the store) and the MAC every payload carries;
  ``tamper``: rank 0's notes of payloads that did not verify, which fail their test.
- ``session``: :class:`~session.RankSession`, the rank's own state: channel, run id, folders,
  log, forks, the exit together, a lost channel; and which thread owns which field.
- ``plan``: the collection exchange and rank 0's step for each test.
- ``subworld``: sub-worlds of a smaller world size: placement, packing into batches that run at
  once, a rank named in both numberings (pure); ``subrun``: running a batch, and rank 0
  reporting each of its tests.
- ``group``: :class:`~group.GroupKeeper`, the rank's process group, re-created when needed, and
  the collective counts that say whether the ranks stayed in step.
- ``current``: the running test (:class:`~current.Current`), which every module below reads.
- ``early``: while a test runs, a rank's early failure or ended session, and rank 0's polls for
  them and for last reports waiting; a payload credited only to its rank's own process.
- ``gather``: rank 0 collecting a test's reports (the end of a test:
  :mod:`~pytest_distrank.outcome.endgame`), the ranks that did not finish among them.
- ``report``: launcher-mode synthesized reports, from plain values.
- ``terminal``: the header and summary lines.
- ``gaveup``: the ranks that left on a silent rank 0 say why; rank 0, on waking, reports it.
- ``watchdog``: the thread that keeps every wait bounded, given the session and two callbacks.

Import rules (checked by ``tests/unit/test_imports.py``): nothing here imports pool mode
(:mod:`pytest_distrank.pool`); the shared folders (the top level, ``planning/``, ``rank/``,
``outcome/``) import nothing from here except the plugin's gate, lazily.
"""

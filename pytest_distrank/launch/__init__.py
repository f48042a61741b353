"""Launcher mode: under torchrun, srun or mpirun, each pytest process is one rank.

Every rank collects the same tests and runs them in the same order; rank 0 gathers each test's
reports from its peers through a control store, merges them and is the only one to print.

- ``plugin``: the pytest hooks (:class:`~plugin.LaunchPlugin`), delegating to the modules below.
- ``env``: the launcher's environment read into a :class:`~env.Launch`; the rerun command.
- ``keys``: the control store's keys and payloads, one function per key, typed.
- ``channel``: the control store connection: short operations, heartbeats, waiting for keys.
- ``life``: the rank's session: run id, folders, quiet ranks, leaving together, a lost channel.
- ``plan``: the collection exchange and rank 0's step for each test.
- ``rank``: one rank's part of a test: its group, its reports, leaving a forked child.
- ``gather``: rank 0 collecting one test's reports (the end of a test: :mod:`endgame`).
- ``report``: launcher-mode wording of synthesized reports.
- ``watchdog``: the thread that notices a stuck test, a dead peer or a lost channel.

Import rules (checked by ``tests/test_imports.py``): nothing here imports pool mode
(:mod:`pytest_distrank.pool`); the package's top-level modules import nothing from here except
the plugin's gate, lazily.
"""

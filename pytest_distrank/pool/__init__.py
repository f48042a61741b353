"""Pool mode: the pytest process keeps warm pools of rank processes forked from a fork server.

The processes of pool mode and the modules that run in each:

- **The controller** (the pytest process the user started): ``controller`` (the pytest hooks:
  plan, dispatch, rerun loop, replay of merged reports), ``poolset`` (pools by key, the fork
  server), ``pool`` (one pool: start, run one test, stop), ``attempt`` (one test on one pool: its
  evidence and its end), ``rankargs`` (a rank's pytest command line), ``gpus`` (GPU leases),
  ``preloads`` (what the fork server imports) and ``terminal`` (header and summary lines).
- **The fork server**: imports torch and pytest once, then ``preload`` freezes its heap.
- **The ranks** (forked from the fork server): ``worker`` (the rank's pytest session and its serve
  loop), ``rankgroup`` (the rank's store and process group), ``ranklogs`` (log capture),
  ``suiterank`` (tests of PyTorch's own harness classes), ``rankfr`` (flight-recorder dumps on
  request).
- **Both**: ``protocol``, the typed messages between them (standard library only), and
  ``workerinput`` (plugins' configure-time values, as pytest-xdist hands them to its workers).

Import rules (checked by ``tests/unit/test_imports.py``): nothing here imports launcher mode
(:mod:`pytest_distrank.launch`); the rank-side modules import none of the controller-side ones;
the package's top-level modules import nothing from here except the plugin's gate, lazily.
"""

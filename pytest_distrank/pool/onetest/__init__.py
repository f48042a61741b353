"""Pool mode, controller side: one test on one pool (the lowest of the controller's rooms).

``ranks`` (a rank process's handle, and the ``Ranks`` protocol a pool implements), ``attempt`` (the
test's evidence and its end: it returns its verdict, which ``pools.pool.Pool.run`` applies),
``crashes`` (the reports of ranks that died or sent what is not theirs), ``exits`` (expected deaths
and injected faults), ``deadlock`` (a proven deadlock ends the test early), ``probes`` (a rank's
stacks and flight records, by signal), ``debugrelay`` (the terminal lent to a rank's debugger),
``interrupts`` (signals and ``--session-timeout``). Nothing here imports ``pools/`` or the session's
modules (``tests/unit/test_imports.py``).
"""

"""What a user's test calls inside its ranks, and may rely on: changing it changes users' tests.

Runs in rank processes of both modes, inside a test; torch is imported only when a function
runs. Documented in ``docs/reference.md``, ``docs/parity.md`` and ``docs/fault-tolerance.md``;
exported by :mod:`pytest_distrank` (the ``faults`` fixture's object by :mod:`fixtures`).

- ``parity``: ``assert_equal_across_ranks``, ``assert_close_across_ranks``,
  ``assert_differs_across_ranks``; what a value's leaves are (``parityleaves``), the rule leaf
  by leaf (``paritydata``), the ranks of a check, their exchanges and the failure's words
  (``paritycalls``).
- ``reference``: ``reference()``, ``rank_inputs()``, ``assert_close_to_reference()``.
- ``faults``: the ``faults`` fixture's object and its dispatch mode; ``faultplan``, its pure part.

Import rules (checked by ``tests/unit/test_imports.py``): only the package's ``__init__`` and
``fixtures`` import ``api/``; ``api/`` imports the standard library, pytest, ``_compat``,
``settings``, ``outcome/``, ``rank/`` (the per-rank plumbing it runs on) and itself: no mode, no
``planning/``, none of the other top-level modules.
"""

"""What a user's test calls inside its ranks, and may rely on: changing it changes users' tests.

Runs in rank processes of both modes, inside a test. Documented in ``docs/reference.md``,
``docs/parity.md``, ``docs/fault-tolerance.md``; exported by :mod:`pytest_distrank` (the
``faults`` fixture's object by :mod:`fixtures`). ``parity`` (checks across ranks: a value's
leaves ``parityleaves``, the rule ``paritydata``, the ranks and words ``paritycalls``),
``reference``, ``faults`` (its pure part ``faultplan``), ``children`` (``in_child``: a test run
in a child process; ``childproc`` its process, ``childmain`` the child; it also runs in the
pytest process, for ordinary tests).

Import rules (``tests/unit/test_imports.py``): only the package's ``__init__`` and ``fixtures``
import ``api/``; it imports ``rank/``, ``outcome/``, ``_compat``, ``settings`` and itself.
"""

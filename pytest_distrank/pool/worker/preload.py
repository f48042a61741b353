"""Last module the fork server preloads: numpy's random module, then freeze its heap.

Runs in the fork server process only (imported once, through the preload list). Every rank seeds
numpy's global random state at the start of each test where numpy is imported
(:mod:`rank.seeding`), and numpy imports ``numpy.random`` on first use: a tenth of a second of
CPU in every rank's first test, seconds on a loaded machine (a peer waiting for that rank in a
collective then waits as long). Imported here, it costs every rank nothing. After torch and
pytest are imported, ``gc.freeze()`` moves every object into the permanent generation: the ranks
forked from here never scan (and so never copy-on-write) those pages during garbage collection,
and the fork server's own exit skips the ~0.5 s final collection over torch's objects.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import sys

if "numpy" in sys.modules:  # torch imported it: the ranks will seed it
    with contextlib.suppress(Exception):
        importlib.import_module("numpy.random")

gc.freeze()

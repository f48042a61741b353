"""Last module the fork server preloads: freeze its heap.

Runs in the fork server process only (imported once, through the preload list). After torch and
pytest are imported, ``gc.freeze()`` moves every object into the permanent generation: the ranks
forked from here never scan (and so never copy-on-write) those pages during garbage collection,
and the fork server's own exit skips the ~0.5 s final collection over torch's objects.
"""

from __future__ import annotations

import gc

gc.freeze()

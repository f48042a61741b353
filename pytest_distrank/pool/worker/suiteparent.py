"""Inside a pool rank: the part of a ``MultiProcessTestCase`` test that its harness's parent does,
once for all ranks, as the harness hands it to its children.

Runs in pool-mode rank processes (:mod:`suiterank` calls it around the class's ``setUp`` and
``tearDown``). The harness runs ``setUp`` once, in the parent, and its children inherit what it
set: ``TestDistBackend.setUp`` (PyTorch's ``DistributedTest`` suite) makes a temporary folder and
hands it over in ``TEMP_DIR``, where the suite's file barrier meets. Every rank runs ``setUp``
here (the instance state it fills is every rank's: ``skip_return_code_checks``, the harness's
return-code rules), and then takes the environment that rank 0's ``setUp`` wrote, as a child
inherits its parent's: one folder, one barrier. The parent's ``tearDown`` removes that folder
after every child exited; here rank 0 waits for every rank to finish the test before its own
``tearDown`` (bounded: a rank that died is the controller's to report).

The ranks meet through the pool's store, under the test's own prefix.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from datetime import timedelta

from ...rank.context import RankContext
from ...rank.leftovers import HARNESS_ENV

#: Store keys, under the test's prefix (RankContext.test_store).
ENV_KEY = "harness-parent-env"
RAN_KEY = "harness-ran"
ALL_RAN_KEY = "harness-all-ran"
#: How long a rank waits for rank 0's setUp, and rank 0 for the others to finish the test.
PEER_WAIT = 60.0


class ParentEnv:
    """The environment the parent's ``setUp`` set, as every rank of the test sees it."""

    def __init__(self, ctx: RankContext) -> None:
        self.ctx = ctx
        self.store = ctx.test_store()
        #: What rank 0's setUp set or unset (None: unset); {}: nothing to hand over.
        self.changed: dict[str, str | None] = {}

    @contextlib.contextmanager
    def setup(self) -> Iterator[None]:
        """Around the class's ``setUp`` on this rank; afterwards, rank 0's environment."""
        before = dict(os.environ)
        try:
            yield
        finally:
            if self.ctx.rank == 0:  # published even if setUp failed: the peers never wait long
                changed = {
                    name: os.environ.get(name)
                    for name in set(before) | set(os.environ)
                    if before.get(name) != os.environ.get(name) and name not in HARNESS_ENV
                }
                self.store.set(ENV_KEY, json.dumps(changed))
                self.changed = changed
        if self.ctx.rank != 0:
            self._take()

    def _take(self) -> None:
        try:
            self.store.wait([ENV_KEY], timedelta(seconds=PEER_WAIT))
        except Exception:
            raise RuntimeError(
                f"rank {self.ctx.rank} waited {PEER_WAIT:g} s for rank 0 to run the test "
                "class's setUp (the harness's parent part, whose environment every rank "
                "takes); rank 0 is stuck or gone"
            ) from None
        self.changed = json.loads(self.store.get(ENV_KEY))
        for name, value in self.changed.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    def finished(self) -> None:
        """After the test's run on this rank, before ``tearDown``: rank 0's ``tearDown`` (which
        removes what ``setUp`` made for every rank) waits for the others to finish."""
        if not self.changed:
            return
        with contextlib.suppress(Exception):
            if self.store.add(RAN_KEY, 1) >= self.ctx.world_size:
                self.store.set(ALL_RAN_KEY, "1")
            if self.ctx.rank == 0:
                self.store.wait([ALL_RAN_KEY], timedelta(seconds=PEER_WAIT))

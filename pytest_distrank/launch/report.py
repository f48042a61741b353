"""Launcher mode's own words: what it did after a failed check, and why no test could run.

Runs in rank 0's pytest process of a launched world (main thread, or its watchdog thread). Pure
logic over text. Every report launcher mode makes up is built by :mod:`outcome.reports`, as pool
mode's are, with this mode's words passed in (:data:`FRESH_GROUP`, :data:`SESSION_ENDED`); this
module also words why the ranks cannot run in lock-step (a collection mismatch, ranks that never
sent their collection).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

#: What follows a check's failure in launcher mode (pool mode replaces the pool instead).
FRESH_GROUP = (
    "Every rank's process group was created anew before the next test, so that it does not "
    "inherit the damage."
)
#: What follows a rank's ``pytest.exit()`` or ``KeyboardInterrupt`` in launcher mode.
SESSION_ENDED = (
    "Its pytest session ended, so the launched world cannot run the remaining tests. "
    "pytest.fail() or pytest.skip() end only the test; pytest.exit() and KeyboardInterrupt end "
    "the rank's whole session."
)

#: At most this many node ids of each kind are listed in a collection mismatch.
SHOWN_NODEIDS = 5


def _shown(nodeids: Sequence[str]) -> str:
    listed = ", ".join(nodeids[:SHOWN_NODEIDS])
    more = len(nodeids) - SHOWN_NODEIDS
    return listed + (f" (and {more} more)" if more > 0 else "")


def collection_mismatch(collected: Mapping[int, Sequence[str]], who: str) -> str | None:
    """Why the ranks cannot run in lock-step, naming the ranks and node ids; None if they can.

    ``collected`` maps each rank to its ordered node ids; ``who`` says which world, e.g.
    ``2 ranks, torchrun``.
    """
    reference = list(collected[0])
    differing = [r for r in sorted(collected) if list(collected[r]) != reference]
    if not differing:
        return None
    ranks = ", ".join(str(r) for r in differing)
    lines = [
        f"pytest-distrank: the ranks of this launched world ({who}) collected different tests, "
        f"so they cannot run them in lock-step; no test was run.",
        f"Rank 0 collected {len(reference)} tests; rank(s) {ranks} collected others:",
    ]
    known = set(reference)
    for rank in differing:
        mine = list(collected[rank])
        extra = [n for n in mine if n not in known]
        mine_set = set(mine)
        lacking = [n for n in reference if n not in mine_set]
        if not extra and not lacking:
            at = next(i for i, (a, b) in enumerate(zip(mine, reference, strict=True)) if a != b)
            lines.append(
                f"  rank {rank}: the same tests in another order; at position {at} it has "
                f"{mine[at]} where rank 0 has {reference[at]}"
            )
            continue
        parts = []
        if extra:
            parts.append(f"{len(extra)} that rank 0 lacks: {_shown(extra)}")
        if lacking:
            parts.append(f"not {len(lacking)} of rank 0's: {_shown(lacking)}")
        count = f"{len(mine)} test" + ("" if len(mine) == 1 else "s")
        lines.append(f"  rank {rank}: {count}; " + "; ".join(parts))
    lines.append(
        "Typical causes: a conftest.py or collection hook that depends on RANK or LOCAL_RANK; "
        "different files on different nodes; command-line arguments (-k, -m, paths) that "
        "differ between ranks; a random test order with a different seed per rank."
    )
    lines.append("Make every rank collect the same tests in the same order, then run again.")
    return "\n".join(lines)


def missing_collection(missing: Sequence[int], seconds: float) -> str:
    """Why no test runs when ``missing`` ranks never sent their collection (nor so their log's
    path: the launcher's output is where to look)."""
    ranks = ", ".join(str(r) for r in missing)
    return (
        f"pytest-distrank: rank(s) {ranks} did not report their collected tests within "
        f"{seconds:.0f} s, so no test was run. They may have failed before collecting (a "
        "conftest.py or plugin that fails only there, an import error): see their output in the "
        "launcher's log."
    )

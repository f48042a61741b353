"""The session seed (``--distrank-seed``) and the order of tests (``--distrank-order``).

Runs where tests are planned: pool mode's controller (and each pytest-xdist worker's, which takes
the seed its xdist controller picked), and every rank of a launched world (which agree on the
seed through the run id rank 0 makes, see ``launch/plugin.py``). Imports no torch.

The session seed is settled once, before collection: ``random`` picks one, printed in the header
so that ``--distrank-seed=N`` repeats the session; every rank's random state at the start of each
test derives from it (``rank/seeding.py``), and so does ``--distrank-order=random``.

The order reorders tests within each module, never across modules: modules keep their order, and
the tests of one class stay together (the classes are reordered, and the tests inside each), so
module- and class-scoped fixtures are set up once, as in collected order. Units are compared by
a hash of the seed and their node id, so one added test does not reshuffle the others.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from ..options import ORDER, SEED
from ..parsing import RANDOM_SEED, pick_seed
from ..settings import Value

T = TypeVar("T")

#: The key under which pytest-xdist's controller hands its session seed to its workers
#: (``node.workerinput``; workers read ``config.workerinput``).
WORKERINPUT_KEY = "distrank_seed"


def session_seed(
    setting: Value[int | str | None],
    workerinput: Mapping[str, Any] | None = None,
    pick: Callable[[], int] = pick_seed,
) -> Value[int | None]:
    """The session seed: the one an xdist controller sent (``workerinput``), else N as given,
    None for ``off``, or a new one for ``random`` (``pick``), each with where it came from."""
    if workerinput is not None and WORKERINPUT_KEY in workerinput:
        sent = workerinput[WORKERINPUT_KEY]
        return Value(
            None if sent is None else int(sent), f"{setting.source}, from xdist's controller"
        )
    if setting.value == RANDOM_SEED:
        where = "" if setting.source == "default" else f", {setting.source}"
        return Value(pick(), f"picked at random{where}")
    assert setting.value is None or isinstance(setting.value, int)
    return Value(setting.value, setting.source)


def order_seed(order: Value[tuple[str, int | None]], seed: Value[int | None]) -> int | None:
    """The seed of a ``random`` order: its own (``random:N``) or the session's; None for the
    other orders. ``random`` with ``--distrank-seed=off`` is refused (nothing to repeat it by).
    """
    name, own = order.value
    if name != "random":
        return None
    if own is not None:
        return own
    if seed.value is None:
        raise ValueError(
            f"{ORDER.flag}=random takes the session seed, which is off ({SEED.flag}=off, "
            f"from {seed.source}); give the order a seed of its own: {ORDER.flag}=random:N"
        )
    return seed.value


def describe_seed(seed: int | None) -> str:
    """The seed in the header: ``seed 1234 (--distrank-seed to repeat)`` or ``seed off``."""
    return "seed off" if seed is None else f"seed {seed} ({SEED.flag} to repeat)"


def describe_order(order: Value[tuple[str, int | None]], seed: int | None) -> str:
    """The order in the header: ``order reverse``, ``order random:1234``; "" for collected."""
    name, _ = order.value
    if name == "collected":
        return ""
    return f"order {name}:{seed}" if name == "random" else f"order {name}"


def _parts(nodeid: str) -> list[str]:
    """A node id's parts (file, classes, function): ``::`` inside a parameter id is kept."""
    head, bracket, params = nodeid.partition("[")
    parts = head.split("::")
    parts[-1] += bracket + params
    return parts


def _rank(seed: int, key: str) -> bytes:
    return hashlib.blake2b(f"{seed}\0{key}".encode(errors="surrogatepass"), digest_size=8).digest()


def reorder(
    items: Sequence[T], nodeid: Callable[[T], str], order: str, seed: int | None = None
) -> list[T]:
    """``items`` in ``order`` (``collected``, ``reverse`` or ``random`` with ``seed``) within
    each module: runs of items of one module keep their places, and below, the runs of one class
    are units whose places change and whose tests are reordered in turn."""
    if order == "collected":
        return list(items)
    parts = [_parts(nodeid(item)) for item in items]
    indices = _arrange(list(range(len(items))), parts, 0, order, seed)
    return [items[i] for i in indices]


def _is_leaf(parts: list[list[str]], i: int, depth: int) -> bool:
    return depth >= len(parts[i]) - 1


def _runs(indices: list[int], parts: list[list[str]], depth: int) -> list[tuple[str, list[int]]]:
    """``indices`` cut into runs that share the node id's part at ``depth``; a test (a leaf at
    this depth) is a run of its own."""
    runs: list[tuple[str, list[int]]] = []
    for i in indices:
        key = "::".join(parts[i][: depth + 1])
        last = runs[-1] if runs else None
        if (
            last is not None
            and last[0] == key
            and not _is_leaf(parts, i, depth)
            and not _is_leaf(parts, last[1][0], depth)
        ):
            last[1].append(i)
        else:
            runs.append((key, [i]))
    return runs


def _arrange(
    indices: list[int], parts: list[list[str]], depth: int, order: str, seed: int | None
) -> list[int]:
    runs = _runs(indices, parts, depth)
    if depth > 0:  # below the module: the units' places change
        if order == "reverse":
            runs.reverse()
        else:
            runs.sort(key=lambda run: _rank(seed or 0, run[0]))
    arranged: list[int] = []
    for _, members in runs:
        if _is_leaf(parts, members[0], depth):
            arranged.extend(members)
        else:
            arranged.extend(_arrange(members, parts, depth + 1, order, seed))
    return arranged

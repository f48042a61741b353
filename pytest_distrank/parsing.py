"""Parsers of the plugin's option values: each turns a text into a value or raises ValueError.

Runs in every pytest process of both modes (imported by :mod:`settings` and by what parses a
marker's or a size's text). The error message is the part after "expected"; :mod:`settings` adds
the option, the value and where it came from.
"""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
from collections.abc import Callable

BACKENDS = ("gloo", "nccl", "mpi", "ucc", "xccl")
START_METHODS = ("forkserver", "forkserver-late", "spawn")
#: The start methods whose ranks fork from a fork server.
FORKSERVERS = START_METHODS[:2]


def parse_positive_int(text: str) -> int:
    """A world size: a positive integer, spelled in decimal."""
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError("expected a positive integer") from None
    if value < 1:
        raise ValueError("expected a positive integer")
    return value


def parse_seconds(text: str) -> float:
    """A duration in seconds; ``0`` means no limit."""
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError("expected a number of seconds (0 for none)") from None
    if value < 0 or value != value:
        raise ValueError("expected a number of seconds >= 0 (0 for none)")
    return value


def parse_backend(text: str) -> str:
    """A ``torch.distributed`` backend name, or a ``device:backend,...`` mapping."""
    value = text.strip()
    parts = [p.split(":", 1)[-1] for p in value.split(",")] if ":" in value else [value]
    unknown = [p for p in parts if p not in BACKENDS]
    if unknown or not value:
        raise ValueError(f"expected one of {', '.join(BACKENDS)}")
    return value


def one_of(choices: tuple[str, ...], lower: bool = False) -> Callable[[str], str]:
    """A parser that accepts one of ``choices`` (case-insensitive with ``lower``)."""

    def parse(text: str) -> str:
        value = text.strip().lower() if lower else text.strip()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value

    return parse


parse_start_method = one_of(START_METHODS)


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20}
_UNITS["gib"] = 2**30


def parse_bytes(text: str) -> int:
    """A size: ``512MiB``, ``1GiB``, ``2GB``, a number of bytes; ``0`` for none."""
    found = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = found.group(2).lower() if found else ""
    if found is None or unit not in _UNITS:
        raise ValueError("expected a size such as 512MiB, 1GiB or 0 (for none)")
    return int(float(found.group(1)) * _UNITS[unit])


def size_words(n: int) -> str:
    """Bytes in words: ``64 MiB``, ``1.5 GiB``."""
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n} bytes"


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected true or false")


def parse_modules(text: str) -> tuple[str, ...]:
    """Comma-separated dotted module names, e.g. ``torch._dynamo,mypkg.models``."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    for name in names:
        if not all(piece.isidentifier() for piece in name.split(".")):
            raise ValueError(f"{name!r} is not a module name; expected e.g. torch._dynamo,mypkg")
    return names


def parse_path(text: str) -> str:
    """A folder; ``~`` is expanded. Empty means the default."""
    value = os.path.expanduser(text.strip())
    if not value:
        raise ValueError("expected a folder path")
    return value


def file_safe(name: str) -> str:
    """A test's name as part of a folder name (both modes' shared folder of a test): each run of
    characters other than letters, digits, ``_.-`` becomes ``_``; at most 60 characters."""
    return re.sub(r"[^\w.-]+", "_", name)[:60]


def parse_rank(text: str) -> int | None:
    """A rank number (>= 0); empty for none."""
    value = text.strip()
    if not value:
        return None
    try:
        rank = int(value)
    except ValueError:
        raise ValueError("expected a rank number (0, 1, ...)") from None
    if rank < 0:
        raise ValueError("expected a rank number (0, 1, ...)")
    return rank


#: ``--distrank-seed``'s value that picks a new session seed (printed in the header).
RANDOM_SEED = "random"
#: The largest session seed: it fits numpy's 32-bit seeds and reads back from the header.
MAX_SEED = 2**32 - 1


def parse_seed(text: str) -> int | str | None:
    """A session seed (0 to 2**32-1), ``random`` (a new one, printed) or ``off`` (None)."""
    value = text.strip().lower()
    if value == RANDOM_SEED:
        return RANDOM_SEED
    if value == "off":
        return None
    try:
        seed = int(value)
    except ValueError:
        raise ValueError(f"expected a seed (0 to {MAX_SEED}), random or off") from None
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"expected a seed (0 to {MAX_SEED}), random or off")
    return seed


def pick_seed() -> int:
    """A new session seed for ``--distrank-seed=random`` (0 to :data:`MAX_SEED`)."""
    return secrets.randbelow(MAX_SEED + 1)


ORDERS = ("collected", "reverse", "random")


def parse_order(text: str) -> tuple[str, int | None]:
    """``collected``, ``reverse``, ``random`` or ``random:SEED``: (the order, its seed or None;
    None for random means the session seed)."""
    name, _, raw_seed = text.strip().lower().partition(":")
    expected = "expected collected, reverse, random or random:SEED (a non-negative integer)"
    if name not in ORDERS or (raw_seed and name != "random"):
        raise ValueError(expected)
    if not raw_seed:
        return name, None
    try:
        seed = int(raw_seed)
    except ValueError:
        raise ValueError(expected) from None
    if seed < 0:
        raise ValueError(expected)
    return name, seed


#: ``--distrank-gpus``'s value that keeps every test (no tier).
ALL_TIERS = "all"
_TIER_FORMS = "N, A-B, >=N (or N+), <=N, or all; e.g. 0, 1-2, >=4"


@dataclasses.dataclass(frozen=True)
class GpuRange:
    """A GPU tier: the tests that need ``low`` to ``high`` GPUs (``high`` None: no bound)."""

    low: int
    high: int | None
    #: The tier as the user wrote it.
    text: str

    def __contains__(self, gpus: object) -> bool:
        if not isinstance(gpus, int):
            return False
        return self.low <= gpus and (self.high is None or gpus <= self.high)

    def describe(self) -> str:
        """``0 GPUs``, ``1 GPU``, ``1 to 2 GPUs``, ``4 GPUs or more``."""
        if self.high is None:
            return f"{self.low} GPU{'' if self.low == 1 else 's'} or more"
        if self.low == self.high:
            return f"{self.low} GPU{'' if self.low == 1 else 's'}"
        return f"{self.low} to {self.high} GPUs"


def _count(text: str) -> int:
    if not re.fullmatch(r"[0-9]+", text):
        raise ValueError(f"expected a GPU tier: {_TIER_FORMS}")
    return int(text)


def parse_gpu_range(text: str) -> GpuRange | None:
    """A GPU tier: ``N``, ``A-B``, ``>=N`` or ``N+``, ``>N``, ``<=N``, ``<N``; ``all`` (None)
    keeps every test. An empty text or range selects nothing and is refused."""
    value = re.sub(r"\s+", "", text)
    if value.lower() == ALL_TIERS:
        return None
    if not value:
        raise ValueError(
            f"an empty tier selects no test; expected a GPU tier: {_TIER_FORMS} (in a shell, an "
            "unquoted >=4 is a redirection: quote it, '>=4', or write 4+)"
        )
    if value.endswith("+"):
        return GpuRange(_count(value[:-1]), None, value)
    for op in (">=", "<=", ">", "<"):
        if value.startswith(op):
            n = _count(value[len(op) :])
            if op == ">=":
                return GpuRange(n, None, value)
            if op == ">":
                return GpuRange(n + 1, None, value)
            high = n if op == "<=" else n - 1
            if high < 0:
                raise ValueError(f"{value} is an empty tier: no test needs fewer than 0 GPUs")
            return GpuRange(0, high, value)
    low, dash, high_text = value.partition("-")
    if not dash:
        n = _count(value)
        return GpuRange(n, n, value)
    a, b = _count(low), _count(high_text)
    if a > b:
        raise ValueError(
            f"{value} is an empty tier: no test needs {a} or more GPUs and {b} or fewer; "
            f"write it low-high, e.g. {b}-{a}"
        )
    return GpuRange(a, b, value)

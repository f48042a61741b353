"""torch's process-wide defaults and flags, as a rank's leftover checks read, restore and name them.

Runs in pool-mode rank processes (:mod:`rank.leftovers` reads these before and after every test).
torch is imported only where a function runs, and only once the rank has imported it.
"""

from __future__ import annotations

import functools
from typing import Any

#: ``torch.backends`` flags read and restored by attribute path, where this torch has them.
BACKEND_FLAGS = (
    "backends.fp32_precision",
    "backends.cuda.matmul.fp32_precision",
    "backends.cudnn.fp32_precision",
    "backends.cudnn.conv.fp32_precision",
    "backends.cudnn.rnn.fp32_precision",
    "backends.mkldnn.fp32_precision",
    "backends.cudnn.enabled",
    "backends.cudnn.benchmark",
    "backends.cudnn.deterministic",
    "backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
    "backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
)
#: ``torch.get_float32_matmul_precision()`` once a test mixed the legacy and new precision APIs.
MIXED = "(mixed legacy and new precision settings)"


def _path_get(root: Any, path: str) -> Any:
    return functools.reduce(getattr, path.split("."), root)


def _path_set(root: Any, path: str, value: Any) -> None:
    owner, _, name = path.rpartition(".")
    setattr(_path_get(root, owner), name, value)


def _matmul_precision(torch: Any) -> str:
    try:
        return str(torch.get_float32_matmul_precision())
    except RuntimeError:
        return MIXED


def torch_flags() -> dict[str, Any]:
    """torch's process-wide defaults and flags, in the order they are restored (the precision
    before the flags it sets); {} when the rank never imported torch."""
    import sys

    torch: Any = sys.modules.get("torch")
    if torch is None:
        return {}
    flags: dict[str, Any] = {
        "default dtype": torch.get_default_dtype(),
        "default device": str(torch.get_default_device()),
        "grad mode": torch.is_grad_enabled(),
        "deterministic algorithms": (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        ),
        "torch threads": torch.get_num_threads(),
        "float32 matmul precision": _matmul_precision(torch),
    }
    for name, owner, attribute in _backend_flags(torch):
        try:
            flags[name] = getattr(owner, attribute)
        except (AttributeError, RuntimeError):
            continue
    return flags


@functools.cache
def _backend_flags(torch: Any) -> tuple[tuple[str, Any, str], ...]:
    """(name, the object that holds it, attribute) of each of :data:`BACKEND_FLAGS` this torch
    has, looked up once: a read is then one ``getattr`` (~0.5 us)."""
    found = []
    for path in BACKEND_FLAGS:
        owner_path, _, attribute = path.rpartition(".")
        try:
            found.append((f"torch.{path}", _path_get(torch, owner_path), attribute))
        except AttributeError:
            continue
    return tuple(found)


def set_torch_flag(name: str, value: Any) -> None:
    import torch

    if name == "default dtype":
        torch.set_default_dtype(value)
    elif name == "default device":
        torch.set_default_device(None if value == "cpu" else value)
    elif name == "grad mode":
        torch.set_grad_enabled(value)
    elif name == "deterministic algorithms":
        torch.use_deterministic_algorithms(value[0], warn_only=value[1])
    elif name == "torch threads":
        torch.set_num_threads(value)
    elif name == "float32 matmul precision":
        if value != MIXED:
            torch.set_float32_matmul_precision(value)
    else:
        _path_set(torch, name.removeprefix("torch."), value)


def flag_words(name: str, value: Any) -> str:
    """A torch flag's value in words: ``the default dtype float64``, ``grad mode off``."""
    if name == "default dtype":
        return f"the default dtype {str(value).removeprefix('torch.')}"
    if name == "default device":
        return f"the default device {value}"
    if name == "grad mode":
        return f"grad mode {'on' if value else 'off'}"
    if name == "deterministic algorithms":
        on, warn_only = value
        return f"deterministic algorithms {'on' if on else 'off'}" + (
            " (warn only)" if on and warn_only else ""
        )
    return f"{name} {value}"

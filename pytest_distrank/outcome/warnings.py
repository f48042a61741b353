"""The ranks' warnings, into the reporting session's warnings summary.

Runs where one report per test is written: in the controller (pool mode, :mod:`pool.controller`) and
in rank 0 of a launched world (launcher mode, :mod:`launch`). Ranks record their tests' warnings
as :data:`protocol.WarningRecord` tuples (category module and qualname, message, file, line) and
send them with their last reports; here each distinct warning of a test is recorded once, through
``pytest_warning_recorded``, with the ranks that raised it in the message
(``[ranks 0, 1 of 2] deprecated thing``). Imports no torch.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from .merge import merge_warnings
from .records import WarningRecord


def warning_category(module: str, qualname: str) -> type[Warning]:
    """A rank's warning class, imported here (UserWarning when it cannot be)."""
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except Exception:
        return UserWarning
    return found if isinstance(found, type) and issubclass(found, Warning) else UserWarning


def forward_warnings(
    item: pytest.Item,
    per_rank: Mapping[int, Sequence[WarningRecord]],
    world_size: int,
) -> None:
    """The ranks' warnings into this session's warnings summary, each distinct one once."""
    for (module, qualname, text, filename, lineno), ranks in merge_warnings(per_rank, world_size):
        category = warning_category(module, qualname)
        try:
            message = category(f"[{ranks}] {text}")
        except Exception:
            category, message = UserWarning, UserWarning(f"[{ranks}] {qualname}: {text}")
        record = warnings.WarningMessage(message, category, filename, lineno)
        item.config.hook.pytest_warning_recorded.call_historic(
            kwargs={
                "warning_message": record,
                "when": "runtest",
                "nodeid": item.nodeid,
                "location": None,
            }
        )


def warning_record(message: warnings.WarningMessage) -> WarningRecord:
    """What a rank sends of one warning its test raised."""
    category = message.category
    return (
        category.__module__,
        category.__qualname__,
        str(message.message),
        str(message.filename),
        int(message.lineno or 0),
    )

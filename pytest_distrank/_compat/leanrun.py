"""Private pytest and plugin access for a rank's lean phases (``pool/worker/leanphases.py``):
pieces of pytest's run protocol, and the per-test state that pytest's and other plugins'
``pytest_runtest_makereport`` implementations read.

Runs in pool-mode rank processes, through :mod:`pytest_distrank._compat`. Where one of these
moves, its function answers so that the lean path is not taken (every test then runs pytest's own
protocol, as before): a missing key reads as "something to report".
"""

from __future__ import annotations

from typing import Any

import pytest

try:
    from _pytest.runner import check_interactive_exception as _interactive
    from _pytest.runner import get_reraise_exceptions as _reraise
    from _pytest.skipping import xfailed_key as _xfailed_key
    from _pytest.tmpdir import tmppath_result_key as _tmp_path_key
except ImportError:  # pragma: no cover - another pytest: lean_run_available() is False
    _interactive = _reraise = _xfailed_key = _tmp_path_key = None  # type: ignore[assignment]
try:
    from _pytest.subtests import failed_subtests_key as _failed_subtests_key
except ImportError:  # pytest before 9: no subtests fixture
    _failed_subtests_key = None  # type: ignore[assignment]

#: Attributes hypothesis' pytest plugin sets on an item for its ``makereport`` to report
#: (``_hypothesis_pytestplugin``: the report's "Hypothesis" section, statistics, failing examples).
_HYPOTHESIS_ITEM_ATTRS = (
    "hypothesis_report_information",
    "hypothesis_statistics",
    "_hypothesis_failing_examples",
)


def lean_run_available() -> bool:
    """Whether this pytest has every private piece the lean phases use (pytest 8.x-9.2 do)."""
    return None not in (_interactive, _reraise, _xfailed_key, _tmp_path_key)


def reraise_exceptions(config: pytest.Config) -> tuple[type[BaseException], ...]:
    """What ``CallInfo.from_call`` lets through in pytest's ``call_and_report`` (``Exit``, and
    ``KeyboardInterrupt`` unless ``--pdb``)."""
    return tuple(_reraise(config))


def interactive_exception(call: pytest.CallInfo[None], report: pytest.TestReport) -> bool:
    """Whether pytest's protocol calls ``pytest_exception_interact`` for this phase."""
    return bool(_interactive(call, report))


def start_request(item: pytest.Item) -> bool:
    """pytest's ``runtestprotocol`` opening: a re-run item's fixture request made again; whether
    the item has a request to drop at the end (:func:`drop_request`)."""
    has_request = hasattr(item, "_request")
    if has_request and not item._request:  # type: ignore[attr-defined]
        item._initrequest()  # type: ignore[attr-defined]
    return has_request


def drop_request(item: pytest.Item) -> None:
    """pytest's ``runtestprotocol`` end: funcargs and the request go away."""
    item._request = False  # type: ignore[attr-defined]
    item.funcargs = None  # type: ignore[attr-defined]


def has_report_sections(item: pytest.Item) -> bool:
    """Whether output or logs were captured in any phase so far (every later report shows
    them: pytest's ``TestReport.from_item_and_call`` copies all the item's sections)."""
    return bool(getattr(item, "_report_sections", True))


def xfail_evaluated(item: pytest.Item) -> bool:
    """Whether pytest's skipping plugin found an ``xfail`` mark that applies (its
    ``makereport`` then decides the outcome); True where the key cannot be read."""
    return _xfailed_key is None or bool(item.stash.get(_xfailed_key, None))


def failed_subtests(item: pytest.Item) -> bool:
    """Whether a subtest of ``item`` failed: pytest's subtests plugin then fails the passing
    call report in ``pytest_report_teststatus``, which the rank's terminal calls as it logs it."""
    if _failed_subtests_key is None:
        return False
    counts: dict[Any, int] | None = item.config.stash.get(_failed_subtests_key, None)
    keys = {item.nodeid, getattr(item, "id", item.nodeid)}
    return counts is not None and any(counts.get(key, 0) for key in keys)


def note_tmp_path_passed(item: pytest.Item, when: str) -> None:
    """What pytest's tmpdir plugin's ``makereport`` records for a passing phase (read by the
    ``tmp_path`` fixture's teardown under ``tmp_path_retention_policy``)."""
    empty: dict[str, bool] = {}
    item.stash.setdefault(_tmp_path_key, empty)[when] = True


def html_extras_pending(config: pytest.Config) -> bool:
    """Whether pytest-html's ``extras`` fixture holds extras for the next call report (its
    ``makereport`` moves them onto it); True where its key cannot be read."""
    try:
        from pytest_html.fixtures import extras_stash_key  # type: ignore[import-untyped]
    except ImportError:
        return True
    return bool(config.stash.get(extras_stash_key, []))


def hypothesis_reports(item: pytest.Item) -> bool:
    """Whether hypothesis' plugin has something to put on the item's reports."""
    return any(hasattr(item, name) for name in _HYPOTHESIS_ITEM_ATTRS)

"""The merged reports of a simulated test (``@pytest.mark.simulate``): who ran it, and what the
simulation does and does not check.

Runs in the controller (pool mode), after :func:`merge.merge_test` merged the one rank process's
reports. Pure logic over pytest's report objects; imports no torch. The merge labels that process
"rank 0/1", which it is to the pool; here every label the merge wrote becomes the simulated
world's (``simulated rank 1023/1024``, ``ranks 0-63 of 64 (local)``), and every failure gets a
"distrank: simulated world" section: what the mode moves and computes, and, when the failure
comes from the simulation itself (an op LocalTensor does not implement, a collective local mode
refuses, ``rank`` used as one number in local mode), what that means and what to do.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pytest import TestReport

from .._compat import LOCAL_TENSOR_MODULE, ExceptionChainRepr, ExceptionRepr, ReprEntryNative
from ..outcome.merge import label
from ..planning.meshes import Simulated

#: The label the merge gives the pool's one process.
_PROCESS = label(0, 1)
#: LocalTensorMode's refusal: ``NotImplementedError: c10d.reduce_.default not implemented``.
_NOT_IMPLEMENTED = re.compile(r"NotImplementedError: (\S+) not implemented")
#: ``rank`` (a SymInt of LocalIntNode) used where one int is needed, or compared where ranks
#: differ: ``'LocalIntNode' object has no attribute 'int_'``, ``AssertionError: (LocalIntNode(``.
_ONE_NUMBER = re.compile(r"'LocalIntNode' object has no attribute|AssertionError: \(LocalIntNode\(")
#: Local mode's own refusal of a collective it cannot compute exactly (:mod:`pool.worker.simulate`).
_REFUSED = re.compile(r"\bLocalModeRefusal: ")
#: The folder of LocalTensorMode's package in torch.distributed: its refusals come from there.
_LOCAL_TENSOR_FILE = re.compile(r"torch[/\\]distributed[/\\]_?local_tensor[/\\]")


def who(simulated: Simulated) -> str:
    """The simulated world's name for the one process that played it."""
    if simulated.mode == "local":
        return f"ranks 0-{simulated.size - 1} of {simulated.size} (local)"
    return f"simulated rank {simulated.rank}/{simulated.size}"


def explain(simulated: Simulated, crash: str, crash_path: str) -> str:
    """The "distrank: simulated world" section of a failure whose crash line is ``crash``."""
    where = f"{simulated.describe()}, in one process."
    if simulated.mode == "fake":
        return (
            f"{where} Fake mode moves no data: every collective returns at once with this "
            "rank's own input, so a value that depends on other ranks' data is not what a real "
            "run computes. Check shapes, placements and plans here; check numbers at a real "
            "world size, or in local mode (@pytest.mark.simulate('local', n))."
        )
    if _REFUSED.search(crash):
        return (
            f"{where} Local mode refused a collective it cannot compute exactly (the error "
            "says which, and why): it computes collectives exactly on the world and on DeviceMesh "
            "dimensions only, and refuses the rest rather than give numbers no real run gives. "
            "Check this test at a real world size (world_size marker), or drop 'local' from its "
            "simulate marker."
        )
    missing = _NOT_IMPLEMENTED.search(crash)
    if missing is not None and _LOCAL_TENSOR_FILE.search(crash_path):
        return (
            f"{where} LocalTensorMode does not implement {missing.group(1)}, so this test "
            "cannot run in local mode: PyTorch's LocalTensor has no local equivalent of that "
            "operation. Drop 'local' from the test's simulate marker and check it at a real "
            "world size (world_size marker), or its shapes in fake mode."
        )
    if _ONE_NUMBER.search(crash):
        return (
            f"{where} The test used `rank` as one number, which it is not in local mode: it is "
            "a torch.SymInt holding every rank's value at once. int(rank), range(rank) and "
            "tensor literals need one value; `rank == k` holds only where it holds on every "
            "rank; `<`, `>` fail where ranks differ. Compute per-rank values with tensor "
            f"arithmetic (torch.ones(n) * rank), or with {LOCAL_TENSOR_MODULE}'s rank_map / "
            "maybe_run_for_local_tensor, which run a function once per rank (and once, on the "
            "real rank, in a real world)."
        )
    if _LOCAL_TENSOR_FILE.search(crash_path):
        return (
            f"{where} The failure was raised inside PyTorch's LocalTensor ({crash_path}): local "
            "mode does not support what the test did there (point-to-point send/recv, for "
            "one, needs torch's LocalRunnerMode). Check this test at a real world size (world_size "
            "marker), or drop 'local' from its simulate marker."
        )
    return (
        f"{where} Local mode runs the test once under LocalTensorMode: every tensor holds each "
        "rank's value, and collectives on the world and on DeviceMesh dimensions compute what "
        "real ones would (local mode refuses those on any other group), so the numbers are "
        "those of a real run; `rank` is a torch.SymInt of every rank at once. A value that "
        "differs between ranks fails comparisons that a real rank would pass for its own value."
    )


def relabel(merged: Sequence[TestReport], simulated: Simulated) -> None:
    """Name the simulated world where the merge named the pool's one process, and explain
    every failure (see the module docstring)."""
    name = who(simulated)
    for report in merged:
        report.sections = [
            (title.replace(f"({_PROCESS})", f"({name})"), _retag(content, name))
            for title, content in report.sections
        ]
        report.user_properties = [
            (key.replace(_PROCESS, name) if isinstance(key, str) else key, value)
            for key, value in report.user_properties
        ]
        if not (report.failed and isinstance(report.longrepr, ExceptionRepr)):
            continue
        longrepr = report.longrepr
        crash = longrepr.reprcrash
        message = crash.message if crash is not None else ""
        if crash is not None:
            crash.message = _retag(crash.message, name)
        chain = longrepr.chain if isinstance(longrepr, ExceptionChainRepr) else None
        first_tb = chain[0][0] if chain else longrepr.reprtraceback
        entries = first_tb.reprentries
        if entries and isinstance(entries[0], ReprEntryNative):  # the merge's rank table
            table = ReprEntryNative([_table_line(line, name) for line in entries[0].lines])
            first_tb.reprentries = [table, *entries[1:]]
        path = crash.path if crash is not None else ""
        longrepr.addsection("distrank: simulated world", explain(simulated, message, path))


def _retag(text: str, name: str) -> str:
    tag = f"[{_PROCESS}]"
    return f"[{name}]{text[len(tag) :]}" if text.startswith(tag) else text


def _table_line(line: str, name: str) -> str:
    head = f"1 of 1 ranks failed; root cause: {_PROCESS}"
    if head in line:  # "rank 0/1" is in the new words too ("rank 0/1024"): replaced once
        return line.replace(head, f"{name} failed")
    return line.replace(_PROCESS, name)

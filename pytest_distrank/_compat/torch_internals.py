"""Private torch access: rendezvous handlers, the flight recorder, process groups and their
sequence numbers, fatal-signal stacks, the fake store, LocalTensor, dispatch modes.

Runs in rank processes of both modes (pool ranks and launched ranks; the process-group and
flight-recorder reads of :mod:`rank.groupstate`, simulated worlds, rendezvous). torch is imported
only when a function is called: the controller never imports it for gloo. Through
:mod:`pytest_distrank._compat`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any


def rendezvous_handlers() -> dict[str, Any] | None:
    """torch's registered rendezvous handlers (``_rendezvous_handlers``); None when torch has no
    such table, and tests' own rendezvous then see torchrun's agent-store setting unscoped."""
    import importlib

    module = importlib.import_module("torch.distributed.rendezvous")
    handlers = getattr(module, "_rendezvous_handlers", None)
    return handlers if isinstance(handlers, dict) else None


def dump_flight_recorder() -> bytes:
    """The NCCL/gloo flight recorder's dump as JSON (``_dump_fr_trace_json(includeCollectives,
    onlyActive)``; read by ``collectives.load``, never unpickled), which has no stack traces
    (symbolizing them takes seconds: 3.5 s for 21 collectives in a rank); callers treat any
    exception (a torch without it) as "no entries", so a change only loses the collective counts
    and the hang explanations."""
    import torch

    raw: bytes = torch._C._distributed_c10d._dump_fr_trace_json(True, False)
    return with_group_members(raw)


def with_group_members(raw: bytes) -> bytes:
    """A JSON flight-recorder dump with each group this rank holds in its ``pg_config``, as
    NCCL's dump lists them (``{"name", "desc", "ranks": "[0, 1]"}``): gloo's lists none (one
    entry with an empty name), so a hang on a subgroup could name it only ``group '1'``. The
    members are read from ``distributed_c10d._world`` (private); the dump as it was where that
    fails."""
    import json

    from torch.distributed import distributed_c10d as c10d

    try:
        data = json.loads(raw)
        config = data.setdefault("pg_config", {})
        for pg, name in list(c10d._world.pg_names.items()):
            members = sorted(c10d._world.pg_group_ranks.get(pg) or ())
            listed = config.get(name)
            if members and not (isinstance(listed, dict) and listed.get("ranks", "[]") != "[]"):
                desc = str(getattr(pg, "group_desc", ""))
                config[name] = {"name": name, "desc": desc, "ranks": str(members)}
        return json.dumps(data).encode()
    except Exception:
        return raw


def process_groups() -> list[Any]:
    """Every process group this rank created, the default one included.

    torch.distributed lists them nowhere public (``distributed_c10d._world.pg_map``, torch 2.x);
    the sequence-number check after each test needs the subgroups a test created too.
    """
    from torch.distributed import distributed_c10d as c10d

    return list(c10d._world.pg_map)


def new_gloo_group_named(ranks: list[int], name: str, desc: str) -> Any:
    """A gloo group of ``ranks`` (global ranks, this rank among them) named ``name``, made by
    its members only (no other rank of the world takes part).

    ``dist.new_group(use_local_synchronization=True)`` names such a group by hashing the ranks
    with the number of groups this *process* holds, so members holding different numbers of
    groups compute different names and wait forever in each other's rendezvous. torch has no
    public way to name a group: this calls ``distributed_c10d._new_process_group_helper`` and
    fills ``_world.pg_group_ranks`` as ``_new_group_with_tag`` does (torch 2.x, private). If
    torch renames either, every check across ranks on a group smaller than the world fails
    here with an AttributeError or TypeError (the world's own twin too); nothing hangs.
    """
    from torch.distributed import distributed_c10d as c10d

    default = c10d._get_default_group()
    _, store = c10d._world.pg_map[default]
    gloo = c10d.Backend("gloo")
    pg, _ = c10d._new_process_group_helper(
        len(ranks),
        ranks.index(default.rank()),
        ranks,
        gloo,
        store,
        c10d.GroupName(name) if hasattr(c10d, "GroupName") else name,
        timeout=c10d._get_default_timeout(gloo),
        group_desc=desc,
    )
    c10d._world.pg_group_ranks[pg] = {g: i for i, g in enumerate(ranks)}
    return pg


def sequence_number(pg: Any) -> int:
    """The number of collectives and point-to-point ops ``pg`` has issued on this rank.

    ``ProcessGroup._get_sequence_number_for_group()`` (torch 2.x, private; raises on a backend
    without sequence numbers): compared between ranks after every test (~30 us).
    """
    return int(pg._get_sequence_number_for_group())


def group_named(name: str) -> Any:
    """The group a functional collective names, or None: the faults' dispatch mode reads an op's
    group by it (``distributed_c10d._resolve_process_group``, private)."""
    import torch.distributed as dist

    try:
        return dist.distributed_c10d._resolve_process_group(name)
    except Exception:
        return None


def print_stacks_on_fatal_signal(enabled: bool) -> None:
    """Turn torch's C++ stack printing on fatal signals on or off
    (``torch._C._set_print_stack_traces_on_fatal_signal``, private): PyTorch's harness turns it
    on in every test process; a warm rank turns it off again after such a test, so that its own
    crash reports (faulthandler) stay what they are."""
    import torch

    setter = getattr(torch._C, "_set_print_stack_traces_on_fatal_signal", None)
    if setter is not None:
        setter(enabled)


#: PyTorch's LocalTensor package (private); messages to users name it for its rank_map helpers.
LOCAL_TENSOR_MODULE = "torch.distributed._local_tensor"


def fake_store() -> Any:
    """The store PyTorch's fake process group takes (``torch.testing._internal``'s
    ``FakeStore``); without it no simulated world starts, and the pool says so at start-up."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    return FakeStore()


def every_rank_int(size: int) -> Any:
    """A ``torch.SymInt`` that is ``r`` on each simulated rank ``r < size``: ``LocalIntNode`` of
    ``torch.distributed._local_tensor`` (private, torch >= 2.10), which PyTorch's own
    ``LocalDTensorTestBase.rank`` returns."""
    import torch
    from torch.distributed._local_tensor import LocalIntNode

    return torch.SymInt(LocalIntNode({r: r for r in range(size)}))


@contextlib.contextmanager
def local_tensor_mode(size: int) -> Iterator[None]:
    """``LocalTensorMode`` over ranks ``0..size-1`` (``torch.distributed._local_tensor``),
    entered as PyTorch's ``LocalDTensorTestBase`` enters it around a test: autograd's
    record_function off (``torch.autograd._enable_record_function``), DTensor's random-number
    tracker dropped after it (``torch.distributed.tensor._random._rng_tracker``) so the next
    test seeds afresh."""
    import torch
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.tensor import _random

    torch.autograd._enable_record_function(False)
    try:
        with LocalTensorMode(frozenset(range(size))):
            yield
    finally:
        torch.autograd._enable_record_function(True)
        _random._rng_tracker = None


#: Weak references to every DeviceMesh made since :func:`watch_local_collectives`.
_LOCAL_MESHES: list[Any] = []
#: torch's internal names of LocalTensor's collectives, where they differ from the public ones.
_LOCAL_OP_NAMES = {
    "allreduce_coalesced": "all_reduce_coalesced",
    "allgather_base": "all_gather_into_tensor",
    "allgather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "reduce_scatter_base": "reduce_scatter_tensor",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all_single",
}


def watch_local_collectives(
    check: Callable[[str, Any], None], not_member: Callable[[str], None]
) -> None:
    """For the rest of this process (a local pool's rank): ``check(op, group)`` runs before
    LocalTensorMode computes a collective on ``group``, and may raise; ``not_member(op)`` runs
    where torch skips a collective because the process's rank is not in its group, and may raise.

    LocalTensor computes every collective it implements after resolving its group in
    ``torch.distributed._local_tensor._c10d._prepare_collective_groups`` (private), which this
    wraps (``op`` is the caller's name there, in public words); torch warns of a skipped one in
    ``distributed_c10d._warn_not_in_group`` (private), also wrapped, and the exception logger
    around torch's collectives would replace a refusal there by its own ``ValueError: Invalid
    process group specified`` (``c10d_logger._get_msg_dict`` fails on a group the rank is not
    in): that one falls back to the op's name. Every DeviceMesh made from now on is remembered
    for :func:`mesh_dim_groups` (``DeviceMesh.__init__`` wrapped). A rename in torch makes this
    raise (AttributeError) at the pool's start, which then says so.
    """
    import functools
    import sys
    import weakref

    from torch._C import ScriptObject
    from torch.distributed import c10d_logger
    from torch.distributed import distributed_c10d as c10d
    from torch.distributed._local_tensor import _c10d as local_c10d
    from torch.distributed.device_mesh import DeviceMesh

    prepare = local_c10d._prepare_collective_groups
    if getattr(prepare, "_distrank_watched", False):
        return

    @functools.wraps(prepare)
    def prepare_checked(group: Any) -> Any:
        __tracebackhide__ = True
        caller = sys._getframe(1).f_code.co_name
        name = caller.removeprefix("_local_").removeprefix("functional_").rstrip("_")
        op = _LOCAL_OP_NAMES.get(name, name) if caller.startswith("_local_") else "a collective"
        unboxed = c10d.ProcessGroup.unbox(group) if isinstance(group, ScriptObject) else group
        check(op, unboxed)
        return prepare(group)

    warn = c10d._warn_not_in_group

    @functools.wraps(warn)
    def warn_or_refuse(op_name: str) -> None:
        __tracebackhide__ = True
        not_member(op_name)
        warn(op_name)

    msg_dict = c10d_logger._get_msg_dict

    @functools.wraps(msg_dict)
    def msg_dict_or_name(func_name: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            return dict(msg_dict(func_name, *args, **kwargs))
        except Exception:
            return {"func_name": func_name}

    init = DeviceMesh.__init__

    @functools.wraps(init)
    def init_remembered(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        _LOCAL_MESHES.append(weakref.ref(self))

    prepare_checked._distrank_watched = True  # type: ignore[attr-defined]
    local_c10d._prepare_collective_groups = prepare_checked
    c10d._warn_not_in_group = warn_or_refuse
    c10d_logger._get_msg_dict = msg_dict_or_name
    DeviceMesh.__init__ = init_remembered


def mesh_dim_groups() -> set[str]:
    """The names of the process groups of every DeviceMesh dimension made since
    :func:`watch_local_collectives`, while the mesh lives (``DeviceMesh._dim_group_names`` and
    the ``_pg_registry`` a root mesh keeps of its submeshes' and flattened dimensions' groups,
    both private: a rename makes every mesh dimension refused in local mode)."""
    names: set[str] = set()
    _LOCAL_MESHES[:] = [ref for ref in _LOCAL_MESHES if ref() is not None]
    for ref in _LOCAL_MESHES:
        mesh = ref()
        names.update(n for n in getattr(mesh, "_dim_group_names", None) or () if n)
        names.update(getattr(mesh, "_pg_registry", None) or {})
    return names


def dispatch_modes() -> list[str]:
    """The class names of the torch dispatch modes entered now (``torch.utils._python_dispatch.
    _get_current_dispatch_mode_stack``, private); [] when torch is not imported or has no such
    stack (then a test that leaves one entered goes unnoticed, as before)."""
    import sys

    if "torch" not in sys.modules:
        return []
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    except ImportError:
        return []
    return [type(mode).__name__ for mode in _get_current_dispatch_mode_stack()]


def compile_state() -> int:
    """How many frames torch.compile has handled in this process (``torch._dynamo.utils.
    counters["frames"]["total"]``, private), or 0 when dynamo was never imported: a test that
    compiled leaves it higher, and its compiled code and counters in the process."""
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return 0
    try:
        return int(counters["frames"]["total"])
    except (KeyError, TypeError, ValueError):
        return 0


def reset_compile_state() -> None:
    """Forget what torch.compile compiled and counted (``torch._dynamo.reset()``; its counters,
    which reset keeps, are cleared too), as a fresh process would start."""
    import sys

    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None:
        return
    dynamo.reset()
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is not None:
        counters.clear()


def reset_dtensor_rng() -> None:
    """Drop DTensor's process-global random-number tracker
    (``torch.distributed.tensor._random._rng_tracker``, private) where its module is loaded:
    the next DTensor random op makes a new one from torch's freshly seeded state, as in a new
    process. If renamed, the tracker of an earlier test carries over (its offsets, not its seed)."""
    import sys

    module = sys.modules.get("torch.distributed.tensor._random")
    if module is not None and getattr(module, "_rng_tracker", None) is not None:
        setattr(module, "_rng_tracker", None)  # noqa: B010

"""Process-wide switches outside torch's flags that a test can leave set: read, put back, named.

Runs in pool-mode rank processes (:mod:`rank.leftovers` reads :func:`switches_state` before and
after every test, as the ``switches`` category of :class:`snapshot.Snapshot`). Each read is a
getter call or a few dict keys (~10 us in all); a module's switches are read only once the
rank imported it (numpy, decimal, torch). What is restored: the garbage collector, the
recursion limit, the default socket timeout, the decimal context's settings, numpy's error
handling, global ``nn.Module`` hooks the test added (removed), ``saved_tensors_hooks`` left
entered (popped). A profiler left entered cannot be exited from outside: the pool goes.
"""

from __future__ import annotations

import gc
import socket
import sys
from collections.abc import Callable
from typing import Any

#: ``torch.nn.modules.module``'s dicts of global hooks (torch 2.13), read where present.
MODULE_HOOKS = (
    "_global_forward_hooks",
    "_global_forward_pre_hooks",
    "_global_backward_hooks",
    "_global_backward_pre_hooks",
    "_global_forward_hooks_with_kwargs",
    "_global_forward_hooks_always_called",
    "_global_buffer_registration_hooks",
    "_global_module_registration_hooks",
    "_global_parameter_registration_hooks",
)
#: The decimal context's settings compared (its flags change with any arithmetic: not).
DECIMAL_FIELDS = ("prec", "rounding", "Emin", "Emax", "capitals", "clamp")
#: The key of a torch profiler left entered: the pool goes (no owner to exit it).
PROFILER = "a torch profiler"
SAVED_HOOKS = "saved_tensors_hooks"
#: At most this many ``saved_tensors_hooks`` are popped back to the test's start.
MOST_POPS = 64


def switches_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "gc": gc.isenabled(),
        "recursion limit": sys.getrecursionlimit(),
        "socket timeout": socket.getdefaulttimeout(),
    }
    decimal = sys.modules.get("decimal")
    if decimal is not None:
        context = decimal.getcontext()
        traps = tuple(sorted(t.__name__ for t, on in context.traps.items() if on))
        state["decimal"] = (*(getattr(context, f) for f in DECIMAL_FIELDS), traps)
    numpy = sys.modules.get("numpy")
    if numpy is not None and hasattr(numpy, "geterr"):
        state["numpy"] = tuple(sorted(numpy.geterr().items()))
    module = sys.modules.get("torch.nn.modules.module")
    if module is not None:
        for name in MODULE_HOOKS:
            hooks = getattr(module, name, None)
            if isinstance(hooks, dict):
                state[name] = tuple(hooks)  # the handles' ids
    autograd: Any = getattr(sys.modules.get("torch._C"), "_autograd", None)
    if autograd is not None:  # try, not contextlib.suppress: ~1 us less a read
        try:
            state[SAVED_HOOKS] = autograd._top_saved_tensors_default_hooks(True)
        except Exception:
            pass
        try:
            state[PROFILER] = bool(autograd._profiler_enabled())
        except Exception:
            pass
    return state


def restore_switch(key: str, value: Any) -> bool:
    """Put one switch back to ``value``; whether it is back."""
    try:
        if key == "gc":
            (gc.enable if value else gc.disable)()
        elif key == "recursion limit":
            sys.setrecursionlimit(value)
        elif key == "socket timeout":
            socket.setdefaulttimeout(value)
        elif key == "decimal":
            _set_decimal(value)
        elif key == "numpy":
            sys.modules["numpy"].seterr(**dict(value))
        elif key in MODULE_HOOKS:
            hooks = getattr(sys.modules["torch.nn.modules.module"], key)
            for added in [k for k in hooks if k not in (value or ())]:
                del hooks[added]
        elif key == SAVED_HOOKS:
            _pop_saved_hooks(value)
        else:
            return False
    except Exception:
        return False
    return bool(switches_state().get(key) == value)


def _set_decimal(value: tuple[Any, ...]) -> None:
    import decimal

    context = decimal.getcontext()
    *fields, traps = value
    for field, field_value in zip(DECIMAL_FIELDS, fields, strict=True):
        setattr(context, field, field_value)
    for trap in context.traps:
        context.traps[trap] = trap.__name__ in traps


def _pop_saved_hooks(top: Any) -> None:
    """Pop ``saved_tensors_hooks`` the test left entered until ``top`` is on top again."""
    import torch

    autograd: Any = torch._C._autograd
    for _ in range(MOST_POPS):
        if autograd._top_saved_tensors_default_hooks(True) == top:
            return
        autograd._pop_saved_tensors_default_hooks()


#: A switch's value (after the test) in words, by key (a module hook's key: its own words).
WORDS: dict[str, Callable[[Any], str]] = {
    "gc": lambda on: f"the garbage collector {'enabled' if on else 'disabled'}",
    "recursion limit": lambda limit: f"sys.setrecursionlimit({limit})",
    "socket timeout": lambda timeout: f"socket.setdefaulttimeout({timeout})",
    "decimal": lambda value: f"the decimal context (prec {value[0]}, ...)",
    "numpy": lambda value: "numpy.seterr(" + ", ".join(f"{k}={v!r}" for k, v in value) + ")",
    SAVED_HOOKS: lambda _: "torch.autograd.graph.saved_tensors_hooks left entered",
    PROFILER: lambda _: "a torch profiler left entered (later profilers fail to start)",
}


def switch_words(key: str, value: Any) -> str:
    """A switch's value (after the test) in words."""
    if key in MODULE_HOOKS:
        return f"global nn.Module hooks ({key.removeprefix('_global_')})"
    try:
        return WORDS[key](value)
    except Exception:  # a module unloaded during the test: its switch reads absent
        return key

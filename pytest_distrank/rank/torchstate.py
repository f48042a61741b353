"""torch's process-wide defaults and flags, as a rank's leftover checks read, restore and name them.

Runs in pool-mode rank processes (:mod:`rank.leftovers` reads these before and after every test).
torch is imported only where a function runs, and only once the rank has imported it; the
``torch._dynamo.config`` entries only once something imported ``torch._dynamo`` (importing it
costs seconds). Every entry here is restored, and named.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import operator
import sys
from collections.abc import Callable, Mapping
from typing import Any, cast

#: ``torch.backends`` flags read and restored by attribute path, where this torch has them.
BACKEND_FLAGS = (
    "backends.fp32_precision",
    "backends.cuda.matmul.fp32_precision",
    "backends.cudnn.fp32_precision",
    "backends.cudnn.conv.fp32_precision",
    "backends.cudnn.rnn.fp32_precision",
    "backends.mkldnn.fp32_precision",
    "backends.mkldnn.matmul.fp32_precision",
    "backends.mkldnn.conv.fp32_precision",
    "backends.mkldnn.rnn.fp32_precision",
    "backends.cudnn.enabled",
    "backends.cudnn.benchmark",
    "backends.cudnn.deterministic",
    "backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
    "backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
    "backends.mkldnn.enabled",
    "backends.opt_einsum.enabled",
)
#: ``torch.get_float32_matmul_precision()`` once a test mixed the legacy and new precision APIs.
MIXED = "(mixed legacy and new precision settings)"
#: The float32 precision settings, legacy and new: setting one sets others (a parent its
#: children, the legacy matmul precision both matmul backends' settings), so that one put back
#: alone may leave another changed that the test never changed (:func:`restored_with`).
PRECISION = (
    "float32 matmul precision",
    *(f"torch.{path}" for path in BACKEND_FLAGS if path.endswith(".fp32_precision")),
)
#: The device types autocast keeps a state for (torch 2.13), read where this torch knows them.
AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps", "hpu", "xla", "ipu", "mtia", "maia")
#: ``torch._tensor_str.PRINT_OPTS``'s fields, as ``torch.set_printoptions`` names them.
PRINT_FIELDS = ("precision", "threshold", "edgeitems", "linewidth", "sci_mode")
#: torch's print options in a fresh process (the words name the fields that differ).
PRINT_DEFAULTS = (4, 1000, 3, 80, None)
#: The key of the torch function modes entered (named, never restored: the pool goes).
FUNCTION_MODES = "function modes"
#: The key of ``torch.inference_mode`` (named, never restored: no setter; the pool goes).
INFERENCE = "inference mode"
#: Prefix of the keys of ``torch._dynamo.config`` entries.
DYNAMO = "torch._dynamo.config."
#: Values longer than this are cut in the words (a config entry may hold a long list).
VALUE_WORDS = 60
#: A denormal and one, multiplied at each read (:func:`_flushes_denormals`).
_DENORMAL = 1e-310
_ONE = 1.0


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
    before the flags it sets; each autocast device before the nesting level); {} when the rank
    never imported torch. Each entry is one call of a getter looked up once (:func:`_readers`);
    an entry this torch cannot read is left out, never an error: every test of the rank takes
    this snapshot."""
    torch: Any = sys.modules.get("torch")
    if torch is None:
        return {}
    flags: dict[str, Any] = {}
    for name, read in _readers(torch):
        try:
            flags[name] = read()
        except Exception:
            continue
    dynamo = sys.modules.get("torch._dynamo.config")
    if dynamo is not None:  # imported by a test or a fixture: never imported here
        with contextlib.suppress(Exception):  # a half-imported module (the import failed)
            flags.update((DYNAMO + k, v) for k, v in dynamo.get_config_copy().items())
    return flags


@functools.cache
def _readers(torch: Any) -> tuple[tuple[str, Callable[[], Any]], ...]:
    """(name, getter) of every flag, in :func:`torch_flags`' order, looked up once: torch's C
    getters where a Python wrapper stood between (a ``torch.backends`` property's getter, the
    default device without ``get_default_device``'s imports), ~10 us a read instead of ~25."""
    deterministic = torch.are_deterministic_algorithms_enabled
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled
    readers: list[tuple[str, Callable[[], Any]]] = [
        ("default dtype", torch.get_default_dtype),
        ("default device", functools.partial(_default_device, torch)),
        ("grad mode", torch.is_grad_enabled),
        ("deterministic algorithms", lambda: (deterministic(), warn_only())),
        ("torch threads", torch.get_num_threads),
        ("float32 matmul precision", functools.partial(_matmul_precision, torch)),
    ]
    readers += [(name, _getter(owner, attr)) for name, owner, attr in _backend_flags(torch)]
    readers += [
        (f"autocast {device}", functools.partial(_autocast, torch, device))
        for device in _autocast_devices(torch)
    ]
    anomaly, check_nan = torch.is_anomaly_enabled, torch.is_anomaly_check_nan_enabled
    tensor_str = torch._tensor_str
    print_options = operator.attrgetter(*PRINT_FIELDS)
    readers += [
        ("autocast nesting", functools.partial(_nesting, torch)),
        ("autocast cache", torch.is_autocast_cache_enabled),
        ("anomaly detection", lambda: (anomaly(), check_nan())),
        ("flush denormal", _flushes_denormals),
        ("warn always", torch.is_warn_always_enabled),
        ("autograd multithreading", torch.autograd.is_multithreading_enabled),
        (FUNCTION_MODES, functools.partial(function_modes, torch)),
        (INFERENCE, torch.is_inference_mode_enabled),
        ("print options", lambda: print_options(tensor_str.PRINT_OPTS)),
    ]
    return tuple(readers)


def _default_device(torch: Any) -> str:
    """``str(torch.get_default_device())``, read without its imports and mode-stack walk where
    neither a function mode nor ``set_default_device`` can have set it (~0.2 us, not ~2.7)."""
    if torch._C._len_torch_function_stack() or (
        getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None) is not None
    ):
        return str(torch.get_default_device())
    return "cpu"


def _getter(owner: Any, attribute: str) -> Callable[[], Any]:
    """``owner.attribute``'s read: the getter of a ``torch.backends`` property (a class
    attribute with ``getter``, whose ``__get__`` calls it), else ``getattr``."""
    prop = inspect.getattr_static(type(owner), attribute, None)
    getter = getattr(prop, "getter", None)
    if callable(getter) and type(prop).__name__ == "ContextProp":
        return cast(Callable[[], Any], getter)
    return functools.partial(getattr, owner, attribute)


def _autocast(torch: Any, device: str) -> tuple[bool, Any]:
    return torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)


def _nesting(torch: Any) -> int:
    """autocast's nesting level (torch reads it only as the result of a change: one up and
    back down)."""
    torch.autocast_increment_nesting()
    return int(torch.autocast_decrement_nesting())


@functools.cache
def _autocast_devices(torch: Any) -> tuple[str, ...]:
    """The device types of :data:`AUTOCAST_DEVICES` (and a registered private backend's) whose
    autocast state this torch reads (looked up once)."""
    names = list(AUTOCAST_DEVICES)
    with contextlib.suppress(Exception):
        names.append(torch._C._get_privateuse1_backend_name())
    found = []
    for device in dict.fromkeys(names):
        try:
            _autocast(torch, device)
        except Exception:  # a device type this torch does not know, or an older API
            continue
        found.append(device)
    return tuple(found)


def _flushes_denormals() -> bool:
    """Whether this thread's float arithmetic flushes denormals to zero
    (``torch.set_flush_denormal`` sets the CPU's flags and has no getter): a denormal times one
    reads zero then. Python's floats run on the same flags as torch's CPU kernels in this thread,
    so plain floats read them (0.03 us; a tensor took 6-9 us, and needed function modes off).
    Module globals: constants would be folded at compile time."""
    return _DENORMAL * _ONE == 0.0


def function_modes(torch: Any) -> tuple[str, ...]:
    """The class names of the torch function modes entered now (``torch.device(...)`` used as
    a context manager is one), less the one ``torch.set_default_device`` keeps (that is the
    default device's entry). ~1 us when none is entered."""
    if not torch._C._len_torch_function_stack():
        return ()
    from torch.overrides import _get_current_function_mode_stack

    default = getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)
    return tuple(
        type(mode).__name__ for mode in _get_current_function_mode_stack() if mode is not default
    )


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


def restored_with(name: str, flags: Mapping[str, Any]) -> list[str]:
    """The keys of ``flags`` to put back when ``name`` differs, in the order of ``flags`` (the
    order :func:`torch_flags` reads them: parents before children): every precision setting
    with one of them, else ``name`` alone."""
    if name not in PRECISION:
        return [name]
    return [key for key in flags if key in PRECISION]


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
    elif name.startswith("autocast "):
        _set_autocast(torch, name.removeprefix("autocast "), value)
    elif name == "anomaly detection":
        torch.set_anomaly_enabled(value[0], value[1])
    elif name == "flush denormal":
        torch.set_flush_denormal(value)
    elif name == "warn always":
        torch.set_warn_always(value)
    elif name == "autograd multithreading":
        torch.autograd.set_multithreading_enabled(value)
    elif name == "print options":
        for field, field_value in zip(PRINT_FIELDS, value, strict=True):
            setattr(torch._tensor_str.PRINT_OPTS, field, field_value)
    elif name.startswith(DYNAMO):
        set_dynamo_config(name, value)
    else:
        _path_set(torch, name.removeprefix("torch."), value)


def _set_autocast(torch: Any, what: str, value: Any) -> None:
    """One autocast entry back; its cache is cleared, as leaving the outermost autocast does
    (casts made under it must not serve later tests)."""
    if what == "nesting":
        level = _nesting(torch)
        while level > value:
            level = torch.autocast_decrement_nesting()
        while level < value:
            level = torch.autocast_increment_nesting()
    elif what == "cache":
        torch.set_autocast_cache_enabled(value)
    else:
        torch.set_autocast_enabled(what, value[0])
        torch.set_autocast_dtype(what, value[1])
    torch.clear_autocast_cache()


def set_dynamo_config(name: str, value: Any) -> None:
    """A ``torch._dynamo.config`` entry back to ``value``."""
    import torch._dynamo.config as config

    setattr(config, name.removeprefix(DYNAMO), value)


def dynamo_default(name: str) -> bool:
    """Whether a ``torch._dynamo.config`` entry is at its default (read when dynamo was imported
    during the test: there is no earlier value to compare with)."""
    import torch._dynamo.config as config

    try:
        return bool(config._is_default(name.removeprefix(DYNAMO)))
    except Exception:  # a torch without the private check: named only if set
        return False


def reset_dynamo_config(name: str) -> Any:
    """A ``torch._dynamo.config`` entry back to its default: the user's override dropped, as
    ``delattr`` does for ``mock.patch``, and the entry shown again (``delattr`` alone hides it:
    every later read, and every torch.compile, raised ``AttributeError``); its value now."""
    import torch._dynamo.config as config

    key = name.removeprefix(DYNAMO)
    entry = config._config[key]
    delattr(config, key)
    entry.hide = False
    return getattr(config, key)


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
    return _mode_words(name, value) or f"{name} {_short(value)}"


def _mode_words(name: str, value: Any) -> str:
    """The words of the autocast, anomaly, denormal, printing entries ("" for another flag)."""
    if name == "autocast nesting":
        return (
            f"autocast left entered (nesting level {value})"
            if value
            else ("autocast nesting level 0")
        )
    if name == "autocast cache":
        return f"the autocast cache {'on' if value else 'off'}"
    if name.startswith("autocast "):
        on, dtype = value
        device = name.removeprefix("autocast ")
        return (
            f"autocast on {device} ({str(dtype).removeprefix('torch.')})"
            if on
            else (f"autocast off on {device}")
        )
    if name == "anomaly detection":
        on, check_nan = value
        return f"anomaly detection {'on' if on else 'off'}" + (
            " (without NaN checks)" if on and not check_nan else ""
        )
    if name == "flush denormal":
        return f"flush-denormal {'on' if value else 'off'}"
    if name in ("warn always", "autograd multithreading"):
        return f"{'torch.set_warn_always' if name == 'warn always' else name} {_on(value)}"
    if name == "print options":
        changed = [
            f"{field} {v}"
            for field, v, default in zip(PRINT_FIELDS, value, PRINT_DEFAULTS, strict=True)
            if v != default
        ]
        return f"torch print options ({', '.join(changed) or 'the defaults'})"
    return ""


def _on(value: Any) -> str:
    return "on" if value else "off"


def _short(value: Any) -> str:
    words = repr(value) if not isinstance(value, (str, bool, int, float)) else str(value)
    return words if len(words) <= VALUE_WORDS else words[: VALUE_WORDS - 3] + "..."

"""Every private pytest, CPython, torch and plugin API the plugin uses, each behind one named
function.

Imported in every process of both modes: the controller, pool rank processes (and the fork server
that preloads the plugin), and the ranks of a launched world. So it imports no torch at module
level (the torch functions import it when called) and nothing that a process lacks.

The rule: no other module of the package imports ``_pytest`` or touches a private attribute of
pytest's, CPython's, torch's, PyTorch's test harness's or another plugin's objects
(``tests/unit/test_imports.py`` checks it). Where pytest exports a name (``pytest.TestReport``,
``pytest.CollectReport``, ``pytest.CallInfo``) the public name is used instead. Each function's
docstring says why the private access is needed and what breaks if it changes; the guards
(``getattr`` defaults, ``hasattr``) are those the call sites always had. Callers import from here
(``from .. import _compat``), never from the modules below:

- ``pytest_internals``: running a test and its fixtures, temporary folders, the terminal,
  junitxml, logging, assertion rewriting;
- ``mp_internals``: multiprocessing's fork server;
- ``torch_internals``: rendezvous handlers, the flight recorder, process groups, the fake store,
  LocalTensor, dispatch modes;
- ``harness``: PyTorch's ``MultiProcessTestCase`` / ``MultiProcContinuousTest`` harness;
- ``plugins``: pytest-rerunfailures' decision functions and pytest-cov's controller.
"""

from __future__ import annotations

# Failure reports are built from pytest's own repr classes so that the terminal, ``-ra`` and
# junitxml render them as any other failure; a rename breaks every merged failure report (and
# the import of merge.py). No public names exist for them.
from _pytest._code.code import (
    ExceptionChainRepr,
    ExceptionRepr,
    ReprEntryNative,
    ReprFileLocation,
    ReprTracebackNative,
)

from .harness import (
    HARNESS_MODULE,
    HARNESS_SPAWNERS,
    harness_error_code,
    harness_generic_skip_code,
    harness_init_group,
    harness_kind,
    harness_module,
    harness_no_spawning,
    harness_return_code_rules,
    harness_run_continuous,
    harness_run_spawned,
    harness_skip_message,
    harness_world_size,
)
from .mp_internals import (
    close_fork_server_alive_fd,
    environ_data,
    executor_worker,
    forkserver_pid,
    kill_fork_server,
    mp_process_config,
    stop_fork_server,
)
from .plugins import (
    PYTEST_COV_PLUGIN,
    RANDOMLY_PLUGIN,
    RERUNFAILURES_MODULE,
    RERUNFAILURES_PLUGIN,
    count_execution,
    keep_rerun_counts_out_of_ranks,
    mark_rerun,
    pytest_cov_settings,
    randomly_reseeds,
    rerun_attempts_before,
    rerun_condition,
    rerun_count,
    rerun_delay,
    rerun_failures_db,
    rerun_hard_fail,
    rerun_path_excluded,
    rerunfailures_module,
    rerunfailures_plugin,
    take_suite_rerun,
)
from .pytest_internals import (
    can_redirect_terminal,
    default_plugin_modules,
    drop_junit_xml,
    ensure_unconfigure,
    finish_fixture,
    fixture_info,
    forget_setup_stack,
    getbasetemp,
    rank_cache,
    redirect_terminal,
    replace_catching_logs,
    request_item,
    run_test_protocol,
    session_fixturedefs,
    set_given_basetemp,
    setup_stack,
    share_rewritten_modules,
    skip_exception,
    skip_mark_reason,
    teardown_exact,
    terminal_writer,
    user_temp_root,
)
from .torch_internals import (
    LOCAL_TENSOR_MODULE,
    compile_state,
    dispatch_modes,
    dump_flight_recorder,
    every_rank_int,
    fake_store,
    local_tensor_mode,
    mesh_dim_groups,
    print_stacks_on_fatal_signal,
    process_groups,
    rendezvous_handlers,
    reset_compile_state,
    reset_dtensor_rng,
    sequence_number,
    watch_local_collectives,
    with_group_members,
)

__all__ = [
    "HARNESS_MODULE",
    "HARNESS_SPAWNERS",
    "LOCAL_TENSOR_MODULE",
    "PYTEST_COV_PLUGIN",
    "RANDOMLY_PLUGIN",
    "RERUNFAILURES_MODULE",
    "RERUNFAILURES_PLUGIN",
    "ExceptionChainRepr",
    "ExceptionRepr",
    "ReprEntryNative",
    "ReprFileLocation",
    "ReprTracebackNative",
    "can_redirect_terminal",
    "close_fork_server_alive_fd",
    "compile_state",
    "count_execution",
    "default_plugin_modules",
    "dispatch_modes",
    "drop_junit_xml",
    "dump_flight_recorder",
    "ensure_unconfigure",
    "environ_data",
    "every_rank_int",
    "executor_worker",
    "fake_store",
    "finish_fixture",
    "fixture_info",
    "forget_setup_stack",
    "forkserver_pid",
    "getbasetemp",
    "harness_error_code",
    "harness_generic_skip_code",
    "harness_init_group",
    "harness_kind",
    "harness_module",
    "harness_no_spawning",
    "harness_return_code_rules",
    "harness_run_continuous",
    "harness_run_spawned",
    "harness_skip_message",
    "harness_world_size",
    "keep_rerun_counts_out_of_ranks",
    "kill_fork_server",
    "local_tensor_mode",
    "mark_rerun",
    "mesh_dim_groups",
    "mp_process_config",
    "print_stacks_on_fatal_signal",
    "process_groups",
    "pytest_cov_settings",
    "randomly_reseeds",
    "rank_cache",
    "redirect_terminal",
    "rendezvous_handlers",
    "replace_catching_logs",
    "request_item",
    "rerun_attempts_before",
    "rerun_condition",
    "rerun_count",
    "rerun_delay",
    "rerun_failures_db",
    "rerun_hard_fail",
    "rerun_path_excluded",
    "rerunfailures_module",
    "rerunfailures_plugin",
    "reset_compile_state",
    "reset_dtensor_rng",
    "run_test_protocol",
    "sequence_number",
    "session_fixturedefs",
    "set_given_basetemp",
    "setup_stack",
    "share_rewritten_modules",
    "skip_exception",
    "skip_mark_reason",
    "stop_fork_server",
    "take_suite_rerun",
    "teardown_exact",
    "terminal_writer",
    "user_temp_root",
    "watch_local_collectives",
    "with_group_members",
]

"""The suite's zygote (``tests/zygote.py``): a session forked from it sees what a session started
as ``python -m pytest`` sees (runs in the outer pytest process; its inner sessions in their own)."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ..helpers import RunPytest
from ..zygote import IMPORT_SENSITIVE, ZYGOTE, Session, import_sensitive
from ..zygote_server import session_path

#: An inner test that writes what its process looks like, as JSON, to ``facts-<mode>.json``.
FACTS = """
import json, os, signal, sys, tempfile, threading, torch

def kind(fd):
    try:
        link = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # the listing's own descriptor
        return "gone"
    return link.split("/")[1] if link.startswith("/") else link.split(":")[0]

def test_facts():
    facts = {
        "argv0": os.path.basename(sys.argv[0]),
        "main": getattr(sys.modules["__main__"].__spec__, "name", None),
        "path": [p for p in sys.path if "site-packages" not in p and "python3" not in p],
        "cwd": os.getcwd(),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("ZYGOTE_CASE", "PYTHONPATH"))},
        "stdin": sys.stdin.read() if hasattr(sys.stdin, "read") else None,
        "leader": os.getpgrp() == os.getpid(),
        "threads": threading.active_count(),
        "sigint": str(signal.getsignal(signal.SIGINT)),
        # what is open, by kind (their numbers follow the order of opening)
        "fds": sorted(kind(fd) for fd in os.listdir("/proc/self/fd")),
        "plugin_fresh": "pytest_distrank" in sys.modules,
        "parent": os.getppid(),
        # OMP_NUM_THREADS, read by `import torch` in a fresh one, applied in a forked one
        "torch_threads": torch.get_num_threads(),
        "os_threads": len(os.listdir("/proc/self/task")),
        # TMPDIR, read at the first gettempdir(): not cached by the server's imports
        "tempdir": tempfile.gettempdir(),
    }
    with open(f"facts-{os.environ['ZYGOTE_CASE']}.json", "w") as out:
        json.dump(facts, out)
"""


def test_a_forked_session_sees_what_a_fresh_one_sees(
    pytester: pytest.Pytester, run_pytest: RunPytest, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_facts=FACTS)
    ZYGOTE.start()
    threads = "2" if ZYGOTE.environment.get("OMP_NUM_THREADS") == "1" else "1"
    monkeypatch.setenv("OMP_NUM_THREADS", threads)  # not the server's: the child applies it
    (pytester.path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(pytester.path / "tmp"))
    monkeypatch.setenv("ZYGOTE_CASE", "forked")
    forked = run_pytest("-s", "-p", "no:cacheprovider")
    monkeypatch.setenv("ZYGOTE_CASE", "fresh")
    fresh = pytester.runpytest_subprocess("-p", "distrank", "-s", "-p", "no:cacheprovider")
    assert forked.ret == fresh.ret == 0, (forked.outlines, fresh.outlines)
    seen = {
        case: json.loads((pytester.path / f"facts-{case}.json").read_text())
        for case in ("forked", "fresh")
    }
    for facts in seen.values():
        facts["env"].pop("ZYGOTE_CASE")
    parents = {case: facts.pop("parent") for case, facts in seen.items()}
    assert ZYGOTE.process is not None and parents["forked"] == ZYGOTE.process.pid
    assert parents["fresh"] == os.getpid()
    assert seen["forked"] == seen["fresh"]
    assert seen["forked"]["torch_threads"] == int(threads)
    assert seen["forked"]["tempdir"] == str(pytester.path / "tmp")


NAMES = [
    "TORCH_X",
    "OMP_NUM_THREADS",
    "HOME",
    "PYTHONPATH",
    "PYTHONHASHSEED",
    "COLUMNS",
    "PYTHONBREAKPOINT",
]
ENVIRONMENTS = st.dictionaries(st.sampled_from(NAMES), st.sampled_from(["a", "b", "0", "1", "2"]))


@given(server=ENVIRONMENTS, session=ENVIRONMENTS)
def test_only_variables_read_at_import_keep_a_session_from_the_zygote(
    server: dict[str, str], session: dict[str, str]
) -> None:
    why = import_sensitive(server, session)
    for name in {*server, *session}:
        differs = server.get(name) != session.get(name)
        applied = name in ("PYTHONPATH", "PYTHONBREAKPOINT") or (
            name == "OMP_NUM_THREADS" and session.get(name, "0") in ("1", "2")
        )
        counted = name.startswith(IMPORT_SENSITIVE) and not applied
        assert (name in why) == (differs and counted)


#: Run as ``python -m meet NAME OTHER``: leaves its mark, then waits for the other's (10 s).
MEET = """
import os, sys, time
me, other = sys.argv[1:]
open(me, "w").close()
deadline = time.monotonic() + 10
while not os.path.exists(other):
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.01)
print(me, "met", other, "in", os.getcwd(), oct(os.umask(0)))
sys.exit(0 if me == "a" else 5)
"""


def test_the_processes_of_one_world_are_forked_together(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    """Two processes that each wait for the other (a launched world's agents, by-hand ranks)
    run at once, with their umask, their outputs and their exit codes (``run_pytest``: its
    leak check)."""
    pytester.makepyfile(meet=MEET)
    env = {**os.environ, "PYTHONPATH": str(pytester.path)}
    out = [pytester.path / f"out{i}" for i in range(2)]
    sessions = [
        Session([me, other], pytester.path, env, (o, o), module="meet", umask=0o027)
        for me, other, o in (("a", "b", out[0]), ("b", "a", out[1]))
    ]
    codes, pids = ZYGOTE.run(sessions, 60)
    assert codes == [0, 5] and len(set(pids)) == 2, [o.read_text() for o in out]
    assert [o.read_text() for o in out] == [
        f"a met b in {pytester.path} 0o27\n",
        f"b met a in {pytester.path} 0o27\n",
    ]


def test_a_session_path_is_a_fresh_interpreters() -> None:
    base = ["/lib/python3.11", "/site"]
    path = session_path("/case", os.pathsep.join(["/case", "rel", "", "/other"]), base)
    assert path == ["/case", "/case", os.path.abspath("rel"), "/other", *base]

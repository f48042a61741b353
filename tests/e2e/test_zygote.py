"""The suite's zygote (``tests/zygote.py``): a session forked from it sees what a session started
as ``python -m pytest`` sees (runs in the outer pytest process; its inner sessions in their own)."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ..helpers import RunPytest
from ..zygote import IMPORT_SENSITIVE, ZYGOTE, _session_path, import_sensitive

#: An inner test that writes what its process looks like, as JSON, to ``facts-<mode>.json``.
FACTS = """
import json, os, signal, sys, threading

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
    }
    with open(f"facts-{os.environ['ZYGOTE_CASE']}.json", "w") as out:
        json.dump(facts, out)
"""


def test_a_forked_session_sees_what_a_fresh_one_sees(
    pytester: pytest.Pytester, run_pytest: RunPytest, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_facts=FACTS)
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


NAMES = ["TORCH_X", "OMP_NUM_THREADS", "HOME", "PYTHONPATH", "PYTHONHASHSEED", "COLUMNS"]
ENVIRONMENTS = st.dictionaries(st.sampled_from(NAMES), st.sampled_from("ab"))


@given(server=ENVIRONMENTS, session=ENVIRONMENTS)
def test_only_variables_read_at_import_keep_a_session_from_the_zygote(
    server: dict[str, str], session: dict[str, str]
) -> None:
    why = import_sensitive(server, session)
    for name in {*server, *session}:
        differs = server.get(name) != session.get(name)
        counted = name.startswith(IMPORT_SENSITIVE) and name != "PYTHONPATH"
        assert (name in why) == (differs and counted)


def test_a_session_path_is_a_fresh_interpreters() -> None:
    base = ["/lib/python3.11", "/site"]
    path = _session_path("/case", os.pathsep.join(["/case", "rel", "", "/other"]), base)
    assert path == ["/case", "/case", os.path.abspath("rel"), "/other", *base]

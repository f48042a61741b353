"""Unit: the suite's own xdist scheduling (tests/conftest.py, tests/helpers.py; outer process).

Test files that run the same shared inner session (a ``Session`` of tests/e2e/test_faults.py that
another file imports) form a family, and ``-n N --dist loadfile`` gives each family to one worker:
on two workers the session would run twice. Read from the sources with ``ast``, as written.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .. import conftest
from ..helpers import session_families

E2E = Path(conftest.__file__).parent / "e2e"

FILES = {
    "test_owner.py": "from .test_base import Session\nSHARED = Session('s', {})\nOTHER = 3\n",
    "test_user.py": "from .test_owner import SHARED\n",
    "test_second.py": "from .test_user import helper\nfrom .test_third import LATER\n",
    "test_third.py": "LATER = Session('t', {})\n",
    "test_text.py": "from .test_owner import OTHER, Session\n",
    "test_base.py": "class Session: ...\n",
}


def test_files_that_import_a_session_join_its_family(tmp_path: Path) -> None:
    for name, source in FILES.items():
        (tmp_path / name).write_text(source)
    families = session_families(tmp_path)
    assert families == {
        "test_owner.py": "test_owner.py+test_user.py",
        "test_user.py": "test_owner.py+test_user.py",
        "test_second.py": "test_second.py+test_third.py",
        "test_third.py": "test_second.py+test_third.py",
    }


def test_families_are_joined_through_a_shared_member(tmp_path: Path) -> None:
    """``test_b`` imports a session of ``test_a``, ``test_c`` one of ``test_b``: one family."""
    (tmp_path / "test_a.py").write_text("A = Session('a', {})\n")
    (tmp_path / "test_b.py").write_text("from .test_a import A\nB = Session('b', {})\n")
    (tmp_path / "test_c.py").write_text("from .test_b import B\n")
    family = "test_a.py+test_b.py+test_c.py"
    assert session_families(tmp_path) == dict.fromkeys(
        ("test_a.py", "test_b.py", "test_c.py"), family
    )


def test_the_fault_files_run_on_one_worker_under_loadfile(pytester: pytest.Pytester) -> None:
    config = pytester.parseconfig("--tx", "3*popen", "--dist", "loadfile")
    scheduler = conftest.pytest_xdist_make_scheduler(config, None)
    scope = scheduler._split_scope
    faults = scope("tests/e2e/test_faults.py::test_x")
    for name in ("test_errors", "test_honest", "test_hangs_explained", "test_start_bounds"):
        assert scope(f"tests/e2e/{name}.py::test_y[1]") == faults
    assert scope("tests/e2e/test_seeds.py::test_z") == "tests/e2e/test_seeds.py"
    assert scope("tests/unit/test_faults.py::test_z") == "tests/unit/test_faults.py"
    assert session_families(E2E)["test_faults.py"] == Path(faults).name
    assert (
        conftest.pytest_xdist_make_scheduler(
            pytester.parseconfig("--tx", "3*popen", "--dist", "load"), None
        )
        is None
    )

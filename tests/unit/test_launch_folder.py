"""Unit: launcher mode's run folder (launch/session.py): where pytest would put it, private, and
refused where pytest refuses its own temp folder (hostile review 3, D10).

Runs in the test process: the folder functions with a stand-in config (no tmpdir plugin: the
fallback factory), and :meth:`RankSession.open`, which checks the folder before it connects to
anything. The end-to-end check of the modes (a fresh ``TMPDIR``, umask 022) is
``tests/e2e/test_launch.py::test_slurm_by_hand``.
"""

from __future__ import annotations

import getpass
import os
import stat
import types
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from pytest_distrank.launch.env import detect
from pytest_distrank.launch.session import RankSession, base_folder, open_log, run_folder

#: The uid of ``nobody``: the other user of these tests.
OTHER_UID = 65534


def config(basetemp: str | None = None) -> pytest.Config:
    """A config with only what the folder functions read (no ``_tmp_path_factory``)."""
    option = types.SimpleNamespace(basetemp=basetemp)
    return cast(pytest.Config, types.SimpleNamespace(option=option))


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def temproot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """pytest's temp root here, under umask 022 (the usual one, which leaves 0755 and 0644)."""
    root = tmp_path / "pub"
    root.mkdir(mode=0o1777)
    monkeypatch.setenv("PYTEST_DEBUG_TEMPROOT", str(root))
    old = os.umask(0o022)
    yield root
    os.umask(old)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another user")
def test_pytest_of_user_owned_by_another_user_is_refused(temproot: Path) -> None:
    planted = temproot / f"pytest-of-{getpass.getuser()}"
    planted.mkdir(mode=0o777)
    os.chown(planted, OTHER_UID, OTHER_UID)
    launch = detect({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": "1"})  # fmt: skip
    assert launch is not None
    # Refused before connecting to the control store (port 1: nothing listens there).
    with pytest.raises(pytest.UsageError) as info:
        RankSession.open(config(), launch)
    message = str(info.value)
    assert "rank 1/2" in message and "cannot use its temporary folder" in message
    assert f"{planted} is not owned by the current user" in message
    assert list(planted.iterdir()) == []  # nothing written into the other user's folder


def test_fresh_temp_root_gives_private_folders_and_logs(temproot: Path) -> None:
    base = base_folder(config())
    assert base == (temproot / f"pytest-of-{getpass.getuser()}").resolve()
    assert mode(base) == 0o700
    root = run_folder(base, "abc")
    assert root == base / "distrank-abc" and mode(root) == 0o700
    assert run_folder(base, "abc") == root  # a peer rank of the node finds it
    with open_log(str(root / "rank1.log"), append=False) as log:
        log.write("API_TOKEN=...\n")
    with open_log(str(root / "rank0.log"), append=True) as log:
        log.write("stacks\n")
    assert mode(root / "rank1.log") == mode(root / "rank0.log") == 0o600


def test_a_wider_pytest_of_user_is_narrowed_as_pytest_does(temproot: Path) -> None:
    mine = temproot / f"pytest-of-{getpass.getuser()}"
    mine.mkdir()
    mine.chmod(0o755)
    assert base_folder(config()) == mine.resolve() and mode(mine) == 0o700


def test_given_basetemp_is_made_private(temproot: Path) -> None:
    given = temproot / "given" / "bt"
    assert base_folder(config(str(given))) == given and mode(given) == 0o700


def test_a_link_or_a_file_in_place_of_the_run_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "distrank-link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError, match="is not a folder owned by the current user"):
        run_folder(tmp_path, "link")
    (tmp_path / "distrank-file").write_text("")
    with pytest.raises(OSError, match="is not a folder owned by the current user"):
        run_folder(tmp_path, "file")
    (tmp_path / "rank1.log").symlink_to(tmp_path / "target")
    with pytest.raises(OSError):
        open_log(str(tmp_path / "rank1.log"), append=True)
    assert not (tmp_path / "target").exists()

"""Unit: the "rerun just this test" command (pool/repro.py)."""

from __future__ import annotations

from pathlib import Path

from pytest_distrank.pool.repro import Repro, variables_read

SPAWN = """
import os
BACKEND = os.environ["BACKEND"]
if "WORLD_SIZE" not in os.environ or "TEMP_DIR" not in os.environ:
    raise RuntimeError("Missing expected env vars")
init = os.environ.get("INIT_METHOD", "env://")
debug = os.getenv('MY_DEBUG')
rank = os.environ["RANK"]  # the plugin's own: never in the command
port = os.environ.get("DISTRANK_RANK")
"""


def test_the_variables_a_file_reads_in_every_spelling() -> None:
    assert variables_read(SPAWN) == ("BACKEND", "WORLD_SIZE", "TEMP_DIR", "INIT_METHOD", "MY_DEBUG")


def test_the_command_carries_the_set_ones_quoted_and_the_seed(tmp_path: Path) -> None:
    test_file = tmp_path / "test_spawn.py"
    test_file.write_text(SPAWN)
    environ = {"BACKEND": "gloo", "WORLD_SIZE": "2", "TEMP_DIR": "/tmp/a b", "RANK": "0"}
    command = Repro("/repo").command(str(test_file), "test_spawn.py::T::test_x", 7, environ)
    assert command == (
        "cd /repo && BACKEND=gloo WORLD_SIZE=2 TEMP_DIR='/tmp/a b' pytest -p distrank "
        "--distrank-seed=7 test_spawn.py::T::test_x"
    )


def test_a_plain_file_and_no_seed(tmp_path: Path) -> None:
    test_file = tmp_path / "test_plain.py"
    test_file.write_text("def test_x():\n    pass\n")
    command = Repro("/repo").command(str(test_file), "test_plain.py::test_x", None, {})
    assert command == "cd /repo && pytest -p distrank test_plain.py::test_x"

"""Unit: which ``Work.wait()`` a standing-still rank may be accepted in (outcome/progress.py)."""

from __future__ import annotations

import pathlib

import pytest

from pytest_distrank.outcome.progress import waits_on_work


@pytest.mark.parametrize(
    ("call", "accepted"),
    [
        ("work.wait()", True),
        ("work.wait(timeout=timedelta(seconds=6))", False),  # attack n6: its own timeout
        ("work.wait(timedelta(seconds=5))", False),
        ("work.wait(", False),  # the arguments on the next lines: unseen
        ("time.sleep(1)", False),
    ],
)
def test_only_a_wait_without_its_own_timeout_is_accepted(
    tmp_path: pathlib.Path, call: str, accepted: bool
) -> None:
    test_file = tmp_path / "test_x.py"
    test_file.write_text(f"def test_x(rank):\n    {call}\n")
    dump = (
        "Current thread 0x00007f0000000002 (most recent call first):\n"
        f'  File "{test_file}", line 2 in test_x\n'
        '  File "/pkg/pytest_distrank/pool/worker.py", line 161 in rank_main\n'
    )
    said = waits_on_work(dump, str(test_file))
    assert said == ("Work.wait() in test_x at test_x.py:2" if accepted else "")

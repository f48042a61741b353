"""The built distributions: what ``pip install pytest-distrank`` gets.

Runs in the outer pytest process. Builds the sdist, and the wheel from it, with
``python -m build --no-isolation`` (``build``, ``setuptools`` and ``wheel`` from the ``test``
extra) out of a copy of the packaging inputs in a temporary folder, so that nothing is written
into the checkout (no ``build/``, no ``*.egg-info``) and no stale ``build/lib`` file can slip into
the wheel.
"""

from __future__ import annotations

import email.message
import email.parser
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import pytest_distrank

ROOT = Path(__file__).resolve().parents[2]  # this file is tests/e2e/test_packaging.py
PACKAGE = "pytest_distrank"
#: Bound on one build (about 2 s on 2 cores).
BUILD_TIMEOUT = 240

pytestmark = pytest.mark.timeout(BUILD_TIMEOUT + 60)


def _modules() -> set[str]:
    """The package's files in the checkout, as paths below the package: every module of every
    subpackage (so that a subpackage cannot silently drop out of the wheel), and ``py.typed``."""
    top = ROOT / PACKAGE
    files = {
        p.relative_to(top).as_posix() for p in top.rglob("*.py") if "__pycache__" not in p.parts
    }
    assert "plugin.py" in files and "__init__.py" in files
    return files | {"py.typed"}


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        ROOT / PACKAGE, source / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        cwd=source,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    wheels = list(out.glob("*.whl"))
    sdists = list(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in out.iterdir())
    return {"wheel": wheels[0], "sdist": sdists[0]}


def _metadata(text: str) -> email.message.Message:
    return email.parser.Parser().parsestr(text)


def test_wheel_holds_every_module_and_py_typed(dists: dict[str, Path]) -> None:
    version = pytest_distrank.__version__
    assert dists["wheel"].name == f"pytest_distrank-{version}-py3-none-any.whl"
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        names = set(wheel.namelist())
    packaged = {n.split("/", 1)[1] for n in names if n.startswith(f"{PACKAGE}/")}
    assert packaged == _modules()
    assert not [n for n in names if n.endswith(".pyc") or "tests/" in n]


def test_wheel_declares_the_pytest11_entry_point(dists: dict[str, Path]) -> None:
    version = pytest_distrank.__version__
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        text = wheel.read(f"pytest_distrank-{version}.dist-info/entry_points.txt").decode()
    sections: dict[str, dict[str, str]] = {}
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line.strip("[]")
        elif "=" in line:
            key, _, value = line.partition("=")
            sections.setdefault(section, {})[key.strip()] = value.strip()
    assert sections == {"pytest11": {"distrank": "pytest_distrank.plugin"}}


def test_wheel_metadata_has_the_readme_and_the_pytest_classifier(dists: dict[str, Path]) -> None:
    version = pytest_distrank.__version__
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        meta = _metadata(wheel.read(f"pytest_distrank-{version}.dist-info/METADATA").decode())
    assert meta["Name"] == "pytest-distrank"
    assert meta["Version"] == version
    assert "Framework :: Pytest" in meta.get_all("Classifier", [])
    assert meta["Requires-Python"] == ">=3.10"
    requires = meta.get_all("Requires-Dist", [])
    for dependency in ("torch", "pytest", "pytest-timeout"):
        assert any(r.split(">")[0].split(";")[0].strip() == dependency for r in requires)
    # The long description PyPI renders: the README, as Markdown.
    assert meta["Description-Content-Type"] == "text/markdown"
    body = meta.get_payload()
    assert isinstance(body, str)
    assert body.strip() == (ROOT / "README.md").read_text().strip()


def test_sdist_holds_the_sources_and_the_same_metadata(dists: dict[str, Path]) -> None:
    version = pytest_distrank.__version__
    top = f"pytest_distrank-{version}"
    with tarfile.open(dists["sdist"]) as sdist:
        names = {member.name for member in sdist.getmembers() if member.isfile()}
        pkg_info = sdist.extractfile(f"{top}/PKG-INFO")
        assert pkg_info is not None
        meta = _metadata(pkg_info.read().decode())
    for name in ("pyproject.toml", "README.md", "PKG-INFO"):
        assert f"{top}/{name}" in names
    prefix = f"{top}/{PACKAGE}/"
    packaged = {
        n.removeprefix(prefix) for n in names if n.startswith(prefix) and "__pycache__" not in n
    }
    assert packaged == _modules()
    assert meta["Description-Content-Type"] == "text/markdown"
    assert "# pytest-distrank" in str(meta.get_payload())
    assert "Framework :: Pytest" in meta.get_all("Classifier", [])

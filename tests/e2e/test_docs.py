"""Every Python example in README.md and docs/*.md is exercised by a test.

Runs in the outer pytest process; examples that are test files run in a ``pytester`` folder
through ``run_pytest`` (``pytest -p distrank`` in a subprocess, with the process-leak check).

The convention, for doc writers. The line right before a fenced ```python block is an HTML
comment (invisible on GitHub) that says what to do with the block:

``<!-- test: file=test_x.py outcomes=passed:2,skipped:1 -->``
    The block is a test file. It is written as ``test_x.py`` into an empty folder and run with
    ``pytest -p distrank``; the outcomes of its tests must be exactly these (keys: ``passed``,
    ``failed``, ``skipped``, ``errors``, ``xfailed``, and ``rerun``: attempts that
    pytest-rerunfailures repeated, checked only when given). Optional keys:
    ``args="-ra --distrank-failure-grace=1"`` extra command-line arguments;
    ``match="*root cause: rank 5/8*"`` a glob that some output line must match (repeatable);
    ``with=test_a.py`` also write the latest earlier block of the same page that was written as
    ``test_a.py`` (e.g. a second conftest.py beside the same test file);
    ``group=NAME`` run in one pytest session with the other blocks (of any page) of group NAME,
    to save a session start (~3 s); the outcomes are still checked per block, from the
    ``--junitxml`` report, and all blocks of a group must have the same ``args``. A group's
    blocks share one folder, so a group holds at most one ``conftest.py`` (checked: no file is
    written by two of its blocks), and what that conftest adds (fixtures, hooks) reaches every
    file of the group. The pages' groups: one per ``conftest.py`` that leaves the other examples
    alone (``fixtures``, ``reference``, ``failures``, ``hooks``), each with the examples without
    a conftest whose args it can take; the two conftests that break every pool's start run
    alone.
``<!-- test: conftest -->`` (or ``<!-- test: file=helper.py -->``, a file without outcomes)
    The block is a support file, written beside the next test-file block of the same page.
``<!-- test: compile -->``
    The block is only compiled: fragments, or code for libraries that are not installed
    (DeepSpeed).
``<!-- test: import -->``
    The block is compiled and its top level is executed (imports resolve, classes are built; no
    test runs), in a separate interpreter. For "before" examples on PyTorch's own harnesses,
    whose tests take too long to run here (14 s for one MultiProcessTestCase test).

Examples run as on a machine without GPUs: ``DISTRANK_FAKE_GPU_COUNT=0``, and no ``DISTRANK_*``
option variable is inherited, but for ``DISTRANK_REPLAY=off``: no replays of the examples that
fail on purpose (``args="--distrank-replay=on"`` turns them on). A block with no directive fails
``test_every_example_has_a_directive`` and its own test. Examples that show output or shell
commands are not ```python blocks and need no directive.

Also checked here: the relative links between README.md and the docs pages point at files and
headings that exist (docs/reference.md's names: tests/unit/test_reference_names.py).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import shlex
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_distrank.options import OPTIONS, REPLAY

from ..helpers import RunPytest, run_at_once

ROOT = Path(__file__).resolve().parents[2]  # this file is tests/e2e/test_docs.py
OUTCOME_KEYS = ("passed", "failed", "skipped", "errors", "xfailed", "rerun")
PYTHON_INFO = ("python", "py", "python3")
DIRECTIVE = re.compile(r"^<!--\s*test:(?P<body>.*?)-->$")
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
#: One interpreter imports all ``import`` blocks; bound on it.
IMPORT_TIMEOUT = 180
#: The junit report each run writes, beside the examples.
JUNIT = "distrank-docs-junit.xml"


@dataclasses.dataclass
class Directive:
    kind: str  # "run", "support", "compile" or "import"
    file: str = ""
    outcomes: dict[str, int] = dataclasses.field(default_factory=dict)
    args: tuple[str, ...] = ()
    group: str = ""
    with_files: tuple[str, ...] = ()
    match: tuple[str, ...] = ()


@dataclasses.dataclass
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    code: str
    directive: Directive | None = None
    error: str = ""
    #: For a run block: the files written for it, by name (support and ``with`` blocks, itself).
    files: dict[str, Block] = dataclasses.field(default_factory=dict)
    #: For a support block: the run block it is written beside.
    used_by: Block | None = None

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def run_key(self) -> str:
        assert self.directive is not None
        return f"group {self.directive.group}" if self.directive.group else self.id


def parse_directive(body: str) -> Directive:
    """``file=test_x.py outcomes=passed:2 args="-ra"`` -> a Directive; ValueError if malformed."""
    tokens = shlex.split(body)
    if tokens in (["compile"], ["import"]):
        return Directive(tokens[0])
    if tokens == ["conftest"]:
        return Directive("support", file="conftest.py")
    values: dict[str, str] = {}
    match: list[str] = []
    for token in tokens:
        key, sep, value = token.partition("=")
        if not sep or key not in ("file", "outcomes", "args", "group", "with", "match"):
            raise ValueError(
                f"unknown part {token!r}; expected compile, import, conftest, or "
                "file=, outcomes=, args=, group=, with=, match="
            )
        if key == "match":
            match.append(value)
        elif key in values:
            raise ValueError(f"{key}= given twice")
        else:
            values[key] = value
    name = values.get("file", "")
    if not re.fullmatch(r"[A-Za-z_][\w.]*\.py", name):
        raise ValueError(f"file= must name a .py file in the test folder, got {name!r}")
    if "outcomes" not in values:
        if set(values) != {"file"} or match:
            raise ValueError("a support file (no outcomes=) takes only file=")
        return Directive("support", file=name)
    outcomes: dict[str, int] = {}
    for part in values["outcomes"].split(","):
        key, sep, count = part.partition(":")
        if key not in OUTCOME_KEYS or not sep or not count.isdigit() or key in outcomes:
            raise ValueError(f"bad outcomes part {part!r}; expected e.g. passed:2,skipped:1")
        outcomes[key] = int(count)
    if not any(outcomes.values()):
        raise ValueError("outcomes= must expect at least one test")
    with_files = tuple(f for f in values.get("with", "").split(",") if f)
    return Directive(
        "run",
        file=name,
        outcomes=outcomes,
        args=tuple(shlex.split(values.get("args", ""))),
        group=values.get("group", ""),
        with_files=with_files,
        match=tuple(match),
    )


def scan(text: str, page: str) -> list[Block]:
    """The ```python blocks of one Markdown page, with their directives parsed."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        end = i + 1
        while end < len(lines):
            stripped = lines[end].strip()
            if stripped and set(stripped) == {fence[0]} and len(stripped) >= len(fence):
                break
            end += 1
        info = opening["info"].strip().split(" ")[0].lower()
        if info in PYTHON_INFO:
            body = [ln[indent:] if not ln[:indent].strip() else ln for ln in lines[i + 1 : end]]
            block = Block(page, i + 1, "\n".join(body) + "\n")
            previous = DIRECTIVE.match(lines[i - 1].strip()) if i > 0 else None
            if previous is None:
                block.error = "no <!-- test: ... --> directive on the line before the block"
            else:
                try:
                    block.directive = parse_directive(previous["body"])
                except ValueError as exc:
                    block.error = f"bad directive: {exc}"
            blocks.append(block)
        i = end + 1
    _link(blocks)
    return blocks


def _link(blocks: list[Block]) -> None:
    """Attach support blocks and ``with=`` files to the run blocks of one page."""
    pending: list[Block] = []
    written: dict[str, Block] = {}
    for block in blocks:
        d = block.directive
        if d is None:
            continue
        if d.kind == "support":
            pending.append(block)
        elif d.kind == "run":
            for name in d.with_files:
                if name not in written:
                    block.error = f"with={name}: no earlier block of this page is {name}"
                else:
                    block.files[name] = written[name]
            for support in pending:
                block.files[support.directive.file] = support  # type: ignore[union-attr]
                support.used_by = block
            pending = []
            block.files[d.file] = block
        if d.kind in ("support", "run"):
            written[d.file] = block
    for support in pending:
        support.error = "a support file with no test-file block after it on its page"


def all_blocks() -> list[Block]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    blocks = [b for p in pages for b in scan(p.read_text(), p.relative_to(ROOT).as_posix())]
    _check_groups(blocks)
    return blocks


def _check_groups(blocks: list[Block]) -> None:
    groups: dict[str, list[Block]] = collections.defaultdict(list)
    for block in blocks:
        if block.directive is not None and block.directive.kind == "run" and not block.error:
            groups[block.run_key].append(block)
    for members in groups.values():
        files: dict[str, Block] = {}
        for block in members:
            assert block.directive is not None
            if block.directive.args != members[0].directive.args:  # type: ignore[union-attr]
                block.error = f"its group's blocks must have the same args= as {members[0].id}"
            for name, source in block.files.items():
                if files.setdefault(name, source) is not source:
                    block.error = f"{name} is written by two blocks of its group"


BLOCKS = all_blocks()


def test_every_example_has_a_directive() -> None:
    """No ```python block of README.md or docs/*.md goes untested, and every directive parses."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    fences = sum(
        len(re.findall(r"^[ \t]*(?:```|~~~)(?:python3?|py)(?:[ \t].*)?$", p.read_text(), re.M))
        for p in pages
    )
    assert len(BLOCKS) == fences, "the scanner missed a ```python block"
    assert {"README.md", "docs/reference.md", "docs/migration.md"} <= {b.page for b in BLOCKS}
    problems = [f"{b.id}: {b.error}" for b in BLOCKS if b.error]
    assert not problems, "\n".join(problems)


def test_scanner_finds_blocks_and_reports_missing_directives() -> None:
    page = textwrap.dedent(
        """\
        text
        <!-- test: conftest -->
        ```python
        import pytest
        ```
        <!-- test: file=test_a.py outcomes=passed:1 args="-ra -x" match="*1 passed*" group=g -->
        ```python
        def test_a():
            pass
        ```
        ```console
        $ pytest
        ```
        - item

          ```python
          x = 1
          ```
        <!-- test: file=test_b.py outcomes=passed -->
        ```py
        y = 2
        ```
        <!-- test: conftest -->
        ```python
        z = 3
        ```
        """
    )
    support, run, bare, malformed, orphan = scan(page, "page.md")
    assert (support.line, run.line, bare.line, malformed.line) == (3, 7, 16, 20)
    assert run.directive == Directive(
        "run", "test_a.py", {"passed": 1}, ("-ra", "-x"), "g", (), ("*1 passed*",)
    )
    assert run.files == {"conftest.py": support, "test_a.py": run}
    assert support.used_by is run and not support.error and not run.error
    assert bare.code == "x = 1\n" and "no <!-- test:" in bare.error
    assert "bad outcomes part 'passed'" in malformed.error
    assert "no test-file block after it" in orphan.error


def test_scanner_links_with_files_and_checks_groups() -> None:
    page = textwrap.dedent(
        """\
        <!-- test: file=test_a.py outcomes=errors:1 group=g -->
        ```python
        a = 1
        ```
        <!-- test: file=conftest.py with=test_a.py outcomes=errors:1 -->
        ```python
        b = 2
        ```
        <!-- test: file=test_c.py with=test_missing.py outcomes=passed:1 -->
        ```python
        c = 3
        ```
        <!-- test: file=test_a.py outcomes=passed:1 group=g -->
        ```python
        d = 4
        ```
        """
    )
    first, second, third, fourth = blocks = scan(page, "page.md")
    assert second.files == {"test_a.py": first, "conftest.py": second}
    assert "with=test_missing.py: no earlier block" in third.error
    _check_groups(blocks)
    assert not first.error and not second.error
    assert fourth.error == "test_a.py is written by two blocks of its group"
    assert first.run_key == fourth.run_key == "group g" and second.run_key == "page.md:6"


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_relative_links_resolve() -> None:
    """Links between README.md and the docs pages point at files and headings that exist."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    anchors: dict[Path, set[str]] = {}
    for page in pages:
        text = re.sub(r"^[ \t]*```.*?^[ \t]*```", "", page.read_text(), flags=re.M | re.S)
        anchors[page] = {_slug(h) for h in re.findall(r"^#+ (.*)$", text, flags=re.M)}
    broken = []
    links = 0
    for page in pages:
        text = re.sub(r"^[ \t]*```.*?^[ \t]*```", "", page.read_text(), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            links += 1
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors.get(dest, set()):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert links > 20
    assert not broken, "\n".join(broken)


@dataclasses.dataclass
class RunOutcome:
    """One pytest session over the files of a run block, or of a whole group."""

    by_file: dict[str, collections.Counter[str]]
    totals: dict[str, int]
    lines: list[str]
    error: str = ""


_RUNS: dict[str, RunOutcome] = {}
_IMPORTS: dict[str, str] = {}


def _junit_outcomes(path: Path) -> dict[str, collections.Counter[str]]:
    """Outcomes per test file, from a junitxml report of tests in the folder's top level."""
    by_file: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    cases = list(ET.parse(path).getroot().iter("testcase"))
    names = [(case.get("classname", ""), case.get("name", "")) for case in cases]
    for i, case in enumerate(cases):
        module = case.get("classname", "").split(".")[0] or case.get("name", "")
        counts = by_file[f"{module}.py"]
        if names[i] in names[i + 1 :]:
            counts["rerun"] += 1  # an earlier attempt of a test that pytest-rerunfailures reran
            continue
        kinds = [(child.tag, child.get("type", ""), child.get("message", "")) for child in case]
        for tag, _, _ in kinds:
            if tag in ("failure", "error"):
                counts["failed" if tag == "failure" else "errors"] += 1
        tags = {tag for tag, _, _ in kinds}
        if "skipped" in tags:
            xfail = any(t == "skipped" and typ == "pytest.xfail" for t, typ, _ in kinds)
            counts["xfailed" if xfail else "skipped"] += 1
        elif "failure" not in tags and not any(
            tag == "error" and message.startswith("failed on setup") for tag, _, message in kinds
        ):
            counts["passed"] += 1
    return by_file


def _run(block: Block, request: pytest.FixtureRequest) -> RunOutcome:
    """Run the block's session (its group's, if it has one) once; later members reuse it."""
    key = block.run_key
    if key in _RUNS:
        return _RUNS[key]
    members = [b for b in BLOCKS if b.directive is not None and b.directive.kind == "run"]
    members = [b for b in members if b.run_key == key]
    pytester: pytest.Pytester = request.getfixturevalue("pytester")
    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    run_pytest: RunPytest = request.getfixturevalue("run_pytest")
    for option in OPTIONS:
        monkeypatch.delenv(option.env, raising=False)
    monkeypatch.setenv(REPLAY.env, "off")  # as in run_pytest: the examples fail on purpose
    for name in ("PYTEST_TIMEOUT", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DISTRANK_FAKE_GPU_COUNT", "0")
    for member in members:
        for name, source in member.files.items():
            (pytester.path / name).write_text(source.code)
    assert block.directive is not None
    _RUNS[key] = outcome = RunOutcome({}, {}, [])
    try:
        result = run_pytest(*block.directive.args, f"--junitxml={pytester.path / JUNIT}")
    except Exception as exc:  # a timeout: every block of the session fails with it, once
        outcome.error = f"the session of {key} did not finish: {exc!r}"
        return outcome
    outcome.lines = result.outlines
    try:
        outcome.totals = result.parseoutcomes()
        outcome.by_file = _junit_outcomes(pytester.path / JUNIT)
    except (ValueError, OSError, ET.ParseError) as exc:
        outcome.error = f"the session of {key} gave no outcomes ({exc}); its output:\n" + (
            "\n".join(result.outlines + result.errlines)
        )
    return outcome


def _check_run(block: Block, request: pytest.FixtureRequest) -> None:
    assert block.directive is not None
    outcome = _run(block, request)
    output = "\n".join(outcome.lines)
    assert not outcome.error, outcome.error
    got: collections.Counter[str] = collections.Counter()
    for name in block.files:
        got.update(outcome.by_file.get(name, collections.Counter()))
    if "rerun" not in block.directive.outcomes:
        del got["rerun"]
    expected = {k: v for k, v in block.directive.outcomes.items() if v}
    assert dict(+got) == expected, f"outcomes of {sorted(block.files)}; the output:\n{output}"
    members = [b for b in BLOCKS if b.directive is not None and b.directive.kind == "run"]
    total: collections.Counter[str] = collections.Counter()
    for member in members:
        if member.run_key == block.run_key:
            assert member.directive is not None
            total.update(member.directive.outcomes)
    seen = {("errors" if k == "error" else k): v for k, v in outcome.totals.items()}
    seen = {k: v for k, v in seen.items() if k in OUTCOME_KEYS and v}
    if "rerun" not in total:
        seen.pop("rerun", None)
    assert seen == dict(+total), f"the session's summary line; the output:\n{output}"
    matcher = pytest.LineMatcher(outcome.lines)
    for pattern in block.directive.match:
        matcher.fnmatch_lines([pattern])


IMPORT_SCRIPT = """
import json, runpy, sys, traceback
errors = {}
for path in sys.argv[1:]:
    try:
        runpy.run_path(path, run_name="doc_example")
    except BaseException:
        errors[path] = traceback.format_exc()
print(json.dumps(errors))
"""


def _check_import(block: Block, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Execute the top level of every ``import`` block, all in one interpreter (forked from the
    suite's zygote, ``helpers.run_at_once``), once."""
    if not _IMPORTS:
        folder = tmp_path_factory.mktemp("doc-imports")
        paths = {}
        for i, other in enumerate(b for b in BLOCKS if b.directive == Directive("import")):
            path = folder / f"example_{i}.py"
            path.write_text(other.code)
            paths[str(path)] = other.id
        (folder / "doc_imports.py").write_text(IMPORT_SCRIPT)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        output = folder / "doc_imports.out"
        command = [sys.executable, "-m", "doc_imports", *paths]
        codes = run_at_once([command], [env], folder, [output], IMPORT_TIMEOUT)
        assert codes == [0], output.read_text()
        errors = json.loads(output.read_text().splitlines()[-1])
        _IMPORTS.update({paths[p]: errors.get(p, "") for p in paths})
    assert block.id in _IMPORTS
    assert not _IMPORTS[block.id], _IMPORTS[block.id]


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_example(
    block: Block, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    assert not block.error, block.error
    assert block.directive is not None
    compile(block.code, block.id, "exec")
    if block.directive.kind == "support":
        assert block.used_by is not None
        assert block.used_by.files.get(block.directive.file) is block
    elif block.directive.kind == "import":
        _check_import(block, tmp_path_factory)
    elif block.directive.kind == "run":
        _check_run(block, request)

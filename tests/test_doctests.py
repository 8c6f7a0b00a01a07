"""Every docstring example in the package runs as a doctest and checks its output.

Examples are Google-style ``Example:`` sections with ``>>>`` lines (an RST ``Example::``
literal block would be shown but never run, so none is allowed). Each module with examples
runs in-process under the suite's warnings-as-errors, in a temporary directory (examples
may write ``runs/...``), with ``NORMALIZE_WHITESPACE | ELLIPSIS``.
"""

from __future__ import annotations

import doctest
import importlib
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "noetherflow"
FLAGS = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS
# modules whose examples need an optional extra: skipped when it is not installed
EXTRAS = {"noetherflow.integrations.lightning": "lightning"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, str]:
    return {_module_name(p): p.read_text(encoding="utf-8") for p in sorted(PACKAGE.rglob("*.py"))}


WITH_EXAMPLES = sorted(name for name, text in _sources().items() if ">>>" in text)


def _example_sections(text: str) -> list[tuple[int, str]]:
    """(line number, body) of every Google ``Example:``/``Examples:`` section."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        m = re.fullmatch(r"( *)Examples?:\s*", line)
        if m:
            indent = len(m.group(1))
            body = []
            for nxt in lines[i + 1 :]:
                if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                    break
                body.append(nxt)
            out.append((i + 1, "\n".join(body)))
    return out


def test_examples_are_doctests() -> None:
    """No RST ``Example::`` literal block; every ``Example:`` section has ``>>>`` lines."""
    problems = []
    for name, text in _sources().items():
        for m in re.finditer(r"Examples?::", text):
            problems.append(f"{name}:{text[: m.start()].count(chr(10)) + 1} (Example::)")
        for line, body in _example_sections(text):
            if not re.search(r"^\s*>>> ", body, re.M):
                problems.append(f"{name}:{line} (no >>> in the section)")
    assert problems == [], f"examples that would not run as doctests: {problems}"
    assert {"noetherflow.symmetry.detect", "noetherflow.stats.collect"} <= set(WITH_EXAMPLES)


@pytest.mark.parametrize("name", WITH_EXAMPLES)
def test_docstring_examples_run(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if name in EXTRAS:
        pytest.importorskip(EXTRAS[name])
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(name)
    tests = [t for t in doctest.DocTestFinder().find(module, name) if t.examples]
    assert tests, f"{name} has '>>>' in its source but no docstring example was found"
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    report: list[str] = []
    for test in tests:
        runner.run(test, out=report.append)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, "".join(report)
    assert result.attempted > 0


def test_doctest_runner_catches_a_wrong_output() -> None:
    """The runner above fails on a wrong expected output (the tests can fail)."""
    parser = doctest.DocTestParser()
    test = parser.get_doctest(">>> 1 + 1\n3\n", {}, "wrong", None, 0)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    report: list[str] = []
    runner.run(test, out=report.append)
    assert runner.summarize(verbose=False).failed == 1 and "Expected" in "".join(report)

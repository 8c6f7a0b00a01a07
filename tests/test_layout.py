"""The package's layout rules: no module above 700 lines, ``theory/`` independent of the library.

``noetherflow.theory`` is the oracle the library's measurements are checked against, so it may
import the standard library, torch and itself, never the code it checks.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import noetherflow.theory.ziyin2024 as th

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "noetherflow"
MAX_LINES = 700


def test_no_module_above_700_lines() -> None:
    sizes = {
        str(p.relative_to(PACKAGE)): len(p.read_text(encoding="utf-8").splitlines())
        for p in PACKAGE.rglob("*.py")
    }
    assert len(sizes) > 50
    too_long = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert too_long == {}, f"split these modules (at most {MAX_LINES} lines): {too_long}"


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
        elif isinstance(node, ast.ImportFrom):
            raise AssertionError(f"{path.name}: use absolute imports in theory/")
    return out


def test_theory_imports_nothing_from_the_library() -> None:
    files = sorted((PACKAGE / "theory").rglob("*.py"))
    assert len(files) >= 3
    for path in files:
        for name in _imports(path):
            if name.split(".")[0] == "noetherflow":
                assert name.startswith("noetherflow.theory"), f"{path.name} imports {name}"


def test_theory_names_are_importable_from_ziyin2024() -> None:
    import noetherflow.theory as theory

    assert set(theory.__all__) == set(th.__all__)
    for name in th.__all__:
        assert getattr(th, name) is getattr(theory, name)
        obj = getattr(th, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert obj.__module__.startswith("noetherflow.theory.ziyin2024"), name

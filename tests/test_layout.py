"""The package's layout rules: modules of at most 700 lines, no formatter escapes, theory apart.

``noetherflow.theory`` is the oracle the library's measurements are checked against, so it may
import the standard library, torch and itself, never the code it checks.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import noetherflow.theory.ziyin2024 as th

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "noetherflow"
# The rest of the project's Python is formatted normally too (aligned tables are not a reason).
OTHER_CODE = ("tests", "benchmarks", "examples", "docs")
MAX_LINES = 700


def test_no_module_above_700_lines() -> None:
    sizes = {
        str(p.relative_to(PACKAGE)): len(p.read_text(encoding="utf-8").splitlines())
        for p in PACKAGE.rglob("*.py")
    }
    assert len(sizes) > 50
    too_long = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert too_long == {}, f"split these modules (at most {MAX_LINES} lines): {too_long}"


def formatter_escapes(root: Path) -> dict[str, list[int]]:
    """Lines with ``# fmt: skip`` / ``# fmt: off`` per module: a size rule is met by splitting."""
    out: dict[str, list[int]] = {}
    for p in sorted(root.rglob("*.py")):
        lines = p.read_text(encoding="utf-8").splitlines()
        hits = [i for i, line in enumerate(lines, 1) if re.search(r"#\s*fmt:\s*(skip|off)", line)]
        if hits:
            out[str(p.relative_to(root))] = hits
    return out


def test_no_formatter_escapes_in_the_package(tmp_path: Path) -> None:
    assert formatter_escapes(PACKAGE) == {}, "format normally; split a module by meaning"
    for folder in OTHER_CODE:
        found = formatter_escapes(REPO / folder)
        found.pop("test_layout.py", None)  # this file names the markers it looks for
        assert found == {}, f"{folder}/: format normally instead of {found}"
    (tmp_path / "m.py").write_text("x = [1,2]  # fmt: skip\n# fmt: off\ny = 1\n")
    assert formatter_escapes(tmp_path) == {"m.py": [1, 2]}


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


def test_public_api_is_the_stub() -> None:
    """``noetherflow.__all__`` (attached lazily) is the stub's ``__all__``, every name resolves."""
    import noetherflow

    tree = ast.parse((PACKAGE / "__init__.pyi").read_text(encoding="utf-8"))
    (listed,) = [
        ast.literal_eval(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "__all__"
    ]
    assert sorted(listed) == sorted(noetherflow.__all__)
    assert len(set(listed)) == len(listed)
    for name in listed:
        assert getattr(noetherflow, name) is not None, name
    import noetherflow.teleportation.apply  # the package (not named `teleport`) shadows nothing

    assert callable(noetherflow.teleport) and noetherflow.teleport.__name__ == "teleport"
    assert noetherflow.teleport is noetherflow.teleportation.apply.teleport


def test_help_and_version_do_not_import_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from noetherflow.cli import main\n"
        "for argv in (['--version'], ['--help'], ['reproduce', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, (argv, e.code)\n"
        "heavy = sorted(m for m in ('torch', 'numpy', 'matplotlib') if m in sys.modules)\n"
        "print(','.join(heavy) or 'none')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "none", out.stdout
    assert "noetherflow 0.1.0" in out.stdout

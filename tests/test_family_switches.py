"""No module tests which symmetry family it holds, outside that family's own files (#27).

What a caller needs to know about a family is a capability of the symmetry
(``commuting``, ``scale_invariant``, ``needs_zero_eps``, ``normalisation``, ``acted_axes``)
or of its kernel (``joint``, ``can_hold``, ``incremental``). The guard reads the syntax tree of
every library module (the reproduction scripts in ``experiments/`` build their own models and
are not library code) and finds any spelling of a family switch:

- ``isinstance`` / ``issubclass`` / ``type(x) is`` on a class of a family, a kernel or a
  statistics block (every subclass of ``Symmetry``, ``Kernel`` and ``StatsBlock`` that the
  package defines) outside the module defining that class;
- a comparison involving ``.family`` (``s.family is Family.SCALE``, ``family.value == "scale"``)
  or a ``Family`` constant;
- the retired flag ``.is_diagonal``.

The detection matchers construct proposals *of* a family (``Family.ROTATION`` as an argument):
that names a family, it does not branch on one, and is allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import noetherflow as nf
from noetherflow.kernels import Kernel, StatsBlock
from noetherflow.symmetry.base import Family, Symmetry

ROOT = Path(nf.__file__).resolve().parent


def _family_classes() -> dict[str, str]:
    """Class name → the module file (relative to the package) that defines it.

    Every subclass of the three interfaces, ``DiagonalSymmetry`` included; not the interfaces
    (``isinstance(x, Symmetry)`` checks an argument's type, it does not pick a family).
    """
    for name in nf.__all__:  # import every public module (the API is attached lazily)
        getattr(nf, name)
    out: dict[str, str] = {}
    todo = [Symmetry, Kernel, StatsBlock]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("noetherflow."):
                rel = sub.__module__.removeprefix("noetherflow.").replace(".", "/") + ".py"
                out[sub.__name__] = rel
    return out  # the interfaces themselves (isinstance(x, Symmetry): a type check) are not


def _names(node: ast.AST) -> set[str]:
    """Terminal names of a class expression (``A``, ``mod.A``, ``(A, B)``)."""
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    if isinstance(node, ast.Tuple):
        return set().union(*(_names(e) for e in node.elts))
    return set()


def _mentions_family(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr == "family":
            return True
        if (
            isinstance(sub, ast.Attribute)
            and isinstance(sub.value, ast.Name)
            and sub.value.id == "Family"
        ):
            return True
    return False


def switches(source: str, rel: str, classes: dict[str, str]) -> list[str]:
    """``rel:line what`` for every family switch in ``source`` (module ``rel``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") in (
            "isinstance",
            "issubclass",
        ):
            if len(node.args) == 2:
                for name in _names(node.args[1]):
                    if name in classes and classes[name] != rel:
                        found.append(f"{rel}:{node.lineno} {node.func.id}(…, {name})")  # type: ignore[attr-defined]
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_mentions_family(o) for o in operands):
                found.append(f"{rel}:{node.lineno} compares a family")
            for o in operands:
                if (
                    isinstance(o, ast.Call)
                    and getattr(o.func, "id", "") == "type"
                    and any(n in classes for c in operands for n in _names(c))
                ):
                    found.append(f"{rel}:{node.lineno} type(…) against a family class")
        elif isinstance(node, ast.Attribute) and node.attr == "is_diagonal":
            found.append(f"{rel}:{node.lineno} .is_diagonal")
    return found


def test_no_family_switch_outside_the_families() -> None:
    classes = _family_classes()
    assert {"Rescaling", "ScaleInvariance", "DoubleRotation", "DiagonalKernel"} <= set(classes)
    bad = []
    for f in sorted(ROOT.rglob("*.py")):
        rel = f.relative_to(ROOT).as_posix()
        if rel.startswith("experiments/") or rel == "symmetry/base.py":
            continue
        bad += switches(f.read_text(encoding="utf-8"), rel, classes)
    assert bad == []


@pytest.mark.parametrize(
    "code",
    [
        "isinstance(s, ScaleInvariance)",
        "isinstance(k, (int, DiagonalKernel))",
        "isinstance(b, kernels.diagonal.DiagonalStats)",
        "s.family is Family.SCALE",
        "s.family.value == 'scale'",
        "s.family == 'rotation'",
        "s.is_diagonal",
        "type(s) is DoubleRotation",
    ],
)
def test_the_guard_catches_every_spelling(code: str) -> None:
    assert switches(code, "monitor/x.py", _family_classes()) != []


def test_the_guard_allows_capabilities_and_own_module() -> None:
    classes = _family_classes()
    ok = "s.commuting and s.scale_invariant and kernel_for(s).incremental\nf(Family.ROTATION)"
    assert switches(ok, "monitor/x.py", classes) == []
    assert switches("isinstance(b, DiagonalStats)", classes["DiagonalStats"], classes) == []


def test_family_is_an_open_identity() -> None:
    mine = Family("my-family")
    assert mine == "my-family" and mine.value == "my-family" and Family.SCALE == "scale"
    assert isinstance(Family.ROTATION, Family)
    with pytest.raises(ValueError, match="non-empty name"):
        Family("")

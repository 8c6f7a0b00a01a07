"""No module tests which symmetry family it holds, outside that family's own files (#27).

What a caller needs to know about a family is a capability of the symmetry
(``commuting``, ``scale_invariant``, ``needs_zero_eps``, ``normalisation``, ``acted_axes``)
or of its kernel (``joint``, ``can_hold``, ``incremental``). The guard reads the syntax tree of
every library module (the reproduction scripts in ``experiments/`` build their own models and
are not library code) and finds any spelling of a family switch:

- ``isinstance`` / ``issubclass`` / ``type(x) is`` on a class of a family, a kernel or a
  statistics block (every subclass of ``Symmetry``, ``Kernel`` and ``StatsBlock`` that the
  package defines) outside the module defining that class;
- ``isinstance`` through a tuple, ``A | B``, ``Union[A, B]`` or an import alias;
- ``type(x)`` / ``x.__class__`` (or their ``__name__``) compared with such a class or its name;
- a comparison involving ``.family``, ``family.value``, ``getattr(x, "family")``, a
  ``Family`` constant (``s.family is Family.SCALE``, ``family.value == "scale"``), or a local
  ``family`` compared with a family's name (``family == "rotation"``; ``family == "sgd"``, an
  optimizer's, is not one);
- a ``match`` on a family, or a ``case`` on a family class or constant;
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


def _names(node: ast.AST, alias: dict[str, str] | None = None) -> set[str]:
    """Terminal names of a class expression (``A``, ``mod.A``, ``(A, B)``, ``A | B``), with
    import aliases (``from … import A as B``) resolved."""
    alias = alias or {}
    if isinstance(node, ast.Name):
        return {alias.get(node.id, node.id)}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*(_names(e, alias) for e in node.elts))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _names(node.left, alias) | _names(node.right, alias)
    if isinstance(node, ast.Subscript):  # Union[A, B], tuple[A, ...]
        return _names(node.slice, alias)
    return set()


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name → imported name, for ``import``/``from … import`` with ``as``."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for a in node.names:
                if a.asname:
                    out[a.asname] = a.name.rsplit(".", 1)[-1]
    return out


def _family_names() -> set[str]:
    """The names of the families the package defines (``"rescaling"``, ``"scale"`` …)."""
    names = {str(f) for f in (Family.RESCALING, Family.SCALE, Family.ROTATION, Family.DENSE)}
    todo: list[type] = [Symmetry]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if isinstance(getattr(cls, "family", None), str):
            names.add(str(cls.family))  # type: ignore[attr-defined]
    return names


def _mentions_family(node: ast.AST) -> bool:
    """``x.family``, ``Family.X``, ``Family(...)``, ``getattr(x, "family")``, ``family.value``."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr == "family":
            return True
        if isinstance(sub, ast.Name) and sub.id == "Family":
            return True
        if isinstance(sub, ast.Constant) and sub.value == "family":  # getattr(s, "family")
            return True
        if (
            isinstance(sub, ast.Attribute)
            and sub.attr == "value"
            and isinstance(sub.value, ast.Name)
            and sub.value.id == "family"
        ):
            return True
    return False


def _local_family(operands: list[ast.expr]) -> bool:
    """A local named ``family`` compared with a family's name (``family == "rotation"``); a
    local of another meaning (an optimizer family ``"sgd"``) is not a family switch."""
    if not any(isinstance(o, ast.Name) and o.id == "family" for o in operands):
        return False
    texts = {
        c.value
        for o in operands
        for c in ast.walk(o)
        if isinstance(c, ast.Constant) and isinstance(c.value, str)
    }
    return bool(texts & _family_names())


def _mentions_class(node: ast.AST) -> bool:
    """``type(x)``/``x.__class__`` (or its ``__name__``/``__qualname__``) is involved."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and getattr(sub.func, "id", "") == "type":
            return True
        if isinstance(sub, ast.Attribute) and sub.attr == "__class__":
            return True
    return False


def switches(source: str, rel: str, classes: dict[str, str]) -> list[str]:
    """``rel:line what`` for every family switch in ``source`` (module ``rel``)."""
    tree = ast.parse(source)
    alias = _aliases(tree)
    foreign = {n for n, where in classes.items() if where != rel}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") in (
            "isinstance",
            "issubclass",
        ):
            if len(node.args) == 2:
                for name in sorted(_names(node.args[1], alias) & foreign):
                    found.append(f"{rel}:{node.lineno} {node.func.id}(…, {name})")  # type: ignore[attr-defined]
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_mentions_family(o) for o in operands) or _local_family(operands):
                found.append(f"{rel}:{node.lineno} compares a family")
            if any(_mentions_class(o) for o in operands):
                named = set().union(*(_names(o, alias) for o in operands))
                texts = {
                    c.value
                    for o in operands
                    for c in ast.walk(o)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                }
                if (named | texts) & foreign:
                    found.append(f"{rel}:{node.lineno} type(…) against a family class")
        elif isinstance(node, ast.Match):
            if _mentions_family(node.subject):
                found.append(f"{rel}:{node.lineno} match on a family")
            for case in node.cases:
                for pat in ast.walk(case.pattern):
                    if isinstance(pat, ast.MatchClass) and _names(pat.cls, alias) & foreign:
                        found.append(f"{rel}:{case.pattern.lineno} case on a family class")
                    if isinstance(pat, ast.MatchValue) and _mentions_family(pat.value):
                        found.append(f"{rel}:{case.pattern.lineno} case on a family")
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
        # the spellings issue #27 found
        "isinstance(s, ScaleInvariance)",
        "isinstance(k, DiagonalKernel)",
        "isinstance(b, DiagonalStats)",
        "s.is_diagonal",
        "family is Family.SCALE",
        "family.value == 'scale'",
        # and their variants
        "isinstance(k, (int, DiagonalKernel))",
        "isinstance(b, kernels.diagonal.DiagonalStats)",
        "isinstance(s, Rescaling | ChannelRescaling)",
        "isinstance(s, Union[Rescaling, ScaleInvariance])",
        "from noetherflow.kernels.diagonal import DiagonalKernel as DK\nisinstance(k, DK)",
        "issubclass(type(s), DoubleRotation)",
        "s.family is Family.SCALE",
        "s.family.value == 'scale'",
        "s.family == 'rotation'",
        "family == 'rotation'",
        "s.family in (Family.SCALE, Family.RESCALING)",
        "family in ('scale', 'rescaling')",
        "kernel_for(s).block.family != Family.ROTATION",
        "getattr(s, 'family') == 'scale'",
        "type(s) is DoubleRotation",
        "type(s) == ScaleInvariance",
        "type(s) in (Rescaling, ScaleInvariance)",
        "type(s).__name__ == 'Rescaling'",
        "s.__class__ is DoubleRotation",
        "s.__class__.__name__ in ('ScaleInvariance', 'x')",
        "match s:\n    case ScaleInvariance():\n        pass",
        "match s.family:\n    case 'scale':\n        pass",
        "match x:\n    case Family.SCALE:\n        pass",
    ],
)
def test_the_guard_catches_every_spelling(code: str) -> None:
    assert switches(code, "monitor/x.py", _family_classes()) != []


def test_the_guard_allows_capabilities_and_own_module() -> None:
    classes = _family_classes()
    ok = "s.commuting and s.scale_invariant and kernel_for(s).incremental\nf(Family.ROTATION)"
    assert switches(ok, "monitor/x.py", classes) == []
    ok = "isinstance(s, Symmetry)\ntype(x) is int\ntype(m).__name__ == 'Linear'\nfamily == 'sgd'"
    assert switches(ok, "monitor/x.py", classes) == []
    assert switches("isinstance(b, DiagonalStats)", classes["DiagonalStats"], classes) == []


def test_family_is_an_open_identity() -> None:
    mine = Family("my-family")
    assert mine == "my-family" and mine.value == "my-family" and Family.SCALE == "scale"
    assert isinstance(Family.ROTATION, Family)
    with pytest.raises(ValueError, match="non-empty name"):
        Family("")

"""Imports go only downward: the stated layer order of ARCHITECTURE.md holds in every module.

Each top-level part of ``src/noetherflow`` (a package or a module) has a layer; a module may
import its own part and any part of a lower or equal layer, never a higher one. A function-
level (lazy) import upward is allowed only where :data:`LAZY_UP` lists it with its reason;
an upward import at module level never is. Read from the syntax tree, nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "noetherflow"

# Bottom to top; one line per layer. Private top-level modules (``_checks``, ``_errors``,
# ``_inputs``, …) are layer 0 unless named in a layer, with ``theory`` (the oracle,
# tests/test_layout.py keeps it independent). ``noetherflow`` itself (the lazily attached
# public API) sits below the parts that use it as a user would.
LAYERS: list[tuple[str, ...]] = [
    ("<private>", "theory"),
    ("symmetry",),  # group actions, detection
    ("stats",),  # raw material: hooks, per-sample gradients, GradStats, the block registry
    ("kernels",),  # one family's noise physics per module
    ("flow",),
    ("optim",),  # optimizers beyond SGD: NoiseModel.from_optimizer, step decomposition
    # _sweep_plan: the sweep order; _solve_checks: solve_equilibrium's argument checks;
    # _anderson: the sweeps' acceleration
    ("equilibrium", "_sweep_plan", "_solve_checks", "solve_options", "_anderson"),
    ("sharpness",),
    ("teleportation",),  # apply, check, eps, optimizer state, the training tool
    ("baselines",),
    ("plotting",),
    ("monitor",),
    ("integrations",),
    ("train", "<api>"),  # simulators; the public API
    ("experiments",),
    ("report",),
    ("demo", "cli", "__main__"),
]

# (importing module, imported module) → why a function-level import goes up.
LAZY_UP: dict[tuple[str, str], str] = {
    ("noetherflow._checks", "noetherflow.symmetry.set"): (
        "check_model_and_set names SymmetrySet; symmetry imports _checks at module level"
    ),
    ("noetherflow.stats.core", "noetherflow.optim.groups"): (
        "with_displacement(displacement=opt) reads the SGD's groups; optim builds on stats"
    ),
    ("noetherflow.stats.core", "noetherflow.optim.momentum"): (
        "with_displacement(displacement=opt) reads the SGD's buffers; optim builds on stats"
    ),
    ("noetherflow.stats.blocks", "noetherflow.kernels"): (
        "the built-in kernels register themselves in stats.blocks.KERNELS when imported"
    ),
    ("noetherflow.kernels.noise", "noetherflow.optim.hyper"): (
        "NoiseModel.from_optimizer delegates to optim's reader, which builds NoiseModels"
    ),
    ("noetherflow.kernels.noise", "noetherflow.optim.momentum"): (
        "NoiseModel's momentum coefficients are optim's (C, B, E) map, which uses NoiseModel"
    ),
    ("noetherflow.teleportation.tool", "noetherflow.integrations.lightning"): (
        "EquilibriumTeleport.lightning_callback(): Lightning stays an optional dependency"
    ),
}


def layer_of() -> dict[str, int]:
    return {part: i for i, parts in enumerate(LAYERS) for part in parts}


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def part_of(module: str, root: Path) -> str:
    """The top-level part of ``noetherflow.x.y``: ``x``, ``<private>`` or ``<api>``."""
    parts = module.split(".")
    if len(parts) == 1:
        return "<api>"
    head = parts[1]
    if head.startswith("_") and head != "__main__":
        return head if head in layer_of() else "<private>"
    if not ((root / head).is_dir() or (root / f"{head}.py").is_file()):
        return "<api>"  # a public name: `from noetherflow import teleport`
    return head


def imports(path: Path, module: str, extra: str = "") -> list[tuple[str, int, bool]]:
    """(imported module, line, lazy) for every noetherflow import of ``path`` (+ ``extra``)."""
    tree = ast.parse(path.read_text(encoding="utf-8") + extra)
    lazy: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lazy |= {id(n) for n in ast.walk(node) if n is not node}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[str, int, bool]] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            # `from noetherflow import x`: x is a module when it is one, else a public name
            names = [f"{base}.{a.name}" for a in node.names] if base == "noetherflow" else [base]
        for name in names:
            if name.split(".")[0] == "noetherflow":
                out.append((name, node.lineno, id(node) in lazy))
    return out


def violations(root: Path, planted: dict[str, str] | None = None) -> list[str]:
    """Every upward import under ``root``; ``planted``: text appended to a module (a test)."""
    order = layer_of()
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        me = module_name(path, root)
        mine = part_of(me, root)
        assert mine in order, f"{me}: part {mine!r} has no layer; add it to LAYERS"
        extra = (planted or {}).get(path.relative_to(root).as_posix(), "")
        for target, line, lazy in imports(path, me, extra):
            theirs = part_of(target, root)
            assert theirs in order, f"{me}:{line} imports {target}: part {theirs!r} has no layer"
            if theirs == mine or order[theirs] <= order[mine]:
                continue
            key = (me, _listed_prefix(target, me))
            if lazy and key[1] is not None:
                continue
            kind = "lazy import" if lazy else "import"
            found.append(f"{me}:{line}: {kind} of {target} goes up ({mine} → {theirs})")
    return found


def _listed_prefix(target: str, me: str) -> str | None:
    """The entry of LAZY_UP for ``me`` that ``target`` is (or lies inside), if any."""
    for who, what in LAZY_UP:
        if who == me and (target == what or target.startswith(what + ".")):
            return what
    return None


def test_imports_go_only_downward() -> None:
    assert violations(PACKAGE) == []


def test_every_listed_lazy_import_exists() -> None:
    """An exception whose import is gone is removed from the list, so the list stays true."""
    seen = {
        (module_name(p, PACKAGE), _listed_prefix(t, module_name(p, PACKAGE)))
        for p in PACKAGE.rglob("*.py")
        for t, _, lazy in imports(p, module_name(p, PACKAGE))
        if lazy
    }
    assert set(LAZY_UP) <= seen, set(LAZY_UP) - seen


@pytest.mark.parametrize(
    ("module", "line", "expect"),
    [
        # stats importing the kernels above it (the import this test was written against)
        ("stats/source.py", "from noetherflow.kernels.base import kernel_for\n", "stats → kernels"),
        # symmetry importing the solver (symmetry/eps.py did before the teleportation package)
        ("symmetry/eps.py", "from noetherflow.equilibrium import solve_equilibrium\n", "symmetry"),
        # a relative import upward, and the public API imported from below
        ("kernels/decay.py", "from ..monitor import NoetherMonitor\n", "kernels → monitor"),
        ("symmetry/set.py", "from noetherflow import teleport\n", "symmetry → <api>"),
    ],
)
def test_a_planted_upward_import_is_caught(module: str, line: str, expect: str) -> None:
    found = violations(PACKAGE, {module: "\n" + line})
    assert len(found) == 1 and expect in found[0] and "lazy" not in found[0], found


def test_an_unlisted_lazy_import_upward_is_caught() -> None:
    planted = "\n\ndef _planted() -> None:\n    from noetherflow.monitor import NoetherMonitor\n"
    (found,) = violations(PACKAGE, {"stats/core.py": planted})
    assert "lazy import of noetherflow.monitor goes up (stats → monitor)" in found

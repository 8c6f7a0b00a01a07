"""The registry of detection matchers: :func:`register_matcher`, read by ``run_patterns``.

A matcher reads where features arrive in the traced graph and proposes candidate
symmetries (:class:`~noetherflow.symmetry._fx.engine.Proposal`), which
:func:`noetherflow.find_symmetries` then checks numerically, so a wrong proposal is reported,
never returned. Each matcher runs at one *stage* of the walk over the graph's nodes, with one
signature per stage:

``"layer"``
    ``fn(info, src, ledger)`` for every parameterised linear layer (a registered
    ``LayerSpec``): ``src`` has ``node``, ``module``, ``name``, ``params`` and ``arrivals``
    (where its output features arrive, :func:`~noetherflow.symmetry._fx.engine.propagate`).
``"norm"``
    the same signature, for every normalisation with an affine (``src.arrivals``: where its
    output features arrive).
``"attribute"``
    ``fn(info, node, ledger)`` for every parameter read directly (a used ``get_attr`` node).
``"module"``
    ``fn(info, node, ledger)`` for every module that ``claims(module)`` accepts; a claimed
    module is read as a whole (``nn.MultiheadAttention``), so the layer and norm stages skip
    it.
``"graph"``
    ``fn(info, sources, ledger)`` once, after the walk, with every layer's ``src``
    (contractions ``q @ kᵀ`` that join two layers).

Within a stage, matchers run in registration order; the built-in ones are registered by
:mod:`noetherflow.symmetry._fx.matchers`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from torch import nn

from noetherflow._registry import Registry

if TYPE_CHECKING:
    from noetherflow.symmetry._fx.engine import Proposal

__all__ = [
    "MATCHERS",
    "Matcher",
    "Stage",
    "matchers_at",
    "register_matcher",
    "registered_matchers",
]

Stage = Literal["layer", "norm", "attribute", "module", "graph"]
STAGES: tuple[str, ...] = get_args(Stage)


@dataclass(frozen=True)
class Matcher:
    """One registered matcher: ``fn`` called at ``stage`` (module docstring for signatures).

    Attributes:
        name: its registry key, e.g. ``"rescaling"``.
        fn: the matcher; returns a list of proposals (empty when nothing matches).
        stage: when it runs.
        claims: with ``stage="module"``, ``claims(module)`` → whether it reads that module.
    """

    name: str
    fn: Callable[..., list[Proposal]]
    stage: Stage = "layer"
    claims: Callable[[nn.Module], bool] | None = None


MATCHERS: Registry[Matcher] = Registry(
    "matcher", register_with="noetherflow.register_matcher(name, fn, stage=...)"
)


def register_matcher(
    name: str,
    fn: Callable[..., list[Proposal]],
    *,
    stage: Stage = "layer",
    claims: Callable[[nn.Module], bool] | None = None,
    replace: bool = False,
) -> None:
    """Add a detection matcher that :func:`noetherflow.find_symmetries` runs.

    Args:
        name: a key naming it (a second matcher of the same name needs ``replace=True``).
        fn: the matcher; its signature depends on ``stage`` (see
            :mod:`noetherflow.symmetry._fx.patterns`). Its proposals are checked numerically
            like the built-in ones.
        stage: ``"layer"``, ``"norm"``, ``"attribute"``, ``"module"`` or ``"graph"``.
        claims: required with ``stage="module"``: which modules it reads as a whole.
        replace: replace a matcher registered under ``name``.

    Raises:
        ValueError: an unknown ``stage``, ``claims`` missing or misplaced, or ``name``
            registered already without ``replace``.
    """
    if stage not in STAGES:
        raise ValueError(f"register_matcher: stage={stage!r}; expected one of {STAGES}.")
    if (stage == "module") != (claims is not None):
        raise ValueError(
            f"register_matcher: stage={stage!r} with claims={claims!r}; pass claims= exactly "
            "when stage='module' (which modules the matcher reads as a whole)."
        )
    _builtins()  # first, so that the built-in matchers keep their place before a user's
    MATCHERS.register(name, Matcher(name, fn, stage, claims), replace=replace)


def registered_matchers() -> list[Matcher]:
    """Every matcher, built-in ones first, in registration order."""
    _builtins()
    return MATCHERS.values()


def matchers_at(stage: Stage) -> list[Matcher]:
    """The matchers of ``stage``, in registration order."""
    return [m for m in registered_matchers() if m.stage == stage]


def _builtins() -> None:
    # Registered on import of the matchers' module (which imports this one: no cycle at
    # import time; a call during that import finds it in sys.modules and goes on).
    import noetherflow.symmetry._fx.matchers  # noqa: F401


def claimed(module: nn.Module) -> list[Matcher]:
    """The module-stage matchers that read ``module`` as a whole."""
    return [m for m in matchers_at("module") if m.claims is not None and m.claims(module)]


def run(m: Matcher, *args: Any) -> list[Proposal]:
    """``m.fn(*args)`` as a list (a matcher may return any iterable of proposals)."""
    return list(m.fn(*args))

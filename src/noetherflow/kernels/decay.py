"""Per-parameter weight decay: γ_p of γ_p‖θ_p‖² for each parameter (docs/concepts/flow.md).

Real runs put biases and normalisation weights in a param group with ``weight_decay=0``, so
the parameters one symmetry acts on need not share one γ. With Γ = diag(γ_k) (constant on
each parameter) the flows become (docs/concepts/flow.md, eqs. PD1–PD4)

    continuous:  dC/dt = −2θᵀ(ΓA + AΓ)θ + (η/S)Tr[ΣA]                              (PD1)
    discrete:    E[ΔC] = θᵀ(KAK − A)θ + 4η² θᵀΓA∇L + η²Tr[A(∇L∇Lᵀ + Σ/S)],  K = I − 2ηΓ   (PD2)

and where Γ commutes with A (every diagonal generator, and a double rotation: Γ is constant
along the rotated index of each parameter) both decay terms are −θᵀA·diag(κ_k)·θ =
−C(√κ ⊙ θ) with the per-coordinate κ_k of the time model (4γ_k, or 4ηγ_k(1 − ηγ_k)) (PD3),
and the extra term of (PD2) is 4η²·Q(Γθ, ∇L), Q the charge's bilinear form (PD4). It
vanishes for a uniform γ (θᵀA∇L = 0 by symmetry), and it is invariant along a diagonal
orbit (θ_k∇L_k is).

:class:`ParamDecay` is the validated mapping; :func:`decay_charge` and :func:`decay_cross`
evaluate (PD3)–(PD4) for any family from its ``charge_of`` alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from noetherflow._checks import check_real

__all__ = ["ParamDecay", "decay_charge", "decay_cross", "parse_decay"]

_FIX = (
    "pass a mapping from each nn.Parameter to its γ (γ of γ‖θ‖²; torch.optim.SGD(weight_decay=w) "
    "is γ = w/2), e.g. {p: 0.0 if p.ndim == 1 else 5e-4 for p in model.parameters()}, or "
    "nf.ParamDecay(mapping, default=γ) to give the parameters not in the mapping one γ"
)


class ParamDecay:
    """γ per parameter, with an optional default for parameters not in the mapping.

    Args:
        mapping: ``nn.Parameter`` → γ ≥ 0 (γ of γ‖θ‖² in the loss; PyTorch's coupled
            ``SGD(weight_decay=w)`` is γ = w/2).
        default: γ of every parameter not in ``mapping``; ``None`` (the default): a parameter
            a symmetry acts on that is not in the mapping is an error (a forgotten parameter
            would otherwise get a silent γ).

    Entries for parameters no symmetry acts on are allowed and unused (a mapping over all of
    ``model.parameters()`` is the usual form); a mapping none of whose parameters a symmetry
    acts on is refused by the flows and solvers (a mapping of another model).

    Raises:
        TypeError: a key that is not an ``nn.Parameter`` (a name, a detached tensor).
        ValueError: a negative, NaN or infinite γ.

    Example:
        >>> import torch, noetherflow as nf
        >>> net = torch.nn.Linear(3, 2)
        >>> dec = nf.ParamDecay({net.weight: 5e-4}, default=0.0)
        >>> dec.of(net.weight), dec.of(net.bias)
        (0.0005, 0.0)
    """

    __slots__ = ("_by_id", "_params", "default")

    def __init__(self, mapping: Mapping[Any, Any], default: float | None = None) -> None:
        if isinstance(mapping, ParamDecay):
            by_id, params = dict(mapping._by_id), dict(mapping._params)
            default = mapping.default if default is None else default
        else:
            if not isinstance(mapping, Mapping):
                raise TypeError(
                    f"weight_decay is a {type(mapping).__name__}; expected a float γ or a "
                    f"mapping parameter → γ: {_FIX}."
                )
            by_id, params = {}, {}
            for p, g in mapping.items():
                if not isinstance(p, nn.Parameter):
                    what = f"the name {p!r}" if isinstance(p, str) else f"a {type(p).__name__}"
                    raise TypeError(
                        f"weight_decay mapping: a key is {what}, not an nn.Parameter; {_FIX} "
                        "(from names: {p: γ[n] for n, p in model.named_parameters()})."
                    )
                by_id[id(p)] = _gamma(g, f"weight_decay[parameter of shape {tuple(p.shape)}]")
                params[id(p)] = p
        self._by_id: dict[int, float] = by_id
        self._params: dict[int, nn.Parameter] = params
        self.default = None if default is None else _gamma(default, "ParamDecay(default=...)")

    def of(self, p: nn.Parameter) -> float:
        """γ of ``p``: its entry, else the default; raises ``ValueError`` if it has neither."""
        g = self._by_id.get(id(p))
        if g is not None:
            return g
        if self.default is None:
            raise ValueError(
                f"weight_decay mapping has no entry for a parameter of shape {tuple(p.shape)} "
                "that a symmetry acts on, and no default; add it to the mapping, or pass "
                "nf.ParamDecay(mapping, default=γ) to give unlisted parameters one γ."
            )
        return self.default

    def values(self) -> set[float]:
        """Every γ the mapping can give (its entries and the default)."""
        out = set(self._by_id.values())
        return out if self.default is None else out | {self.default}

    def check_covers(self, params: Iterable[nn.Parameter], who: str) -> None:
        """Raise if some of ``params`` has no γ, or if no key is one of ``params`` at all."""
        ps = list(params)
        for p in ps:
            self.of(p)
        if self._by_id and not {id(p) for p in ps} & set(self._by_id):
            raise ValueError(
                f"{who}: none of the {len(self._by_id)} parameters of the weight_decay mapping "
                "is a parameter the symmetries act on (a mapping of another model, or of a "
                "copy of it?); build it from the parameters of the model the symmetries were "
                "found on."
            )

    def _key(self) -> tuple[Any, ...]:
        return (tuple(sorted(self._by_id.items())), self.default)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ParamDecay) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        vals = sorted(set(self._by_id.values()))
        return f"ParamDecay({len(self._by_id)} parameters, γ ∈ {vals}, default={self.default})"


def _gamma(value: Any, name: str) -> float:
    g = check_real(value, name, expected="a number γ >= 0")  # a string or a bool refused
    if not (math.isfinite(g) and g >= 0):
        raise ValueError(
            f"{name}={value!r} must be a finite γ >= 0 (γ of γ‖θ‖²; decoupled decay λ maps to "
            "γ = λ/2); NaN, infinite or negative decay has no equilibrium."
        )
    return g


def parse_decay(weight_decay: Any) -> float | ParamDecay:
    """A float γ, or a :class:`ParamDecay` from a mapping (``weight_decay=`` of the API)."""
    if isinstance(weight_decay, ParamDecay):
        return weight_decay
    if isinstance(weight_decay, Mapping):
        return ParamDecay(weight_decay)
    return _gamma(weight_decay, "weight_decay")


def decay_charge(
    s: Any, values: Mapping[nn.Parameter, Tensor], kappa: Mapping[nn.Parameter, float]
) -> Tensor:
    """θᵀA·diag(κ_k)·θ = C(√κ ⊙ θ) (PD3), for a family whose A commutes with Γ.

    ``kappa``: κ_p per parameter of ``s``. The charge's shape.
    """
    return s.charge_of({p: values[p] * math.sqrt(kappa[p]) for p in s.params})


def decay_cross(
    s: Any,
    values: Mapping[nn.Parameter, Tensor],
    grad: Mapping[nn.Parameter, Tensor],
    gamma: Mapping[nn.Parameter, float],
) -> Tensor:
    """Q(Γθ, ḡ) = θᵀΓAḡ by polarisation of the charge (PD4). The charge's shape.

    ``grad``: ḡ per parameter; ``gamma``: γ_p. Q(x, y) = (C(x + y) − C(x − y))/4.
    """
    plus, minus = {}, {}
    for p in s.params:
        x = values[p] * gamma[p]
        y = grad[p].to(x)
        plus[p], minus[p] = x + y, x - y
    return (s.charge_of(plus) - s.charge_of(minus)) / 4


def zero_cross(s: Any) -> Tensor:
    """A zero in the shape and dtype of the charge of ``s``."""
    return torch.zeros_like(s.charge())

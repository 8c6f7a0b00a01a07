"""The time model of SGD's noise as one validated value object (paper eqs. 5–9).

Let η, S, γ denote ``lr``, ``batch_size``, ``weight_decay`` (γ‖θ‖² in the loss). Every time
model reduces to three coefficients (κ, c_mean, c_second):

    flow = −κ·C + Tr[A·M],   M = c_mean·ḡḡᵀ + c_second·E[ggᵀ].

* continuous (SGF, Itô, σ² = η/(2S)):  κ = 4γ, M = (η/S)·Σ.
  The paper's eq. (7) writes σ²Tr[ΣA]; Itô's lemma applied to its eq. (1) gives
  2σ²Tr[ΣA] = (η/S)Tr[ΣA], which is what we use (checked against simulation).
* discrete (one SGD step, a batch drawn with replacement):  κ = 4ηγ(1 − ηγ),
  M = η²(ḡḡᵀ + Σ/S).

SGD with heavy-ball (or Nesterov) momentum β, and dampening d (the heavy ball with η(1 − d)),
enters as effective coefficients (``create(..., momentum=β, nesterov=..., dampening=d)``,
:func:`noetherflow.optim.momentum_noise`) with a fourth, the cross coefficient c_cross:

    flow = −κ·C + Tr[A·M] + c_cross·vᵀA∇L,

v the momentum displacement (−η·buffer, :func:`noetherflow.optim.momentum_displacement`),
passed as ``displacement=`` to the flows and solvers. With it the stationary point is the
exact one of the (C, B, E) map (:mod:`noetherflow.optim.momentum`, eq. 3); without it the
term is taken as 0, exact only when ⟨vᵀA∇L⟩ = 0. β = 0 gives the plain-SGD coefficients
above exactly (c_cross = 0). :meth:`NoiseModel.from_optimizer` reads them from a
``torch.optim.SGD``, one model per param group. Any other effective coefficients:
:meth:`NoiseModel.from_coefficients`; the kernels and solvers read only (κ, c_mean, c_second,
c_cross).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch
from torch import Tensor, nn

from noetherflow._checks import (
    check_finite_number,
    check_nonnegative,
    check_positive,
    check_positive_int,
    parse_enum,
)
from noetherflow.kernels.decay import ParamDecay, parse_decay

__all__ = [
    "MixedDecay",
    "NoiseModel",
    "ParamDecay",
    "TimeModel",
    "check_decay",
    "cross_displacement",
    "cross_values",
    "resolve_noise",
]


class TimeModel(str, Enum):
    """Continuous (SGF) or discrete (SGD step) time (docs/concepts/flow.md)."""

    CONTINUOUS = "continuous"
    DISCRETE = "discrete"


def discrete_kappa(lr: float, weight_decay: float) -> float:
    """κ = 4ηγ(1 − ηγ): the charge's contraction per SGD step, (1 − 2ηγ)² = 1 − κ."""
    return 4 * lr * weight_decay * (1 - lr * weight_decay)


@dataclass(frozen=True)
class NoiseModel:
    """flow = −κC + Tr[A·M], M = c_mean·ḡḡᵀ + c_second·E[ggᵀ] + c_cross·sym(vḡᵀ) (module doc).

    Build it once with :meth:`create` from (η, S, γ, time) and pass it to
    :func:`noetherflow.noether_flow`, :func:`noetherflow.solve_equilibrium` and the tools.
    The hyper-parameters it was built from are kept for reports (``None`` when built from
    coefficients).

    Example:
        >>> import torch, noetherflow as nf
        >>> noise = nf.NoiseModel.create(lr=0.1, batch_size=32, weight_decay=1e-4)
        >>> noise.kappa, noise.c_second  # continuous time: κ = 4γ, M = (η/S)·Σ
        (0.0004, 0.003125)
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        >>> x, y = torch.randn(16, 3), torch.randn(16, 2)
        >>> syms = nf.find_symmetries(net, x)
        >>> stats = nf.collect_stats(net, syms, torch.nn.functional.mse_loss, x, y)
        >>> flows = nf.noether_flow(syms, stats, noise)  # the same as the keyword form:
        >>> same = nf.noether_flow(syms, stats, lr=0.1, batch_size=32, weight_decay=1e-4)
        >>> all(torch.equal(flows[k], same[k]) for k in flows)
        True
    """

    kappa: float
    c_mean: float
    c_second: float
    # the hyper-parameters it was built from, for reports; two models with the same
    # coefficients are equal (they give the same flows and solutions)
    lr: float | None = field(default=None, compare=False)
    batch_size: int | None = field(default=None, compare=False)
    weight_decay: float | None = field(default=None, compare=False)
    time: TimeModel | None = field(default=None, compare=False)
    momentum: float | None = field(default=None, compare=False)
    nesterov: bool | None = field(default=None, compare=False)
    dampening: float | None = field(default=None, compare=False)
    # weight of the momentum cross term vᵀA∇L (0 without momentum and in continuous time)
    c_cross: float = 0.0
    # γ per parameter (weight_decay= a mapping); the scalar fields are then those of the
    # largest γ (or the default), and the kernels read each parameter's model from at(p)
    decay: ParamDecay | None = None
    _sub: dict[float, NoiseModel] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("kappa", "c_mean", "c_second", "c_cross"):
            check_finite_number(getattr(self, name), name, "a NoiseModel coefficient")
        if self.kappa < 0:
            raise ValueError(
                f"kappa={self.kappa!r} must be >= 0 (the weight-decay contraction of the charge); "
                "a negative κ makes the charges grow without bound and has no equilibrium."
            )
        if self.c_second < 0:
            raise ValueError(
                f"c_second={self.c_second!r} must be >= 0 (the weight of E[ggᵀ] in M)."
            )

    @classmethod
    def create(
        cls,
        *,
        lr: float,
        batch_size: int,
        weight_decay: float | Mapping[nn.Parameter, float] | ParamDecay = 0.0,
        time: str | TimeModel = "continuous",
        momentum: float = 0.0,
        nesterov: bool = False,
        dampening: float = 0.0,
    ) -> NoiseModel:
        """Coefficients of the time model from η, S, γ (module docstring for the formulas).

        ``weight_decay`` is one γ for every parameter, or a mapping ``nn.Parameter`` → γ (or a
        :class:`~noetherflow.ParamDecay`, which may give a default) for per-parameter decay,
        e.g. a no-decay group of biases and norm weights (docs/concepts/flow.md, eqs.
        PD1–PD9). A parameter a symmetry acts on must then be in the mapping unless a default
        is given. Discrete time with Nesterov momentum needs one γ per symmetry (its (C, B, E)
        map does not split by γ); the heavy ball and continuous time take any mapping.

        ``momentum=β > 0`` (PyTorch's ``SGD(momentum=β, dampening=d, nesterov=...)``) gives
        the effective coefficients of :func:`noetherflow.optim.momentum_noise`: discrete time
        κ_eff with η_eff = η/(1 − β), exact for the stationary point when ⟨vᵀA∇L⟩ = 0 (else use
        :func:`noetherflow.optim.stationary_moments` with the measured ⟨H⟩); continuous time
        the η → 0 limit, SGF with η_eff per unit τ = steps·η_eff. β = 0 (and not Nesterov) gives
        exactly the plain-SGD coefficients. ``dampening=d`` (heavy ball only, as in PyTorch) is
        the heavy ball with η(1 − d), exactly; ignored without momentum, as in PyTorch.

        Raises:
            ValueError: a non-finite or non-positive η, a batch size that is not a positive
                integer, a negative or non-finite γ, or discrete time with ηγ ≥ 1 (κ ≤ 0: the
                decay step (1 − 2ηγ)θ no longer contracts θ).
        """
        dec = parse_decay(weight_decay)
        if isinstance(dec, ParamDecay):
            return cls._per_parameter(
                dec,
                lr=lr,
                batch_size=batch_size,
                time=time,
                momentum=momentum,
                nesterov=nesterov,
                dampening=dampening,
            )
        eta = check_positive(lr, "lr", "the learning rate η")
        s = check_positive_int(batch_size, "batch_size", "the SGD batch size S")
        gam = check_nonnegative(
            weight_decay,
            "weight_decay",
            "γ of γ‖θ‖²",
            "decoupled decay λ maps to γ = λ/2",
        )
        tm = parse_enum(TimeModel, time, "time", "'continuous' (SGF) or 'discrete' (SGD steps)")
        hyper: dict[str, Any] = {"lr": eta, "batch_size": s, "weight_decay": gam, "time": tm}
        beta = check_finite_number(momentum, "momentum", "the momentum β of SGD")
        if not 0 <= beta < 1:
            raise ValueError(
                f"momentum={momentum!r} must lie in [0, 1) (PyTorch's SGD momentum β); β ≥ 1 has "
                "no stationary buffer and β < 0 is not heavy-ball momentum."
            )
        damp = check_finite_number(dampening, "dampening", "the dampening d of SGD")
        if beta > 0 or nesterov:
            return cls._momentum(eta, s, gam, tm, beta, bool(nesterov), damp if beta > 0 else 0.0)
        hyper.update(momentum=0.0, nesterov=False, dampening=0.0)
        if tm is TimeModel.CONTINUOUS:
            # M = (η/S)·Σ = (η/S)(E[ggᵀ] − ḡḡᵀ)
            return cls(kappa=4 * gam, c_mean=-eta / s, c_second=eta / s, **hyper)
        if gam > 0 and eta * gam >= 1:
            raise ValueError(
                f"lr·weight_decay = {eta}·{gam} = {eta * gam:g} >= 1 in discrete time: κ = "
                f"4ηγ(1 − ηγ) = {discrete_kappa(eta, gam):g} <= 0, so SGD's decay step does not "
                "contract the parameters and there is no noise equilibrium; expected ηγ < 1. "
                "Lower lr or weight_decay (γ of γ‖θ‖²; decoupled decay λ maps to γ = λ/2)."
            )
        # M = η²(ḡḡᵀ + Σ/S) = η²((1 − 1/S) ḡḡᵀ + E[ggᵀ]/S)
        return cls(
            kappa=discrete_kappa(eta, gam),
            c_mean=eta**2 * (1 - 1 / s),
            c_second=eta**2 / s,
            **hyper,
        )

    @classmethod
    def _per_parameter(cls, dec: ParamDecay, **hyper: Any) -> NoiseModel:
        """``create`` with a γ per parameter: one scalar model per distinct γ, checked now."""
        subs = {g: cls.create(weight_decay=g, **hyper) for g in sorted(dec.values())}
        if not subs:
            raise ValueError(
                "weight_decay={} is an empty mapping with no default; give each parameter "
                "the symmetries act on a γ, or nf.ParamDecay({}, default=γ)."
            )
        top = subs[dec.default] if dec.default is not None else subs[max(subs)]
        out = dataclasses.replace(top, decay=dec, _sub=subs)
        return out

    def at(self, p: nn.Parameter) -> NoiseModel:
        """The scalar model of parameter ``p`` (this model itself without a mapping)."""
        if self.decay is None:
            return self
        g = self.decay.of(p)
        sub = self._sub.get(g)
        if sub is None:  # a model rebuilt by dataclasses.replace without its cache
            assert self.lr is not None and self.batch_size is not None
            sub = self._sub[g] = NoiseModel.create(
                lr=self.lr,
                batch_size=self.batch_size,
                weight_decay=g,
                time=self.time or "continuous",
                momentum=self.momentum or 0.0,
                nesterov=bool(self.nesterov),
                dampening=self.dampening or 0.0,
            )
        return sub

    def uniform(self, params: Iterable[nn.Parameter]) -> NoiseModel | None:
        """The scalar model shared by all of ``params``, or None when their γ differ."""
        if self.decay is None:
            return self
        subs = {id(self.at(p)): self.at(p) for p in params}
        return next(iter(subs.values())) if len(subs) == 1 else None

    def mixed_terms(
        self, params: Iterable[nn.Parameter], who: str = "", *, commuting: bool = True
    ) -> MixedDecay:
        """κ_p, γ_p and the noise coefficients of parameters with different γ (eqs. PD1–PD9).

        ``commuting``: whether the family's generators commute with Γ. Discrete time with
        heavy-ball momentum (any dampening) is covered there (eq. PD9); Nesterov momentum,
        and momentum on a family whose generators do not commute with Γ, raise
        ``ValueError`` (their (C, B, E) maps do not split by γ).
        """
        ps = list(params)
        subs = [self.at(p) for p in ps]
        momentum = bool(self.momentum) or bool(self.nesterov)
        discrete = self.time is TimeModel.DISCRETE
        if discrete and momentum and (self.nesterov or not commuting):
            why = "Nesterov momentum" if self.nesterov else "a generator that mixes them"
            raise ValueError(
                f"{who or 'NoiseModel'}: discrete time with momentum β={self.momentum} and "
                f"parameters of one symmetry with different weight decay "
                f"{sorted({float(m.weight_decay or 0.0) for m in subs})}: with {why} the "
                "(C, B, E) map of SGD with momentum does not split by γ, so there is no "
                "exact flow. Use time='continuous' (exact in the η → 0 limit), heavy-ball "
                "momentum, or one weight decay for the parameters of each symmetry."
            )
        base = subs[0]
        # continuous time, plain SGD and the heavy ball: the noise coefficients do not
        # depend on γ (c_cross = −2βη(1 − d)/(1 − β)² for the heavy ball)
        assert all(
            (m.c_mean, m.c_second, m.c_cross) == (base.c_mean, base.c_second, base.c_cross)
            for m in subs
        )
        cross = 0.0
        if discrete and self.lr:
            # eq. PD9: 4e²/((1 − β)²(1 + β)), e = η(1 − d); β = 0: 4η² (eq. PD4)
            beta = float(self.momentum or 0.0)
            e = self.lr * (1 - float(self.dampening or 0.0)) if beta else self.lr
            cross = 4 * e**2 / ((1 - beta) ** 2 * (1 + beta))
        return MixedDecay(
            noise=base,
            kappa={p: m.kappa for p, m in zip(ps, subs, strict=True)},
            gamma={p: float(m.weight_decay or 0.0) for p, m in zip(ps, subs, strict=True)},
            cross=cross,
        )

    @classmethod
    def _momentum(
        cls,
        eta: float,
        s: int,
        gam: float,
        tm: TimeModel,
        beta: float,
        nesterov: bool,
        dampening: float = 0.0,
    ) -> NoiseModel:
        """The effective model of SGD with momentum β (``create``'s ``momentum`` branch)."""
        from noetherflow.optim.momentum import momentum_noise

        if tm is TimeModel.DISCRETE and gam > 0 and eta * gam >= 1:
            raise ValueError(
                f"lr·weight_decay = {eta}·{gam} = {eta * gam:g} >= 1 in discrete time: the "
                "decay step does not contract the parameters, so there is no noise "
                "equilibrium; expected ηγ < 1. Lower lr or weight_decay."
            )
        eff = momentum_noise(
            lr=eta,
            batch_size=s,
            weight_decay=gam,
            momentum=beta,
            nesterov=nesterov,
            time=tm.value,
            dampening=dampening,
        )
        return cls(
            kappa=eff.kappa,
            c_mean=eff.c_mean,
            c_second=eff.c_second,
            c_cross=eff.c_cross,
            lr=eta,
            batch_size=s,
            weight_decay=gam,
            time=tm,
            momentum=beta,
            nesterov=nesterov,
            dampening=dampening,
        )

    @classmethod
    def from_optimizer(
        cls,
        opt: torch.optim.Optimizer,
        batch_size: int,
        *,
        time: str | TimeModel = "discrete",
        per_group: bool = True,
    ) -> list[NoiseModel] | NoiseModel:
        """One :class:`NoiseModel` per param group of a ``torch.optim.SGD`` (momentum allowed).

        Reads each group's lr η, momentum β, nesterov, dampening d and coupled
        ``weight_decay=λ`` (γ = λ/2 of γ‖θ‖²) via :func:`noetherflow.optim.from_optimizer` and
        returns ``create(lr=η, batch_size=S, weight_decay=λ/2, momentum=β, nesterov=...,
        dampening=d, time=time)``.
        Discrete time by default (the optimizer takes steps). ``per_group=False`` returns one
        model for the whole optimizer instead, with γ per parameter from each group's
        weight decay (a no-decay group of biases and norm weights; docs/concepts/flow.md):
        the groups must then agree on lr, momentum, nesterov and dampening.

        Raises:
            ValueError: an Adam/AdamW optimizer (its update is not a gradient step, so it has
                no (κ, c_mean, c_second) model; use ``noetherflow.optim.from_optimizer`` and
                ``noetherflow.optim.adamw_equilibrium_charge``), dampening ≥ 1,
                maximize=True, or (``per_group=False``) groups that differ in more than
                their weight decay.
            TypeError: an optimizer other than SGD, Adam or AdamW.
        """
        from noetherflow.optim.hyper import from_optimizer

        tm = parse_enum(TimeModel, time, "time", "'continuous' (SGF) or 'discrete' (SGD steps)")
        groups = from_optimizer(opt, batch_size, time=tm.value)
        for g in groups:
            if g.kind != "sgd":
                raise ValueError(
                    f"param group {g.index} of {type(opt).__name__} is {g.kind}: its update is "
                    "not a gradient step, so there is no NoiseModel (κ, c_mean, c_second) for "
                    "it; expected torch.optim.SGD. Use noetherflow.optim.from_optimizer and "
                    "noetherflow.optim.adamw_equilibrium_charge for Adam(W)."
                )

        def one(g: Any, decay: Any) -> NoiseModel:
            return cls.create(
                lr=g.lr,
                batch_size=g.batch_size,
                weight_decay=decay,
                time=tm,
                momentum=g.momentum,
                nesterov=g.nesterov,
                dampening=g.dampening,
            )

        if per_group:
            return [one(g, g.weight_decay) for g in groups]
        shared = {(g.lr, g.momentum, g.nesterov, g.dampening) for g in groups}
        if len(shared) > 1:
            raise ValueError(
                f"NoiseModel.from_optimizer(per_group=False): the param groups differ in "
                f"(lr, momentum, nesterov, dampening) {sorted(shared)}; one model has one η "
                "and one momentum (only the weight decay may differ per group). Use "
                "per_group=True for one model per group."
            )
        decay = ParamDecay({p: g.weight_decay for g in groups for p in g.params})
        return one(groups[0], decay)

    @classmethod
    def from_coefficients(
        cls, *, kappa: float, c_mean: float, c_second: float, c_cross: float = 0.0
    ) -> NoiseModel:
        """A noise model given directly by its effective coefficients (e.g. an optimizer's)."""
        return cls(
            kappa=float(kappa),
            c_mean=float(c_mean),
            c_second=float(c_second),
            c_cross=float(c_cross),
        )

    def diag(self, mean: Tensor, sq: Tensor, disp: Tensor | None = None) -> Tensor:
        """Per-coordinate M_kk from ḡ, E[g²] and the displacement v (same shapes).

        M_kk = c_mean·ḡ_k² + c_second·E[g_k²] + c_cross·v_k ḡ_k; ``disp=None``: v = 0.
        """
        m = self.c_mean * mean.square() + self.c_second * sq
        if disp is not None and self.c_cross != 0:
            m = m + self.c_cross * disp * mean
        return m

    def matrix(
        self, mean_outer: Tensor, second: Tensor, cross_outer: Tensor | None = None
    ) -> Tensor:
        """M from ḡḡᵀ-, E[ggᵀ]- and vḡᵀ-type matrices (the last symmetrised; None: v = 0)."""
        m = self.c_mean * mean_outer + self.c_second * second
        if cross_outer is not None and self.c_cross != 0:
            m = m + self.c_cross * (cross_outer + cross_outer.T) / 2
        return m


@dataclass(frozen=True)
class MixedDecay:
    """What the flow of a symmetry with per-parameter γ needs (docs/concepts/flow.md).

    Attributes:
        noise: a model with the (γ-independent) noise coefficients c_mean, c_second, c_cross.
        kappa, gamma: κ_p and γ_p per parameter of the symmetry.
        cross: the weight of Q(Γθ, ∇L) in the flow: 4η² in discrete time (eq. PD4), with
            heavy-ball momentum 4e²/((1 − β)²(1 + β)), e = η(1 − d) (eq. PD9); 0 in
            continuous time.
    """

    noise: NoiseModel
    kappa: dict[nn.Parameter, float]
    gamma: dict[nn.Parameter, float]
    cross: float


def resolve_noise(
    noise: NoiseModel | None,
    *,
    lr: float | None,
    batch_size: int | None,
    weight_decay: float | Mapping[nn.Parameter, float] | ParamDecay | None,
    time: str | TimeModel | None,
    who: str,
    momentum: float | None = None,
    nesterov: bool | None = None,
    dampening: float | None = None,
) -> NoiseModel:
    """The :class:`NoiseModel` of a call that takes either ``noise`` or the keyword form."""
    loose = {
        "lr": lr,
        "batch_size": batch_size,
        "weight_decay": weight_decay,
        "time": time,
        "momentum": momentum,
        "nesterov": nesterov,
        "dampening": dampening,
    }
    given = [k for k, v in loose.items() if v is not None]
    if noise is not None:
        if not isinstance(noise, NoiseModel):
            raise TypeError(
                f"{who}: noise is a {type(noise).__name__}; expected a NoiseModel, e.g. "
                "nf.NoiseModel.create(lr=..., batch_size=...)."
            )
        if given:
            raise ValueError(
                f"{who}: got both noise=NoiseModel(...) and {given}; pass one of them (the "
                "NoiseModel already holds η, S, γ and the time model)."
            )
        return noise
    if lr is None or batch_size is None:
        raise TypeError(
            f"{who}: pass noise=nf.NoiseModel.create(lr=..., batch_size=..., weight_decay=..., "
            "time=...), or the keywords lr= and batch_size= (missing: "
            f"{[k for k in ('lr', 'batch_size') if loose[k] is None]})."
        )
    return NoiseModel.create(
        lr=lr,
        batch_size=batch_size,
        weight_decay=0.0 if weight_decay is None else weight_decay,
        time="continuous" if time is None else time,
        momentum=0.0 if momentum is None else momentum,
        nesterov=False if nesterov is None else nesterov,
        dampening=0.0 if dampening is None else dampening,
    )


def check_decay(nm: NoiseModel, syms: Any, who: str) -> None:
    """Every parameter of ``syms`` has a γ, and the mixed ones an exact flow (else raise)."""
    if nm.decay is None:
        return
    from noetherflow.kernels.base import kernel_for

    nm.decay.check_covers(syms.params(), who)
    for s in syms:
        if nm.uniform(s.params) is None:  # raises where the time model has no mixed flow
            nm.mixed_terms(s.params, who, commuting=kernel_for(s).decay_commutes)


def cross_displacement(stats: Any, nm: NoiseModel, p: Any) -> Tensor | None:
    """The displacement v of ``p`` when the cross term c_cross·vᵀA∇L applies, else None.

    ``stats`` is a :class:`~noetherflow.stats.core.GradStats`; a parameter without a
    displacement (no buffer yet) has v = 0.
    """
    if nm.c_cross == 0:
        return None
    return stats.displacement.get(p)


def cross_values(stats: Any, nm: NoiseModel, params: Any) -> dict[Any, Tensor] | None:
    """The displacement v of each of ``params`` (zeros where none), for the cross term.

    None when the term does not apply (c_cross = 0, or no displacement of any of ``params``).
    """
    if nm.c_cross == 0 or not any(p in stats.displacement for p in params):
        return None
    return {p: stats.displacement.get(p, torch.zeros_like(stats.mean[p])) for p in params}

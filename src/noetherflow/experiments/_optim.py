"""Shared machinery of ``optim-sgdm`` and ``optim-adamw``: digits, two small networks, the
stationary-window measurements and the predictions of :mod:`noetherflow.optim`.

Networks (float64, on the standardised 8×8 digits, cross-entropy, batches of S drawn with
replacement):

* ``norm``: Linear(64 → H, no bias) → LayerNorm(H, no affine, eps 1e-12) → ReLU →
  Linear(H → 10). The first weight is scale invariant (one charge ‖W₁‖²).
* ``relu``: Linear(64 → H) → ReLU → Linear(H → 10). Per-neuron rescaling (H charges).

The conditional expectations E[G | θ] = (1 − 1/S)∇LᵀA∇L + E_i[∇ℓ_iᵀA∇ℓ_i]/S and, with
the momentum buffer v, E[H | θ, v] = vᵀA∇L over the whole data set enter the predictions
(window averages). :func:`library_moments` computes them from the library's hook statistics
(``collect_stats``) for one network; :class:`Replicas` stacks R networks (seeds, init
scales) into one module whose one optimizer step is R independent steps, and computes the
same moments for all of them from the per-sample gradient factors (tested equal to both).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, cast

import numpy as np
import torch
from torch import Tensor, nn

import noetherflow as nf
from noetherflow.experiments._data import load_digits_data
from noetherflow.experiments._parallel import derive_seed
from noetherflow.symmetry.base import DiagonalSymmetry, DiagonalTerm, Family

DT = torch.float64


def digits() -> tuple[Tensor, Tensor]:
    """Standardised digits (per-pixel mean 0, std 1 where nonzero). ``[N, 64]``, ``[N]``."""
    data = load_digits_data()
    x = data.x - data.x.mean(0)
    sd = data.x.std(0)
    x = x / np.where(sd > 0, sd, 1.0)
    return torch.tensor(x, dtype=DT), torch.tensor(data.labels, dtype=torch.long)


def build(
    kind: str, hidden: int, seed: int, init_scale: float
) -> tuple[nn.Module, DiagonalSymmetry]:
    """The ``norm`` or ``relu`` network and its symmetry; first layer init × ``init_scale``."""
    torch.manual_seed(seed)
    if kind == "norm":
        first = nn.Linear(64, hidden, bias=False)
        m = nn.Sequential(
            first,
            nn.LayerNorm(hidden, eps=1e-12, elementwise_affine=False),
            nn.ReLU(),
            nn.Linear(hidden, 10),
        ).to(DT)
        w1 = cast(nn.Parameter, first.weight)
        sym: DiagonalSymmetry = nf.ScaleInvariance([w1], label="W1 (LayerNorm)")
    elif kind == "relu":
        m = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10)).to(DT)
        sym = nf.Rescaling(m[0], m[2], label="hidden neurons")
    else:
        raise ValueError(f"network kind {kind!r} is not one of 'norm', 'relu'.")
    with torch.no_grad():
        for p in m[0].parameters():
            p.mul_(init_scale)
    return m, sym


def library_moments(
    sym: DiagonalSymmetry,
    m: nn.Module,
    x: Tensor,
    y: Tensor,
    batch_size: int,
    v: dict[nn.Parameter, Tensor] | None,
) -> tuple[Tensor, Tensor]:
    """(E[G | θ], E[H | θ, v]) per generator, from the library's hook statistics.

    ``collect_stats`` (one forward/backward over the data set) gives ḡ and E[g²];
    ``noether_flow`` at η = 1, γ = 0 (discrete time) is exactly E[G | θ].
    """
    syms = nf.SymmetrySet([sym])
    stats = nf.collect_stats(m, syms, nn.functional.cross_entropy, x, y, level="neuron")
    for p in m.parameters():
        p.grad = None
    # The discrete flow at η = 1, γ = 0 is Tr[A((1 − 1/S)∇L∇Lᵀ + E[ggᵀ]/S)] = E[G | θ].
    (noise,) = nf.noether_flow(
        syms, stats, lr=1.0, batch_size=batch_size, weight_decay=0.0, time="discrete"
    ).values()
    if v is None:
        return noise, torch.zeros_like(noise)
    return noise, sym.weighted_sum({p: v[p] * stats.mean[p] for p in sym.params})


def rel(measured: Tensor, predicted: Tensor) -> float:
    """‖measured − predicted‖₂ / ‖predicted‖₂ (a scalar charge: |m/p − 1|)."""
    return float((measured - predicted).norm() / predicted.norm())


class _ReplicaScale(DiagonalSymmetry):
    """One scale generator per ``norm`` replica: A = I on its block of H rows of ``w1``.

    Library terms, so ``charge_of`` and ``weighted_sum`` are the library's.
    """

    family: ClassVar[Family] = Family.SCALE

    def __init__(self, w1: nn.Parameter, hidden: int) -> None:
        super().__init__(label="norm replicas")
        self._terms = [DiagonalTerm(w1, 0, hidden, 1.0)]

    @property
    def num_generators(self) -> int:
        return self._terms[0].num_generators

    def terms(self) -> list[DiagonalTerm]:
        return self._terms


class _ReplicaRescaling(DiagonalSymmetry):
    """One rescaling per hidden neuron of the ``relu`` replicas: +1 on its ``w1`` row and
    ``b1`` entry, −1 on its ``w2t`` row (the transposed second weight)."""

    family: ClassVar[Family] = Family.RESCALING

    def __init__(self, w1: nn.Parameter, b1: nn.Parameter, w2t: nn.Parameter) -> None:
        super().__init__(label="relu replicas")
        self._terms = [
            DiagonalTerm(w1, 0, 1, 1.0),
            DiagonalTerm(b1, 0, 1, 1.0),
            DiagonalTerm(w2t, 0, 1, -1.0),
        ]

    @property
    def num_generators(self) -> int:
        return self._terms[0].num_generators

    def terms(self) -> list[DiagonalTerm]:
        return self._terms


class Replicas(nn.Module):
    """R independent copies of the ``norm`` or ``relu`` network, in stacked parameters.

    Replica r is :func:`build` ``(kind, hidden, seeds[r], init_scales[r])`` exactly (its
    parameters are copied in); one forward evaluates every replica on its own batch. Every
    optimizer of ``torch.optim`` used here (SGD with momentum, AdamW) acts coordinatewise, so
    one optimizer over the stacked parameters is R independent optimizers (tested).

    Storage, with the replica-major neuron index j = r·H + h along axis 0: ``w1 [R·H, 64]``,
    ``b1 [R·H]`` (``relu`` only), ``w2t [R·H, 10]`` (the second weight transposed), ``b2
    [R, 10]``. ``sym`` holds the charges: ``[R]`` (``norm``) or ``[R·H]`` (``relu``).
    """

    def __init__(self, kind: str, hidden: int, seeds: list[int], init_scales: list[float]) -> None:
        super().__init__()
        if len(seeds) != len(init_scales) or not seeds:
            raise ValueError(
                f"Replicas: got {len(seeds)} seeds and {len(init_scales)} init scales; expected "
                "one init scale per seed (at least one)."
            )
        nets = [
            cast(nn.Sequential, build(kind, hidden, s, a)[0])
            for s, a in zip(seeds, init_scales, strict=True)
        ]
        self.kind, self.hidden, self.n = kind, hidden, len(seeds)
        first = [cast(nn.Linear, m[0]) for m in nets]
        last = [cast(nn.Linear, m[-1]) for m in nets]
        with torch.no_grad():
            self.w1 = nn.Parameter(torch.cat([f.weight for f in first]).clone())
            self.b1 = (
                nn.Parameter(torch.cat([f.bias for f in first]).clone()) if kind == "relu" else None
            )
            self.w2t = nn.Parameter(torch.cat([f.weight.T for f in last]).clone())
            self.b2 = nn.Parameter(torch.stack([f.bias for f in last]).clone())
        self.sym: DiagonalSymmetry = (
            _ReplicaScale(self.w1, hidden)
            if self.b1 is None
            else _ReplicaRescaling(self.w1, self.b1, self.w2t)
        )

    def _hidden_pre(self, x: Tensor) -> Tensor:
        """Pre-activations ``[R, S, H]`` from ``x [R, S, 64]`` (own batches) or ``[N, 64]``."""
        w1 = self.w1.view(self.n, self.hidden, -1)
        xs = x if x.dim() == 3 else x.expand(self.n, *x.shape)
        if self.b1 is None:  # bmm/baddbmm: fewer autograd nodes than einsum (per-step cost)
            return torch.bmm(xs, w1.transpose(1, 2))
        return torch.baddbmm(self.b1.view(self.n, 1, self.hidden), xs, w1.transpose(1, 2))

    def _act(self, z: Tensor) -> Tensor:
        if self.kind == "norm":
            z = nn.functional.layer_norm(z, (self.hidden,), eps=1e-12)
        return torch.relu(z)

    def _out(self, a: Tensor) -> Tensor:
        return torch.baddbmm(self.b2[:, None, :], a, self.w2t.view(self.n, self.hidden, -1))

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``[R, S, 10]`` of ``x [R, S, 64]`` (replica r on batch r) or ``[N, 64]``."""
        return self._out(self._act(self._hidden_pre(x)))

    def losses(self, x: Tensor, y: Tensor) -> Tensor:
        """Per-replica mean cross-entropy ``[R]`` (``x [R, S, 64]``, ``y [R, S]``)."""
        out = self(x)
        ce = nn.functional.cross_entropy(out.flatten(0, 1), y.flatten(), reduction="none")
        return ce.view(out.shape[0], -1).mean(1)

    def moments(
        self, x: Tensor, y: Tensor, batch_size: int, v: dict[nn.Parameter, Tensor] | None
    ) -> tuple[Tensor, Tensor]:
        """(E[G | θ], E[H | θ, v]) per generator ``[J]`` over the data set ``x [N, 64]``.

        Per-sample gradients of a linear layer are outer products: with δ = ∂ℓ_i/∂z_i (first
        layer) and e = ∂ℓ_i/∂out_i, g(w1) = δ xᵀ, g(b1) = δ, g(w2t) = a eᵀ. Their means are
        one matrix product per layer, their squared norms per neuron δ²‖x‖² and a²‖e‖². Then
        E[G | θ] = (1 − 1/S)∇LᵀA∇L + E_i[g_iᵀAg_i]/S and E[H | θ, v] = vᵀA∇L, as
        :func:`library_moments` computes from the library's hooks (tested equal).
        """
        n, r, h = x.shape[0], self.n, self.hidden
        # [N, R·H] layout (neuron j = r·H + h, as w1's rows): the first layer's sums over the
        # data are then single GEMMs with x, the cost that dominates here
        z2 = x @ self.w1.detach().T
        if self.b1 is not None:
            z2 = z2 + self.b1.detach()
        z2.requires_grad_(True)
        a = self._act(z2.view(n, r, h))
        out = torch.bmm(a.transpose(0, 1), self.w2t.detach().view(r, h, -1)) + self.b2[:, None]
        ce = nn.functional.cross_entropy(out.flatten(0, 1), y.repeat(r), reduction="sum")
        dz2, e = torch.autograd.grad(ce, (z2, out))  # [N, R·H], [R, N, 10]
        sq = (dz2.square() * x.square().sum(1, keepdim=True)).mean(0)  # [R·H], w1 rows
        mean = {self.w1: (x.T @ dz2).T / n}
        if self.b1 is None:
            sq = sq.view(r, h).sum(1)  # one scale generator per replica (A = I on w1)
        else:
            at = a.detach().permute(1, 2, 0)  # [R, H, N]
            mean[self.w2t] = torch.bmm(at, e).flatten(0, 1) / n
            mean[self.b1] = dz2.mean(0)
            sq_w2 = (at.square() * e.square().sum(2)[:, None, :]).mean(2).flatten()
            sq = sq + dz2.square().mean(0) - sq_w2
        s = batch_size
        g = self.sym.weighted_sum({p: t.square() for p, t in mean.items()}) * (1 - 1 / s)
        g = g + sq / s
        if v is None:
            return g, torch.zeros_like(g)
        return g, self.sym.weighted_sum({p: v[p] * mean[p] for p in self.sym.params})

    def per_replica(self, t: Tensor) -> Tensor:
        """A charge-shaped ``[J]`` tensor as ``[R, J/R]`` (one row per replica)."""
        return t.view(self.n, -1)

    def replica_values(self, r: int) -> list[Tensor]:
        """Replica r's parameters in :func:`build`'s module order (first layer, then last)."""
        h = slice(r * self.hidden, (r + 1) * self.hidden)
        first = [self.w1[h]] + ([] if self.b1 is None else [self.b1[h]])
        return [*first, self.w2t[h].T, self.b2[r]]


def layout(
    n_runs: int, main: int, n_seeds: int, init_scales: tuple[float, ...], seed: int
) -> list[tuple[list[int], list[float], list[tuple[int, float]]]]:
    """Per run: its replicas' seeds, init scales and labels (seed index j, init scale).

    Every run has ``n_seeds`` replicas at init × 1 (j = 0, …, n_seeds − 1); run ``main``
    also has, per seed, one replica for each other entry of ``init_scales``. Seed 0 keeps
    the derivation keys of the earlier one-seed runs.
    """
    out = []
    for i in range(n_runs):
        seeds = [derive_seed(seed, "run", i, *([j] if j else [])) for j in range(n_seeds)]
        labels = [(j, 1.0) for j in range(n_seeds)]
        if i == main:
            for k, s in enumerate(init_scales):
                if s != 1.0:
                    seeds += [
                        derive_seed(seed, "init", k, *([j] if j else [])) for j in range(n_seeds)
                    ]
                    labels += [(j, s) for j in range(n_seeds)]
        out.append((seeds, [a for _, a in labels], labels))
    return out


def batches(x: Tensor, y: Tensor, n: int, size: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """n minibatches of ``size`` drawn with replacement: ``[n, size, 64]``, ``[n, size]``."""
    idx = torch.randint(0, x.shape[0], (n, size), generator=gen)
    return x[idx], y[idx]


def mark_nonfinite(losses: list[Tensor], bad: list[list[int | None]], t: int) -> None:
    """Records step t as the first non-finite loss of every replica that has none yet."""
    for i, loss in enumerate(losses):
        for r in torch.nonzero(~torch.isfinite(loss.detach())).flatten().tolist():
            bad[i][r] = t if bad[i][r] is None else bad[i][r]


def seed_result(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Close the per-seed records of a run: each seed's spread over inits, any divergence.

    ``per_seed[j]`` holds ``runs`` and ``inits`` (result dicts with ``diverged`` and, when not
    diverged, ``charge``); the spread is (max − min)/min of the first charge over the inits.
    """
    for ps in per_seed:
        levels = [r["charge"][0] for r in ps["inits"] if not r["diverged"]]
        ps["init_spread"] = (max(levels) - min(levels)) / min(levels) if levels else math.nan
    any_div = any(r["diverged"] for ps in per_seed for r in ps["runs"] + ps["inits"])
    return {"per_seed": per_seed, "any_diverged": any_div, **per_seed[0]}

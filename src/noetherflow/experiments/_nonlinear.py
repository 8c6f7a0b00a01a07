"""Shared core of Fig. 6 and Fig. 9: two-layer nonlinear autoencoders under SGD and GD.

The net is ``f(x) = U σ(Wx)`` (``W`` ∈ R^{H×n}, ``U`` ∈ R^{n×H}, no biases) trained on
``ℓ = ‖f(x) − y‖²`` (sum over outputs, mean over the minibatch; the paper's eq. 12 without
weight decay), ``y = x + ε``, ``x ~ N(0, I_n)``, ``ε ~ N(0, diag(σ_ε²))`` (paper §5.4, App.
A.4). Several activations train at once, along a leading run axis, from the *same*
initialisation. Both optimisers minimise the same objective, the population risk
``L(θ) = E‖f(x) − y‖²``:

* **SGD** follows unbiased stochastic gradients of ``L``: fresh minibatches of
  ``batch_size`` samples ``(x, y)`` from the data model each step (online; nothing to
  memorise, the residual at the end is the label noise).
* **GD** follows the deterministic gradient of ``L``. Because ε is independent of x with
  mean zero, ``∇L = E_x[2 Jᵀ(f(x) − x)]`` exactly — the label noise integrates out of the
  population gradient — and the remaining expectation over x is a fixed quadrature: the
  same ``gd_points`` inputs every step, whitened so that their empirical mean is 0 and
  second moment exactly ``I`` (then the quadrature is exact for the linear part of the
  net; only the nonlinear corrections carry a sampling error). Targets are the inputs
  themselves. So GD has no gradient noise at all (its charges move only by the
  O(η²‖∇L‖²) discretisation term), and there is no label noise it could memorise. The
  gap between the quadrature loss and the held-out loss is recorded (``gd_fit_gap``).
  A fixed noisy training set shared with SGD was rejected: at width 200 full-batch GD
  memorises a few thousand points (held-out loss 68 against the noise floor 44 at
  N = 2048), and a set large enough not to be memorised costs ~10× our budget.

Training runs in float32 (2.6× faster than float64 for the GD quadrature on one core;
the round-off in the charges over 10⁴ steps is ~1e-5 relative, far below the effects
measured); all matrices at the end are computed in float64.

The hidden-space matrices of Thm 5.2 are evaluated at the end on a fresh evaluation
sample of ``n_eval`` noisy pairs:

* ``sigma``: ``WΣ̄_xWᵀ`` against ``UᵀΣ̄_εU`` with the population ``Σ_x = I``,
  ``Σ_ε = diag(σ_ε²)``, each normalised by its trace (eq. 14; Fig. 6);
* ``gamma``: the paper's ``WΓ_WWᵀ`` against ``UᵀΓ_UU`` with ``Γ_W = E[‖r‖²xxᵀ]``,
  ``Γ_U = E[‖x‖²rrᵀ]``, ``r = f(x) − y`` (eq. 13; what Fig. 9 plots);
* ``noise``: the gradient-noise matrices of the two layers, the covariances over samples
  of the per-sample gradients ``∇_Uℓ = 2 r aᵀ`` and ``∇_Wℓ = 2 (Uᵀr ⊙ σ'(h)) xᵀ``
  (``h = Wx``, ``a = σ(h)``), contracted over the outer index:
  ``N_U = Cov[∇_Uℓᵀ∇_Uℓ]``-type ``= 4 Cov-form of E[‖r‖² a aᵀ]`` and
  ``N_W = 4 Cov-form of E[‖x‖² b bᵀ]``, ``b = Uᵀr ⊙ σ'(h)``. These are the matrices whose
  balance ``N_U = N_W`` is the noise equilibrium of the double-rotation charges
  (Prop 5.1 / Thm 4.3; docs/concepts/equilibrium.md's ``M_U``, ``M_W``). For σ = identity they equal
  ``4WΓ_WWᵀ`` and ``4UᵀΓ_UU`` (Thm 5.2 is exactly this balance for the linear net); for a
  nonlinear σ the paper's ``Γ`` matrices drop σ' and use pre- instead of post-activations,
  so they are not the balanced quantities. For ReLU and leaky-ReLU only the per-neuron
  rescaling is an exact symmetry: its equilibrium is the balance of the diagonals,
  ``diag N_U = diag N_W``, recorded as ``rel_diff_noise_diag``; the off-diagonal part of
  the balance is only approximate (the rotation symmetry is broken by σ).
  ``noise_mean_share`` records which share of ``‖N_U‖_F`` lies along the mean
  post-activation ``E[a]`` (``ūᵀN_Uū / ‖N_U‖_F``): a direction in which ``∇_U`` carries noise
  (``2r āᵀ``) while the function needs ``Uā ≈ 0``, with no counterpart in ``N_W``.

Relative differences are ``‖A − B‖_F / (½(‖A‖_F + ‖B‖_F))`` (symmetric in the two); for
diagonals, the same with vector norms.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from noetherflow._divergence import all_finite, find_divergence
from noetherflow.train import GeometricDecay, lr_sequence

__all__ = [
    "ACTIVATIONS",
    "Hidden",
    "Trained",
    "activation",
    "hidden_matrices",
    "init_weights",
    "lr_schedule",
    "noise_variances",
    "quadrature_inputs",
    "rel_diff",
    "train",
]

_DTYPE = torch.float64  # evaluation
_TRAIN_DTYPE = torch.float32  # training (see the module docstring)
_LEAKY_SLOPE = 0.01  # torch.nn.LeakyReLU's default

Act = Callable[[Tensor], tuple[Tensor, Tensor]]


def _tanh(h: Tensor) -> tuple[Tensor, Tensor]:
    t = torch.tanh(h)
    return t, 1.0 - t * t


def _relu(h: Tensor) -> tuple[Tensor, Tensor]:
    pos = h > 0
    return h * pos, pos.to(h.dtype)


def _leaky(h: Tensor) -> tuple[Tensor, Tensor]:
    slope = torch.where(h > 0, 1.0, _LEAKY_SLOPE).to(h.dtype)
    return h * slope, slope


def _swish(h: Tensor) -> tuple[Tensor, Tensor]:
    s = torch.sigmoid(h)
    return h * s, s * (1.0 + h * (1.0 - s))


ACTIVATIONS: dict[str, Act] = {
    "tanh": _tanh,
    "relu": _relu,
    "leaky_relu": _leaky,
    "swish": _swish,
}


def activation(name: str) -> Act:
    """``σ`` and ``σ'`` of ``name`` in one call: ``h ↦ (σ(h), σ'(h))``."""
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(
            f"unknown activation {name!r}; expected one of {sorted(ACTIVATIONS)}"
        ) from None


def noise_variances(dim: int, first: float) -> Tensor:
    """``Var ε_1 = first``, ``Var ε_i = 1`` otherwise; shape ``[dim]``."""
    se = torch.ones(dim, dtype=_DTYPE)
    se[0] = first
    return se


def init_weights(dim: int, hidden: int, *, scale: float, seed: int) -> tuple[Tensor, Tensor]:
    """``W ~ N(0, scale²/n)`` ``[H, n]`` and ``U ~ N(0, scale²/H)`` ``[n, H]`` (fan-in)."""
    g = torch.Generator().manual_seed(int(seed))
    W = torch.randn(hidden, dim, generator=g, dtype=_DTYPE) * (scale / math.sqrt(dim))
    U = torch.randn(dim, hidden, generator=g, dtype=_DTYPE) * (scale / math.sqrt(hidden))
    return U, W


def quadrature_inputs(n_points: int, dim: int, *, seed: int) -> Tensor:
    """``n_points`` Gaussian inputs with empirical mean 0 and second moment exactly ``I``.

    Has shape ``[n_points, dim]``; float64.
    """
    if n_points <= dim:
        raise ValueError(f"gd_points={n_points} must exceed the input dimension {dim}")
    g = torch.Generator().manual_seed(int(seed))
    z = torch.randn(n_points, dim, generator=g, dtype=_DTYPE)
    z = z - z.mean(0)
    chol = torch.linalg.cholesky(z.T @ z / n_points)
    return torch.linalg.solve_triangular(chol, z.T, upper=False).T


def lr_schedule(lr: float, steps: int, *, lr_final: float, decay_frac: float) -> np.ndarray:
    """Constant ``lr``, then a geometric decay to ``lr_final`` over the last ``decay_frac``
    (:class:`noetherflow.train.GeometricDecay`); shape ``[steps]``."""
    return lr_sequence(GeometricDecay(steps, decay_frac=decay_frac, final_lr=lr_final), lr, steps)


def _forward_grads(
    U: Tensor, W: Tensor, x: Tensor, y: Tensor, acts: Sequence[Act]
) -> tuple[Tensor, Tensor, Tensor]:
    """Minibatch-mean gradients of ``‖Uσ(Wx) − y‖²`` for every run.

    ``U`` [R, n, H], ``W`` [R, H, n]; ``x``, ``y`` [S, n] (shared by the runs) or [R, S, n]
    (one minibatch per run). ``acts`` has A entries and R = G·A: run ``g·A + i`` uses
    ``acts[i]``. Returns ``(∇U, ∇W, loss)`` with shapes [R, n, H], [R, H, n], [R].
    """
    h = torch.matmul(x, W.transpose(-2, -1))  # [R, S, H]
    a = torch.empty_like(h)
    da = torch.empty_like(h)
    A = len(acts)
    hv, av, dav = (t.view(-1, A, *t.shape[1:]) for t in (h, a, da))  # [G, A, S, H]
    for i, f in enumerate(acts):
        av[:, i], dav[:, i] = f(hv[:, i])
    r = torch.matmul(a, U.transpose(-2, -1)) - y  # [R, S, n]
    c = 2.0 / x.shape[-2]
    gU = c * torch.matmul(r.transpose(-2, -1), a)
    back = torch.matmul(r, U) * da  # [R, S, H]
    gW = c * torch.matmul(back.transpose(-2, -1), x)
    loss = (r * r).sum(dim=(-2, -1)) / x.shape[-2]
    return gU, gW, loss


@dataclass
class Trained:
    """Weights at the end (runs along the first axis, float64) and the recorded losses."""

    U: Tensor  # [R, n, H]
    W: Tensor  # [R, H, n]
    step: np.ndarray  # [T]
    loss: np.ndarray  # [R, T] training loss, averaged over the steps of each record
    monitor: np.ndarray  # [R, T + 1] monitor(U, W) at step 0 and at each record
    diverged: bool
    snapshots: list[tuple[int, Tensor, Tensor]] = dataclasses.field(default_factory=list)


def train(
    U0: Tensor,
    W0: Tensor,
    acts: Sequence[str],
    se: Tensor,
    *,
    lrs: np.ndarray,
    batch_size: int,
    seed: int | Sequence[int],
    fixed_x: Tensor | None = None,
    n_records: int = 100,
    monitor: Callable[[Tensor, Tensor], Tensor] | None = None,
    chunk: int = 250,
    snapshot_at: Sequence[int] = (),
) -> Trained:
    """SGD on fresh minibatches of ``batch_size``, or GD on the quadrature ``fixed_x``.

    With ``fixed_x`` [N, n] every step uses all N inputs with targets ``x`` (the label
    noise integrated out; see the module docstring), and its recorded loss adds
    ``Tr Σ_ε`` so that it is comparable with SGD's; ``batch_size`` and ``seed`` are then
    unused. Replicates: ``U0`` [G, n, H], ``W0`` [G, H, n] and ``seed`` a sequence of G
    seeds (or ``U0`` [n, H], ``W0`` [H, n] and one seed: G = 1); runs are group-major
    (run ``g·A + i`` is replicate ``g`` with ``acts[i]``, R = G·A). Every activation of a
    replicate trains from that replicate's init on that replicate's minibatches (its own
    generator, so a replicate's draws do not depend on G). ``lrs`` holds the learning rate
    of each step; ``monitor(U, W) -> [R]`` (float64 arguments) is recorded with the loss.
    ``snapshot_at``: steps after which a float64 copy of ``(U, W)`` is kept
    (``Trained.snapshots``), for time averages.
    """
    dt = _TRAIN_DTYPE
    fs = [activation(a) for a in acts]
    seeds = [int(seed)] if isinstance(seed, int) else [int(v) for v in seed]
    U0g, W0g = (U0, W0) if U0.dim() == 3 else (U0[None], W0[None])
    G, A = len(seeds), len(fs)
    if U0g.shape[0] != G or W0g.shape[0] != G:
        raise ValueError(
            f"{U0g.shape[0]} initialisations for {G} seeds; expected one init per seed."
        )
    R = G * A
    U = U0g.to(dt).repeat_interleave(A, dim=0)
    W = W0g.to(dt).repeat_interleave(A, dim=0)
    n = W.shape[-1]
    steps = len(lrs)
    gens = [torch.Generator().manual_seed(v) for v in seeds]
    sd = se.sqrt().to(dt)
    floor = float(se.sum())
    xq = None if fixed_x is None else fixed_x.to(dt)
    every = max(1, steps // n_records)
    rec_step: list[int] = []
    rec_loss: list[Tensor] = []
    rec_mon: list[Tensor] = []
    snaps = set(int(k) for k in snapshot_at)
    snapshots: list[tuple[int, Tensor, Tensor]] = []

    def mon() -> None:
        if monitor is not None:
            rec_mon.append(monitor(U.to(_DTYPE), W.to(_DTYPE)))

    mon()
    acc = torch.zeros(R, dtype=_DTYPE)
    n_acc = 0
    diverged = False
    t = 0
    while t < steps:
        m = min(chunk, steps - t)
        if xq is None:
            drawn = []
            for gen in gens:
                xg = torch.randn((m, batch_size, n), generator=gen, dtype=dt)
                drawn.append(
                    (xg, xg + torch.randn((m, batch_size, n), generator=gen, dtype=dt) * sd)
                )
            if G == 1:  # shared by the activations: [m, S, n]
                xs, ys = drawn[0]
            else:  # one minibatch per run: [m, R, S, n]
                xs = torch.stack([d[0] for d in drawn], 1).repeat_interleave(A, dim=1)
                ys = torch.stack([d[1] for d in drawn], 1).repeat_interleave(A, dim=1)
        for j in range(m):
            if xq is None:
                gU, gW, loss = _forward_grads(U, W, xs[j], ys[j], fs)
            else:
                gU, gW, loss = _forward_grads(U, W, xq, xq, fs)
                loss = loss + floor
            eta = float(lrs[t])
            U = U - eta * gU
            W = W - eta * gW
            acc += loss.to(_DTYPE)
            n_acc += 1
            t += 1
            if t in snaps:
                snapshots.append((t, U.to(_DTYPE), W.to(_DTYPE)))
            if t % every == 0 or t == steps:
                rec_step.append(t)
                rec_loss.append(acc / n_acc)
                mon()
                acc = torch.zeros(R, dtype=_DTYPE)
                n_acc = 0
        if not bool(all_finite([U, W])):
            diverged = True
            break
    return Trained(
        U=U.to(_DTYPE),
        W=W.to(_DTYPE),
        step=np.asarray(rec_step),
        loss=(torch.stack(rec_loss, dim=1).numpy() if rec_loss else np.zeros((R, 0))),
        monitor=(torch.stack(rec_mon, dim=1).numpy() if rec_mon else np.zeros((R, 0))),
        diverged=diverged,
        snapshots=snapshots,
    )


def rel_diff(a: Tensor, b: Tensor) -> Tensor:
    """``‖a − b‖_F / (½(‖a‖_F + ‖b‖_F))`` over the last two axes."""
    num = torch.linalg.matrix_norm(a - b)
    return num / (0.5 * (torch.linalg.matrix_norm(a) + torch.linalg.matrix_norm(b)))


def _rel_diff_vec(a: Tensor, b: Tensor) -> Tensor:
    num = torch.linalg.vector_norm(a - b, dim=-1)
    return num / (0.5 * (torch.linalg.vector_norm(a, dim=-1) + torch.linalg.vector_norm(b, dim=-1)))


@dataclass
class Hidden:
    """The hidden-space matrices of Thm 5.2 for each run (shape [R, H, H])."""

    w_sigma: Tensor  # W Σ̄_x Wᵀ
    u_sigma: Tensor  # Uᵀ Σ̄_ε U
    w_gamma: Tensor  # W Γ_W Wᵀ (paper's Γ_W = E[‖r‖² x xᵀ])
    u_gamma: Tensor  # Uᵀ Γ_U U (paper's Γ_U = E[‖x‖² r rᵀ])
    w_noise: Tensor  # Σ_i Cov[∇_U ℓ]: 4 (E[‖r‖² a aᵀ] − E[a rᵀ] E[r aᵀ])
    u_noise: Tensor  # Σ_j Cov[∇_W ℓ]: 4 (E[‖x‖² b bᵀ] − E[b xᵀ] E[x bᵀ])
    mean_share: Tensor  # [R] ūᵀ w_noise ū / ‖w_noise‖_F, ū = E[a] / ‖E[a]‖
    eval_loss: Tensor  # [R] E‖f(x) − y‖² on the evaluation sample
    clean_loss: Tensor  # [R] E‖f(x) − x‖² on the evaluation sample (noise removed)


def eval_sample(dim: int, se: Tensor, *, n_eval: int, seed: int) -> tuple[Tensor, Tensor]:
    """``n_eval`` fresh pairs ``x ~ N(0, I)``, ``y = x + ε`` (float64); each ``[n_eval, dim]``."""
    gen = torch.Generator().manual_seed(int(seed))
    x = torch.randn((n_eval, dim), generator=gen, dtype=_DTYPE)
    eps = torch.randn((n_eval, dim), generator=gen, dtype=_DTYPE) * se.sqrt()
    return x, x + eps


_HOMOGENEOUS = {"relu": lambda: nn.ReLU(), "leaky_relu": lambda: nn.LeakyReLU(_LEAKY_SLOPE)}
"""Activations with an exact per-neuron rescaling symmetry, as torch modules."""


def library_neuron_flow(
    U: Tensor,
    W: Tensor,
    act: str,
    se: Tensor,
    *,
    lr: float,
    batch_size: int,
    n_eval: int,
    seed: int,
) -> dict[str, float]:
    """The per-neuron rescaling flow by the library, against ``hidden_matrices``' diagonals.

    ``U`` [n, H], ``W`` [H, n] of one run with ``act`` ∈ {relu, leaky_relu}. On the sample of
    :func:`eval_sample`, ``nf.collect_stats`` (hooks) and ``nf.noether_flow`` (continuous
    time, γ = 0) of ``nf.Rescaling`` give ``(η/S)(Σ_i Var[∇W_ji] − Σ_o Var[∇U_oj])`` per
    neuron j, which must equal ``(η/S)(diag N_W − diag N_U)`` of :func:`hidden_matrices`
    (``u_noise``, ``w_noise``). Returns their relative difference (max-norm) and the
    library's relative per-neuron imbalance ``‖flow‖ / (½(‖a‖ + ‖b‖))`` in the vector norms
    of the two diagonals.
    """
    import noetherflow as nf

    if act not in _HOMOGENEOUS:
        raise ValueError(f"act={act!r} has no exact rescaling symmetry; use {sorted(_HOMOGENEOUS)}")
    n, h = W.shape[1], W.shape[0]
    first = nn.Linear(n, h, bias=False, dtype=_DTYPE)
    second = nn.Linear(h, n, bias=False, dtype=_DTYPE)
    with torch.no_grad():
        first.weight.copy_(W)
        second.weight.copy_(U)
    model = nn.Sequential(first, _HOMOGENEOUS[act](), second)
    syms = nf.SymmetrySet([nf.Rescaling(first, second, label="neurons")])
    x, y = eval_sample(n, se, n_eval=n_eval, seed=seed)

    def loss_fn(out: Tensor, target: Tensor) -> Tensor:
        return ((out - target) ** 2).sum(dim=-1).mean()

    stats = nf.collect_stats(model, syms, loss_fn, x, y)
    flow = nf.noether_flow(syms, stats, lr=lr, batch_size=batch_size)["neurons"]
    hm = hidden_matrices(U[None], W[None], [act], se, n_eval=n_eval, seed=seed)
    a = torch.diagonal(hm.u_noise[0])  # Σ_i Var[∇W_ji]
    b = torch.diagonal(hm.w_noise[0])  # Σ_o Var[∇U_oj]
    oracle = (lr / batch_size) * (a - b)
    scale = float(oracle.abs().max())
    return {
        "flow_vs_oracle": float((flow - oracle).abs().max()) / scale,
        "library_rel_diff": float(
            torch.linalg.vector_norm(flow)
            * batch_size
            / lr
            / (0.5 * (torch.linalg.vector_norm(a) + torch.linalg.vector_norm(b)))
        ),
    }


def hidden_matrices(
    U: Tensor, W: Tensor, acts: Sequence[str], se: Tensor, *, n_eval: int, seed: int
) -> Hidden:
    """All three pairs of hidden matrices at ``(U, W)``; expectations on ``n_eval`` samples.

    The noise pair is named by the layer side it is compared with in Thm 5.2: ``w_noise``
    (from ``∇_U``, the counterpart of ``WΓ_WWᵀ``) and ``u_noise`` (from ``∇_W``, the
    counterpart of ``UᵀΓ_UU``).
    """
    n = W.shape[-1]
    x, y = eval_sample(n, se, n_eval=n_eval, seed=seed)
    sx_bar = torch.eye(n, dtype=_DTYPE) / n
    se_bar = torch.diag(se / se.sum())
    w_sigma = W @ sx_bar @ W.transpose(-2, -1)
    u_sigma = U.transpose(-2, -1) @ se_bar @ U
    h = torch.matmul(x, W.transpose(-2, -1))  # [R, N, H]
    pairs = [activation(name)(h[i]) for i, name in enumerate(acts)]
    a = torch.stack([p[0] for p in pairs])
    da = torch.stack([p[1] for p in pairs])
    r = torch.matmul(a, U.transpose(-2, -1)) - y  # [R, N, n]
    r2 = (r * r).sum(-1, keepdim=True)  # [R, N, 1]
    x2 = (x * x).sum(-1, keepdim=True)  # [N, 1]
    gamma_w = torch.matmul((x * r2).transpose(-2, -1), x) / n_eval  # E[‖r‖² x xᵀ]
    gamma_u = torch.matmul((r * x2).transpose(-2, -1), r) / n_eval  # E[‖x‖² r rᵀ]
    # per-sample gradients: ∇_U ℓ = 2 r aᵀ, ∇_W ℓ = 2 b xᵀ with b = Uᵀr ⊙ σ'(h)
    b = torch.matmul(r, U) * da  # [R, N, H]
    mean_gu = 2.0 * torch.matmul(r.transpose(-2, -1), a) / n_eval  # [R, n, H]
    mean_gw = 2.0 * torch.matmul(b.transpose(-2, -1), x) / n_eval  # [R, H, n]
    w_noise = 4.0 * torch.matmul((a * r2).transpose(-2, -1), a) / n_eval
    w_noise = w_noise - mean_gu.transpose(-2, -1) @ mean_gu
    u_noise = 4.0 * torch.matmul((b * x2).transpose(-2, -1), b) / n_eval
    u_noise = u_noise - mean_gw @ mean_gw.transpose(-2, -1)
    clean = a @ U.transpose(-2, -1) - x
    abar = a.mean(-2)
    ubar = abar / torch.linalg.vector_norm(abar, dim=-1, keepdim=True)
    along = torch.einsum("rh,rhg,rg->r", ubar, w_noise, ubar)
    return Hidden(
        w_sigma=w_sigma,
        u_sigma=u_sigma,
        w_gamma=W @ gamma_w @ W.transpose(-2, -1),
        u_gamma=U.transpose(-2, -1) @ gamma_u @ U,
        w_noise=w_noise,
        u_noise=u_noise,
        mean_share=along / torch.linalg.matrix_norm(w_noise),
        eval_loss=r2.mean(dim=(-2, -1)),
        clean_loss=(clean * clean).sum(-1).mean(-1),
    )


# --------------------------------------------------------------------------------------
# the experiment shared by fig6 and fig9
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NonlinearConfig:
    """Settings shared by Fig. 6 and Fig. 9 (their ``Config`` docstrings give the reasons)."""

    activations: tuple[str, ...] = ("tanh",)
    dim: int = 40
    hidden: int = 200
    noise_first: float = 5.0
    init_scale: float = 1.0
    batch_size: int = 16
    lr: float = 0.02
    lr_final: float = 0.002
    decay_frac: float = 0.5
    steps: int = 10000
    gd_points: int = 512
    gd_lr: float = 0.02
    gd_steps: int = 10000
    n_eval: int = 20000
    n_show: int = 40
    n_records: int = 100
    constant_seeds: int = 1
    burn_in_frac: float = 0.5
    n_snapshots: int = 5
    n_seeds: int = 1
    gd_seeds: int | None = None  # GD replicates (None: n_seeds)


KINDS = ("sigma", "gamma", "noise")


def _inits(cfg: NonlinearConfig, seeds: Sequence[int]) -> tuple[Tensor, Tensor]:
    """One fan-in init per seed, stacked: ``U0`` [G, n, H], ``W0`` [G, H, n]."""
    pairs = [init_weights(cfg.dim, cfg.hidden, scale=cfg.init_scale, seed=s) for s in seeds]
    return torch.stack([u for u, _ in pairs]), torch.stack([w for _, w in pairs])


def _rel_diffs(hm: Hidden) -> dict[str, np.ndarray]:
    """``rel_diff_<kind>`` for every kind and ``rel_diff_noise_diag``, one value per run."""
    out = {
        f"rel_diff_{kind}": rel_diff(getattr(hm, f"w_{kind}"), getattr(hm, f"u_{kind}")).numpy()
        for kind in KINDS
    }
    out["rel_diff_noise_diag"] = _rel_diff_vec(
        torch.diagonal(hm.w_noise, dim1=-2, dim2=-1),
        torch.diagonal(hm.u_noise, dim1=-2, dim2=-1),
    ).numpy()
    return out


def run_constant(cfg: NonlinearConfig, seed: int, tag: str) -> dict[str, Any]:
    """The paper's protocol: SGD at a constant ``cfg.lr`` for ``cfg.steps``, per seed.

    Each of ``cfg.constant_seeds`` seeds has its own init and batch stream (trained together
    along the run axis; each seed's draws are those of a run of its own); the hidden
    matrices are evaluated at ``cfg.n_snapshots`` evenly spaced steps of the window after a
    burn-in of ``cfg.burn_in_frac`` of the steps (fresh ``cfg.n_eval`` samples each), and the
    relative differences are averaged over them (time averages). Returns, per activation,
    lists over seeds of the averaged ``rel_diff_<kind>`` and ``rel_diff_noise_diag``, and
    the window.
    """
    from noetherflow.experiments._base import derive_seed

    acts = list(cfg.activations)
    A, G = len(acts), cfg.constant_seeds
    se = noise_variances(cfg.dim, cfg.noise_first)
    start = round(cfg.burn_in_frac * cfg.steps)
    snaps = sorted({int(v) for v in np.linspace(start, cfg.steps, cfg.n_snapshots).round()})
    keys = [f"rel_diff_{k}" for k in KINDS] + ["rel_diff_noise_diag"]
    U0, W0 = _inits(cfg, [derive_seed(seed, tag, "constant", "init", j) for j in range(G)])
    tr = train(
        U0,
        W0,
        acts,
        se,
        lrs=np.full(cfg.steps, float(cfg.lr)),
        batch_size=cfg.batch_size,
        seed=[derive_seed(seed, tag, "constant", j) for j in range(G)],
        n_records=cfg.n_records,
        snapshot_at=snaps,
    )
    diverged = tr.diverged or any(find_divergence(r).diverged for r in tr.loss)
    acc = {k: np.zeros(G * A) for k in keys}
    for t, U, W in tr.snapshots:
        for j in range(G):
            sl = slice(j * A, (j + 1) * A)
            hm = hidden_matrices(
                U[sl],
                W[sl],
                acts,
                se,
                n_eval=cfg.n_eval,
                seed=derive_seed(seed, tag, "constant", "eval", j, t),
            )
            for k, v in _rel_diffs(hm).items():
                acc[k][sl] += v
    n = max(1, len(tr.snapshots))
    out: dict[str, Any] = {
        a: {
            k: [float(acc[k][j * A + i] / n) if tr.snapshots else math.nan for j in range(G)]
            for k in keys
        }
        for i, a in enumerate(acts)
    }
    return {"by_activation": out, "window_steps": snaps, "diverged": bool(diverged)}


def run_nonlinear(cfg: NonlinearConfig, seed: int, tag: str) -> dict[str, Any]:
    """SGD and GD from ``cfg.n_seeds`` inits (GD: the first ``cfg.gd_seeds``) for every
    activation; the hidden matrices at the end.

    Per (mode, activation), ``series[f"{mode}_{act}"]`` holds seed 0's run (heat maps,
    curves, the library check) and, for every relative difference, ``<name>_seeds`` (one
    value per seed) and ``<name>`` (their mean).
    """
    from noetherflow.experiments._base import derive_seed

    acts = list(cfg.activations)
    A, G = len(acts), cfg.n_seeds
    if cfg.gd_seeds is not None and not 1 <= cfg.gd_seeds <= G:
        raise ValueError(f"gd_seeds={cfg.gd_seeds}; expected 1 ≤ gd_seeds ≤ n_seeds={G}.")
    se = noise_variances(cfg.dim, cfg.noise_first)

    def keyed(*key: Any) -> int:
        """Seed 0 keeps the single-seed keys (its init and streams are those of earlier
        rounds); replicate ``j > 0`` appends ``j``."""
        *head, j = key
        return derive_seed(seed, *head, *([j] if j else []))

    U0, W0 = _inits(cfg, [keyed(tag, "init", j) for j in range(G)])
    sx_bar = torch.eye(cfg.dim, dtype=_DTYPE) / cfg.dim
    se_bar = torch.diag(se / se.sum())

    def sigma_gap(U: Tensor, W: Tensor) -> Tensor:
        return rel_diff(W @ sx_bar @ W.transpose(-2, -1), U.transpose(-2, -1) @ se_bar @ U)

    out: dict[str, Any] = {"series": {}}
    k = cfg.n_show
    xq = quadrature_inputs(cfg.gd_points, cfg.dim, seed=derive_seed(seed, tag, "quadrature"))
    for mode in ("sgd", "gd"):
        if mode == "sgd":
            lrs = lr_schedule(cfg.lr, cfg.steps, lr_final=cfg.lr_final, decay_frac=cfg.decay_frac)
            fixed, reps = None, G
        else:
            lrs = np.full(cfg.gd_steps, float(cfg.gd_lr))
            fixed, reps = xq, G if cfg.gd_seeds is None else cfg.gd_seeds
        tr = train(
            U0[:reps],
            W0[:reps],
            acts,
            se,
            lrs=lrs,
            batch_size=cfg.batch_size,
            seed=[keyed(tag, mode, j) for j in range(reps)],
            fixed_x=fixed,
            n_records=cfg.n_records,
            monitor=sigma_gap,
        )
        hms = [
            hidden_matrices(
                tr.U[j * A : (j + 1) * A],
                tr.W[j * A : (j + 1) * A],
                acts,
                se,
                n_eval=cfg.n_eval,
                seed=keyed(tag, "eval", j),
            )
            for j in range(reps)
        ]
        hm = hms[0]  # seed 0: heat maps, losses, the library check
        rds = [_rel_diffs(h) for h in hms]
        div = tr.diverged or any(find_divergence(row).diverged for row in tr.loss)
        for i, act in enumerate(acts):
            s: dict[str, Any] = {}
            for name in rds[0]:
                s[f"{name}_seeds"] = [float(rd[name][i]) for rd in rds]
                s[name] = float(np.mean(s[f"{name}_seeds"]))
            s.update(
                noise_mean_share=float(hm.mean_share[i]),
                eval_loss=float(hm.eval_loss[i]),
                eval_clean_loss=float(hm.clean_loss[i]),
                final_train_loss=float(tr.loss[i, -1]) if tr.loss.shape[1] else math.nan,
                norm_sq_W=float((tr.W[i] ** 2).sum()),
                norm_sq_U=float((tr.U[i] ** 2).sum()),
                step=tr.step,
                loss=tr.loss[i],
                rel_diff_sigma_over_time=tr.monitor[i],
                diverged=bool(div),
            )
            for kind in KINDS:
                s[f"w_{kind}_block"] = getattr(hm, f"w_{kind}")[i, :k, :k].numpy()
                s[f"u_{kind}_block"] = getattr(hm, f"u_{kind}")[i, :k, :k].numpy()
            if mode == "gd":
                # quadrature loss (noise floor added) against the held-out loss
                s["gd_fit_gap"] = s["eval_loss"] - s["final_train_loss"]
            if mode == "sgd" and act in _HOMOGENEOUS:
                lib = library_neuron_flow(
                    tr.U[i],
                    tr.W[i],
                    act,
                    se,
                    lr=cfg.lr_final,
                    batch_size=cfg.batch_size,
                    n_eval=cfg.n_eval,
                    seed=derive_seed(seed, tag, "eval"),
                )
                s["library_neuron_flow_vs_oracle"] = lib["flow_vs_oracle"]
                s["library_rel_diff_noise_diag"] = lib["library_rel_diff"]
            out["series"][f"{mode}_{act}"] = s
    out["noise_floor"] = float(se.sum())
    out["n_show"] = k
    out["n_seeds"] = G
    out["constant"] = run_constant(cfg, seed, tag)
    return out

"""The two-layer linear net of Figs. 2 and 8: its noise factors, balance and training loop.

``f(x) = UWx`` on ``y = x + ε``, ``x ~ N(0, Σ_x)``, ``ε ~ N(0, Σ_ε)`` (paper §5.2, App. A.2); the
closed forms of Γ_W and Γ_U and the batched training loop are documented in
:mod:`noetherflow.experiments.fig2`, the experiment that uses them with Fig. 8.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

import noetherflow as nf
from noetherflow._divergence import all_finite
from noetherflow.theory.ziyin2024 import two_layer_noise_factors, two_layer_sgd_solution
from noetherflow.train import GeometricDecay, lr_sequence

_DTYPE = torch.float64


# --------------------------------------------------------------------------------------
# shared core (also used by fig8)
# --------------------------------------------------------------------------------------


def gammas(U: Tensor, W: Tensor, sx: Tensor, se: Tensor) -> tuple[Tensor, Tensor]:
    """Exact ``(Γ_W, Γ_U)`` at ``(U, W)`` for ``y = x + ε``, diagonal ``Σ_x = diag(sx)``,
    ``Σ_ε = diag(se)``; batched: ``U`` [R, d_y, d], ``W`` [R, d, d_x], ``se`` [R, d_y]."""
    n = W.shape[-1]
    eye = torch.eye(n, dtype=U.dtype)
    A = U @ W - eye  # [R, n, n]
    asx = A * sx  # A Σ_x
    tr_asa = (asx * A).sum(dim=(-2, -1))  # Tr[A Σ_x Aᵀ]
    tr_se = se.sum(dim=-1)
    gw = (tr_asa + tr_se)[:, None, None] * torch.diag(sx) + 2.0 * sx[:, None] * (
        A.transpose(-2, -1) @ A
    ) * sx[None, :]
    m = float(sx.sum()) * sx + 2.0 * sx * sx  # diag of E[‖x‖² xxᵀ]
    gu = (A * m) @ A.transpose(-2, -1) + float(sx.sum()) * torch.diag_embed(se)
    return gw, gu


def balance(U: Tensor, W: Tensor, sx: Tensor, se: Tensor) -> tuple[Tensor, Tensor]:
    """``(Δ, WΓ_WWᵀ)`` with ``Δ = UᵀΓ_UU − WΓ_WWᵀ`` (batched)."""
    gw, gu = gammas(U, W, sx, se)
    wgw = W @ gw @ W.transpose(-2, -1)
    return U.transpose(-2, -1) @ gu @ U - wgw, wgw


def rel_balance_error(U: Tensor, W: Tensor, sx: Tensor, se: Tensor) -> Tensor:
    """``‖Δ‖_F / ‖WΓ_WWᵀ‖_F`` per run, shape [R]."""
    delta, wgw = balance(U, W, sx, se)
    return torch.linalg.matrix_norm(delta) / torch.linalg.matrix_norm(wgw)


def population_loss(U: Tensor, W: Tensor, sx: Tensor, se: Tensor) -> Tensor:
    """``E‖UWx − y‖² = ‖(UW − I)Σ_x^{1/2}‖_F² + Tr Σ_ε`` per run."""
    A = U @ W - torch.eye(W.shape[-1], dtype=U.dtype)
    return (A * A * sx).sum(dim=(-2, -1)) + se.sum(dim=-1)


@dataclass
class TrainResult:
    """Output of :func:`train_two_layer` (numpy arrays; runs along the first axis)."""

    step: np.ndarray  # [T]
    rel_err: np.ndarray  # [R, T]
    delta_norm: np.ndarray  # [R, T]
    loss: np.ndarray  # [R, T] population loss
    entries: np.ndarray  # [R, T, k] tracked entries of Δ
    U: Tensor
    W: Tensor
    diverged: bool
    # time averages over the records at steps ≥ average_from (None without average_from)
    delta_mean: np.ndarray | None = None  # [R, d, d] ⟨Δ⟩
    wgw_norm_mean: np.ndarray | None = None  # [R] ⟨‖WΓ_WWᵀ‖_F⟩


def train_two_layer(
    U0: Tensor,
    W0: Tensor,
    sx: Tensor,
    se: Tensor,
    *,
    lr: float,
    batch_size: int,
    steps: int,
    record_every: int,
    seed: int,
    lr_final: float | None = None,
    decay_frac: float = 0.0,
    full_batch: bool = False,
    loss_scale: float = 1.0,
    track: tuple[np.ndarray, np.ndarray] | None = None,
    chunk: int = 200,
    dense_until: int = 0,
    average_from: int | None = None,
    weight_decay: float = 0.0,
) -> TrainResult:
    """SGD (fresh minibatches of the data model) or population GD on ``‖UWx − y‖²``.

    ``U0`` [R, n, d], ``W0`` [R, d, n] (one init per run, all runs in one batched loop),
    ``sx`` [n] (diag Σ_x, shared), ``se`` [R, n] (diag Σ_ε per run). The per-sample loss is
    ``loss_scale · ‖UWx − y‖²`` (``loss_scale = 1/n`` is the output-averaged loss); the
    minibatch loss is the mean over ``batch_size`` samples. Float64. Records are taken every
    ``record_every`` steps, and at every step up to ``dense_until``. With ``average_from``
    the records at steps ≥ it are also averaged: ⟨Δ⟩ and ⟨‖WΓ_WWᵀ‖_F⟩ (the time-averaged
    balance, whose relative size is the equilibrium's O(η) bias, without the parameters' own
    O(√η) fluctuation that the mean of ‖Δ‖ carries). ``weight_decay`` γ adds
    ``γ(‖U‖_F² + ‖W‖_F²)`` to the loss (eq. 12), i.e. ``−2ηγ`` times the weights per step
    (SGD only). The recorded Δ and loss are those without the weight-decay term.
    """
    U, W = U0.clone(), W0.clone()
    R, n, _ = U.shape
    gen = torch.Generator().manual_seed(int(seed))
    sx_sqrt, se_sqrt = sx.sqrt(), se.sqrt()[:, None, :]
    eye = torch.eye(n, dtype=U.dtype)
    sxm = torch.diag(sx)
    sched = (
        None
        if lr_final is None
        else GeometricDecay(steps, decay_frac=decay_frac, final_lr=lr_final)
    )
    lrs = lr_sequence(sched, lr, steps)
    rec_step: list[int] = []
    rel: list[Tensor] = []
    dn: list[Tensor] = []
    loss: list[Tensor] = []
    ent: list[Tensor] = []
    diverged = False
    sums: list[Tensor] = []  # [Σ Δ, Σ ‖WΓ_WWᵀ‖] over the averaged records
    n_avg = [0]

    def record(t: int) -> None:
        delta, wgw = balance(U, W, sx, se)
        if average_from is not None and t >= average_from:
            nw = torch.linalg.matrix_norm(wgw)
            sums[:] = [delta.clone(), nw] if not sums else [sums[0] + delta, sums[1] + nw]
            n_avg[0] += 1
        nd = torch.linalg.matrix_norm(delta)
        rec_step.append(t)
        dn.append(nd)
        rel.append(nd / torch.linalg.matrix_norm(wgw))
        loss.append(population_loss(U, W, sx, se))
        if track is not None:
            ent.append(delta[:, track[0], track[1]])

    record(0)
    t = 0
    while t < steps:
        m = min(chunk, steps - t)
        if not full_batch:
            xs = torch.randn((m, R, batch_size, n), generator=gen, dtype=U.dtype) * sx_sqrt
            es = torch.randn((m, R, batch_size, n), generator=gen, dtype=U.dtype) * se_sqrt
        for j in range(m):
            eta = float(lrs[t])
            if full_batch:
                A = U @ W - eye
                asx = A @ sxm
                gU = asx @ W.transpose(-2, -1)
                gW = U.transpose(-2, -1) @ asx
                U, W = U - (2.0 * eta * loss_scale) * gU, W - (2.0 * eta * loss_scale) * gW
            else:
                X = xs[j]
                h = X @ W.transpose(-2, -1)  # [R, S, d]
                res = h @ U.transpose(-2, -1) - X - es[j]  # [R, S, n]
                gU = res.transpose(-2, -1) @ h
                gW = (res @ U).transpose(-2, -1) @ X
                c = 2.0 * eta * loss_scale / batch_size
                if weight_decay:
                    shrink = 2.0 * eta * weight_decay
                    U, W = U - c * gU - shrink * U, W - c * gW - shrink * W
                else:
                    U, W = U - c * gU, W - c * gW
            t += 1
            if t % record_every == 0 or t == steps or t <= dense_until:
                record(t)
        if not bool(all_finite([U, W])):
            diverged = True
            break
    return TrainResult(
        step=np.asarray(rec_step),
        rel_err=torch.stack(rel, dim=1).numpy(),
        delta_norm=torch.stack(dn, dim=1).numpy(),
        loss=torch.stack(loss, dim=1).numpy(),
        entries=(torch.stack(ent, dim=1).numpy() if ent else np.zeros((R, len(rec_step), 0))),
        U=U,
        W=W,
        diverged=diverged,
        delta_mean=(sums[0] / n_avg[0]).numpy() if sums else None,
        wgw_norm_mean=(sums[1] / n_avg[0]).numpy() if sums else None,
    )


def xavier_init(
    n_out: int, hidden: int, n_in: int, *, scale: float, seed: int
) -> tuple[Tensor, Tensor]:
    """``U ~ N(0, scale²/hidden)`` [n_out, hidden], ``W ~ N(0, scale²/n_in)`` [hidden, n_in]."""
    g = torch.Generator().manual_seed(int(seed))
    U = torch.randn(n_out, hidden, generator=g, dtype=_DTYPE) * (scale / hidden**0.5)
    W = torch.randn(hidden, n_in, generator=g, dtype=_DTYPE) * (scale / n_in**0.5)
    return U, W


def predicted_norm_ratio(U: Tensor, W: Tensor, sx: Tensor, se: Tensor) -> np.ndarray:
    """Thm 5.2 ‖W‖_F²/‖U‖_F² for the product ``UW`` of each run (Γ at the global minimum)."""
    out = []
    for r in range(U.shape[0]):
        sol = two_layer_sgd_solution(
            U[r] @ W[r], torch.diag(sx), torch.diag(se[r]), hidden_dim=U.shape[-1]
        )
        out.append(sol.ratio)
    return np.asarray(out)


def measured_norm_ratio(U: Tensor, W: Tensor) -> np.ndarray:
    return ((W * W).sum(dim=(-2, -1)) / (U * U).sum(dim=(-2, -1))).numpy()


def summed_sq_loss(out: Tensor, target: Tensor) -> Tensor:
    """``‖f(x) − y‖²`` summed over outputs, mean over the batch (paper eq. 12). 0-dim."""
    return ((out - target) ** 2).sum(dim=-1).mean()


def two_layer_module(U: Tensor, W: Tensor) -> tuple[nn.Sequential, nf.SymmetrySet]:
    """``x ↦ UWx`` as ``nn.Sequential(Linear(W), Linear(U))`` (no biases) with its
    ``nf.DoubleRotation`` (charge ``UᵀU − WWᵀ``); ``U`` [n_out, d], ``W`` [d, n_in]."""
    first = nn.Linear(W.shape[1], W.shape[0], bias=False, dtype=W.dtype)
    second = nn.Linear(U.shape[1], U.shape[0], bias=False, dtype=U.dtype)
    with torch.no_grad():
        first.weight.copy_(W)
        second.weight.copy_(U)
    model = nn.Sequential(first, second)
    return model, nf.SymmetrySet([nf.DoubleRotation(first, second, label="rotation")])


def library_flow_check(
    U: Tensor,
    W: Tensor,
    sx: Tensor,
    se: Tensor,
    *,
    lr: float,
    batch_size: int,
    n_eval: int,
    seed: int,
) -> dict[str, float]:
    """The Thm 5.2 balance measured by the library, cross-checked against ``theory``.

    On ``n_eval`` fresh samples of the data model (``x ~ N(0, diag(sx))``, ``y = x + ε``,
    ``ε ~ N(0, diag(se))``; ``U`` [n, d], ``W`` [d, n], one run), ``nf.collect_stats``
    (hooks) and ``nf.noether_flow`` (continuous time, γ = 0) give the rotation flow
    ``F = (η/S)(M_U − M_W)``; the oracle is ``−(4η/S)(UᵀΓ_UU − WΓ_WWᵀ)`` with the sample
    covariances Γ of ``theory.two_layer_noise_factors``. Returns the relative difference of
    the two (round-off if the library is right) and the library's relative balance error
    ``‖F‖_F / ((4η/S)‖WΓ_WWᵀ‖_F)`` on the sample (the closed-form error up to sampling).
    """
    gen = torch.Generator().manual_seed(int(seed))
    n = W.shape[1]
    x = torch.randn(n_eval, n, generator=gen, dtype=_DTYPE) * sx.sqrt()
    y = x + torch.randn(n_eval, n, generator=gen, dtype=_DTYPE) * se.sqrt()
    model, syms = two_layer_module(U, W)
    stats = nf.collect_stats(model, syms, summed_sq_loss, x, y)
    flow = nf.noether_flow(syms, stats, lr=lr, batch_size=batch_size)["rotation"]
    with torch.no_grad():
        r = model(x) - y
    gw, gu = two_layer_noise_factors(x, r, time="continuous")
    c = 4.0 * lr / batch_size
    wgw = W @ gw @ W.T
    oracle = -c * (U.T @ gu @ U - wgw)
    norm = torch.linalg.matrix_norm
    return {
        "flow_vs_theory": float(norm(flow - oracle) / norm(oracle)),
        "library_rel_err": float(norm(flow) / (c * norm(wgw))),
    }


def exponential_fit_r2(step: np.ndarray, delta: np.ndarray, floor: float) -> float:
    """R² of a least-squares line through ``log ‖Δ_t‖`` over the decay phase (Fig. 2: "almost
    exponential"). The decay phase runs from step 0 to the first record with
    ``‖Δ_t‖ ≤ 10·floor`` (``floor``: the stationary level); NaN with fewer than 10 records."""
    below = np.nonzero(delta <= 10.0 * floor)[0]
    end = int(below[0]) if below.size else len(delta)
    if end < 10:
        return float("nan")
    t, y = step[:end].astype(float), np.log(delta[:end])
    slope, icpt = np.polyfit(t, y, 1)
    resid = y - (slope * t + icpt)
    return float(1.0 - resid @ resid / ((y - y.mean()) @ (y - y.mean())))


def decay_rate_ratio(step: np.ndarray, delta: np.ndarray, floor: float) -> float:
    """How far the decay of ``‖Δ_t‖`` is from one exponential: the mean slope of
    ``−log ‖Δ_t‖`` over the first fifth of the decay phase (as in :func:`exponential_fit_r2`)
    divided by that over the other four fifths (1 for an exponential); NaN with fewer than 10
    records in the phase."""
    below = np.nonzero(delta <= 10.0 * floor)[0]
    end = int(below[0]) if below.size else len(delta)
    if end < 10:
        return float("nan")
    k = end // 5
    t, y = step.astype(float), np.log(delta)
    early = (y[0] - y[k]) / (t[k] - t[0])
    late = (y[k] - y[end - 1]) / (t[end - 1] - t[k])
    return float(early / late) if late != 0 else float("nan")

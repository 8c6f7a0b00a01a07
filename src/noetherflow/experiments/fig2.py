"""Fig. 2: matrix factorisation — SGD reaches the Thm 5.2 noise equilibrium, GD does not.

A two-layer linear net ``f(x) = UWx`` (``U`` ∈ R^{d_2×d}, ``W`` ∈ R^{d×d_0}) learns the
autoencoding task ``y = x + ε`` with ``x ~ N(0, Σ_x)`` and label noise ``ε ~ N(0, Σ_ε)``
(paper §5.2, App. A.2). Several runs start from the *same* initialisation and differ only
in the (diagonal, anisotropic) noise covariance ``Σ_ε``. Theorem 5.2 says the SGD noise
drives every charge ``C_B = Tr[B(UᵀU − WWᵀ)]`` to the point where

    Δ := UᵀΓ_U U − WΓ_W Wᵀ = 0,   Γ_W = E[‖r‖²xxᵀ],  Γ_U = E[‖x‖²rrᵀ],  r = UWx − y,

whereas gradient descent conserves ``UᵀU − WWᵀ`` and so keeps the imbalance of its init.

The data model is Gaussian, so ``Γ_W`` and ``Γ_U`` are computed in closed form at the
current ``(U, W)`` (Isserlis): with ``A = UW − I``,
``Γ_W = (Tr[AΣ_xAᵀ] + Tr Σ_ε)Σ_x + 2Σ_xAᵀAΣ_x`` and
``Γ_U = A(Tr[Σ_x]Σ_x + 2Σ_x²)Aᵀ + Tr[Σ_x]Σ_ε`` (the paper's second moments). GD uses the
exact population gradient (``∇_U = 2AΣ_xWᵀ``, ``∇_W = 2UᵀAΣ_x``); SGD draws fresh
minibatches from the data model every step. The core loop (:func:`train_two_layer`) runs
all noise settings at once as a batch of matrices and is shared with Fig. 8.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from noetherflow.experiments._base import Claim, Op, derive_seed, find_divergence, save_figure
from noetherflow.theory.ziyin2024 import two_layer_sgd_solution

DESCRIPTION = (
    "Matrix factorisation: SGD converges to the Thm 5.2 noise equilibrium UᵀΓ_UU = WΓ_WWᵀ, "
    "GD stays an order of magnitude away."
)

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
    full_batch: bool = False,
    loss_scale: float = 1.0,
    track: tuple[np.ndarray, np.ndarray] | None = None,
    chunk: int = 200,
) -> TrainResult:
    """SGD (fresh minibatches of the data model) or population GD on ``‖UWx − y‖²``.

    ``U0`` [R, n, d], ``W0`` [R, d, n] (one init per run, all runs in one batched loop),
    ``sx`` [n] (diag Σ_x, shared), ``se`` [R, n] (diag Σ_ε per run). The per-sample loss is
    ``loss_scale · ‖UWx − y‖²`` (``loss_scale = 1/n`` is the output-averaged loss); the
    minibatch loss is the mean over ``batch_size`` samples. Float64.
    """
    U, W = U0.clone(), W0.clone()
    R, n, _ = U.shape
    gen = torch.Generator().manual_seed(int(seed))
    sx_sqrt, se_sqrt = sx.sqrt(), se.sqrt()[:, None, :]
    eye = torch.eye(n, dtype=U.dtype)
    sxm = torch.diag(sx)
    c = 2.0 * lr * loss_scale / batch_size
    rec_step: list[int] = []
    rel: list[Tensor] = []
    dn: list[Tensor] = []
    loss: list[Tensor] = []
    ent: list[Tensor] = []
    diverged = False

    def record(t: int) -> None:
        delta, wgw = balance(U, W, sx, se)
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
            if full_batch:
                A = U @ W - eye
                asx = A @ sxm
                gU = asx @ W.transpose(-2, -1)
                gW = U.transpose(-2, -1) @ asx
                U, W = U - (2.0 * lr * loss_scale) * gU, W - (2.0 * lr * loss_scale) * gW
            else:
                X = xs[j]
                h = X @ W.transpose(-2, -1)  # [R, S, d]
                res = h @ U.transpose(-2, -1) - X - es[j]  # [R, S, n]
                gU = res.transpose(-2, -1) @ h
                gW = (res @ U).transpose(-2, -1) @ X
                U, W = U - c * gU, W - c * gW
            t += 1
            if t % record_every == 0 or t == steps:
                record(t)
        if not bool(torch.isfinite(U).all() and torch.isfinite(W).all()):
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
    )

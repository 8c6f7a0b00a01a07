"""Shared core of Fig. 6 and Fig. 9: two-layer nonlinear autoencoders under SGD and GD.

The net is ``f(x) = U σ(Wx)`` (``W`` ∈ R^{H×n}, ``U`` ∈ R^{n×H}, no biases) trained on
``ℓ = ‖f(x) − y‖²`` (sum over outputs, mean over the minibatch; the paper's eq. 12 without
weight decay), ``y = x + ε``, ``x ~ N(0, I_n)``, ``ε ~ N(0, diag(σ_ε²))`` (paper §5.4, App.
A.4). Several activations train at once, along a leading run axis, from the *same*
initialisation. SGD draws fresh minibatches from the data model each step (online, so the
residual at the end is the label noise and not a memorised training set). GD should follow
the population gradient, which has no closed form for a nonlinear net; a fixed training
sample is no substitute here (with H = 200 hidden units full-batch GD on 2048 points
memorises it: held-out loss 68 against the noise floor 44). So "GD" is the large-batch
limit: each step uses a fresh batch of ``gd_batch`` samples, whose gradient noise — and
hence the noise-driven drift of the charges, ∝ η²/S — is ``gd_batch / batch_size`` times
weaker than SGD's. That residual drift is *not* negligible over 10⁴ steps (measured on
Fig. 6: GD's relative difference 1.21 after 600 steps, 0.68 after 10⁴ steps with
``gd_batch=256``); a larger ``gd_batch`` is closer to GD and proportionally more costly.

The hidden-space matrices of Thm 5.2 are evaluated at the end:

* ``WΣ̄_xWᵀ`` against ``UᵀΣ̄_εU`` with the population ``Σ_x = I``, ``Σ_ε = diag(σ_ε²)``, each
  normalised by its trace (eq. 14; Fig. 6);
* ``WΓ_WWᵀ`` against ``UᵀΓ_UU`` with ``Γ_W = E[‖r‖²xxᵀ]``, ``Γ_U = E[‖x‖²rrᵀ]``,
  ``r = f(x) − y``, estimated on a fresh evaluation sample (eq. 13; Fig. 9).

Their relative difference is ``‖A − B‖_F / (½(‖A‖_F + ‖B‖_F))`` (symmetric in the two).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "ACTIVATIONS",
    "Hidden",
    "Trained",
    "activation",
    "hidden_matrices",
    "init_weights",
    "lr_schedule",
    "noise_variances",
    "rel_diff",
    "train",
]

_DTYPE = torch.float64
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


def lr_schedule(lr: float, steps: int, *, lr_final: float, decay_frac: float) -> np.ndarray:
    """Constant ``lr``, then a geometric decay to ``lr_final`` over the last ``decay_frac``."""
    lrs = np.full(steps, float(lr))
    n_decay = round(decay_frac * steps)
    if n_decay > 0:
        lrs[steps - n_decay :] = np.geomspace(lr, lr_final, n_decay)
    return lrs


def _forward_grads(
    U: Tensor, W: Tensor, x: Tensor, y: Tensor, acts: Sequence[Act]
) -> tuple[Tensor, Tensor, Tensor]:
    """Minibatch-mean gradients of ``‖Uσ(Wx) − y‖²`` for every run.

    ``U`` [R, n, H], ``W`` [R, H, n], ``x``, ``y`` [S, n] (shared by the runs). Returns
    ``(∇U, ∇W, loss)`` with shapes [R, n, H], [R, H, n], [R].
    """
    h = torch.matmul(x, W.transpose(-2, -1))  # [R, S, H]
    a = torch.empty_like(h)
    da = torch.empty_like(h)
    for i, f in enumerate(acts):
        a[i], da[i] = f(h[i])
    r = torch.matmul(a, U.transpose(-2, -1)) - y  # [R, S, n]
    c = 2.0 / x.shape[0]
    gU = c * torch.matmul(r.transpose(-2, -1), a)
    back = torch.matmul(r, U) * da  # [R, S, H]
    gW = c * torch.matmul(back.transpose(-2, -1), x)
    loss = (r * r).sum(dim=(-2, -1)) / x.shape[0]
    return gU, gW, loss


@dataclass
class Trained:
    """Weights at the end (runs along the first axis) and the recorded losses."""

    U: Tensor  # [R, n, H]
    W: Tensor  # [R, H, n]
    step: np.ndarray  # [T]
    loss: np.ndarray  # [R, T] minibatch loss, averaged over the steps of each record
    monitor: np.ndarray  # [R, T + 1] monitor(U, W) at step 0 and at each record
    diverged: bool


def train(
    U0: Tensor,
    W0: Tensor,
    acts: Sequence[str],
    se: Tensor,
    *,
    lrs: np.ndarray,
    batch_size: int,
    seed: int,
    n_records: int = 100,
    monitor: Callable[[Tensor, Tensor], Tensor] | None = None,
    chunk: int = 250,
) -> Trained:
    """SGD on fresh minibatches of ``batch_size`` (GD: a large ``batch_size``, see above).

    Every activation in ``acts`` trains from the same ``(U0, W0)`` on the same data
    stream. ``lrs`` holds the learning rate of each step; ``monitor(U, W) -> [R]`` is
    recorded with the loss.
    """
    fs = [activation(a) for a in acts]
    R = len(fs)
    U = U0.expand(R, -1, -1).clone()
    W = W0.expand(R, -1, -1).clone()
    n = W.shape[-1]
    steps = len(lrs)
    gen = torch.Generator().manual_seed(int(seed))
    sd = se.sqrt()
    every = max(1, steps // n_records)
    rec_step: list[int] = []
    rec_loss: list[Tensor] = []
    rec_mon: list[Tensor] = []
    if monitor is not None:
        rec_mon.append(monitor(U, W))
    acc = torch.zeros(R, dtype=_DTYPE)
    n_acc = 0
    diverged = False
    t = 0
    while t < steps:
        m = min(chunk, steps - t)
        xs = torch.randn((m, batch_size, n), generator=gen, dtype=_DTYPE)
        ys = xs + torch.randn((m, batch_size, n), generator=gen, dtype=_DTYPE) * sd
        for j in range(m):
            gU, gW, loss = _forward_grads(U, W, xs[j], ys[j], fs)
            eta = float(lrs[t])
            U = U - eta * gU
            W = W - eta * gW
            acc += loss
            n_acc += 1
            t += 1
            if t % every == 0 or t == steps:
                rec_step.append(t)
                rec_loss.append(acc / n_acc)
                if monitor is not None:
                    rec_mon.append(monitor(U, W))
                acc = torch.zeros(R, dtype=_DTYPE)
                n_acc = 0
        if not bool(torch.isfinite(U).all() and torch.isfinite(W).all()):
            diverged = True
            break
    return Trained(
        U=U,
        W=W,
        step=np.asarray(rec_step),
        loss=(torch.stack(rec_loss, dim=1).numpy() if rec_loss else np.zeros((R, 0))),
        monitor=(torch.stack(rec_mon, dim=1).numpy() if rec_mon else np.zeros((R, 0))),
        diverged=diverged,
    )


def rel_diff(a: Tensor, b: Tensor) -> Tensor:
    """``‖a − b‖_F / (½(‖a‖_F + ‖b‖_F))`` over the last two axes."""
    num = torch.linalg.matrix_norm(a - b)
    return num / (0.5 * (torch.linalg.matrix_norm(a) + torch.linalg.matrix_norm(b)))


@dataclass
class Hidden:
    """The hidden-space matrices of Thm 5.2 for each run (shape [R, H, H])."""

    w_sigma: Tensor  # W Σ̄_x Wᵀ
    u_sigma: Tensor  # Uᵀ Σ̄_ε U
    w_gamma: Tensor  # W Γ_W Wᵀ
    u_gamma: Tensor  # Uᵀ Γ_U U
    eval_loss: Tensor  # [R] E‖f(x) − y‖² on the evaluation sample


def hidden_matrices(
    U: Tensor, W: Tensor, acts: Sequence[str], se: Tensor, *, n_eval: int, seed: int
) -> Hidden:
    """Both pairs of hidden matrices at ``(U, W)``; Γ's on ``n_eval`` fresh samples."""
    n = W.shape[-1]
    gen = torch.Generator().manual_seed(int(seed))
    x = torch.randn((n_eval, n), generator=gen, dtype=_DTYPE)
    y = x + torch.randn((n_eval, n), generator=gen, dtype=_DTYPE) * se.sqrt()
    sx_bar = torch.eye(n, dtype=_DTYPE) / n
    se_bar = torch.diag(se / se.sum())
    w_sigma = W @ sx_bar @ W.transpose(-2, -1)
    u_sigma = U.transpose(-2, -1) @ se_bar @ U
    h = torch.matmul(x, W.transpose(-2, -1))
    a = torch.stack([activation(name)(h[i])[0] for i, name in enumerate(acts)])
    r = torch.matmul(a, U.transpose(-2, -1)) - y  # [R, N, n]
    r2 = (r * r).sum(-1, keepdim=True)  # [R, N, 1]
    x2 = (x * x).sum(-1, keepdim=True)  # [N, 1]
    gamma_w = torch.matmul((x * r2).transpose(-2, -1), x) / n_eval  # E[‖r‖² x xᵀ]
    gamma_u = torch.matmul((r * x2).transpose(-2, -1), r) / n_eval  # E[‖x‖² r rᵀ]
    return Hidden(
        w_sigma=w_sigma,
        u_sigma=u_sigma,
        w_gamma=W @ gamma_w @ W.transpose(-2, -1),
        u_gamma=U.transpose(-2, -1) @ gamma_u @ U,
        eval_loss=r2.mean(dim=(-2, -1)),
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
    gd_batch: int = 256
    gd_lr: float = 0.02
    gd_steps: int = 10000
    n_eval: int = 20000
    n_show: int = 40
    n_records: int = 100


def run_nonlinear(cfg: NonlinearConfig, seed: int, tag: str) -> dict[str, Any]:
    """SGD and GD from one init for every activation; the hidden matrices at the end."""
    from noetherflow.experiments._base import derive_seed, find_divergence

    acts = list(cfg.activations)
    se = noise_variances(cfg.dim, cfg.noise_first)
    U0, W0 = init_weights(cfg.dim, cfg.hidden, scale=cfg.init_scale,
                          seed=derive_seed(seed, tag, "init"))  # fmt: skip
    sx_bar = torch.eye(cfg.dim, dtype=_DTYPE) / cfg.dim
    se_bar = torch.diag(se / se.sum())

    def sigma_gap(U: Tensor, W: Tensor) -> Tensor:
        return rel_diff(W @ sx_bar @ W.transpose(-2, -1), U.transpose(-2, -1) @ se_bar @ U)

    out: dict[str, Any] = {"series": {}}
    k = cfg.n_show
    for mode in ("sgd", "gd"):
        if mode == "sgd":
            lrs = lr_schedule(cfg.lr, cfg.steps, lr_final=cfg.lr_final, decay_frac=cfg.decay_frac)
            batch = cfg.batch_size
        else:
            lrs = np.full(cfg.gd_steps, float(cfg.gd_lr))
            batch = cfg.gd_batch
        tr = train(
            U0, W0, acts, se, lrs=lrs, batch_size=batch, seed=derive_seed(seed, tag, mode),
            n_records=cfg.n_records, monitor=sigma_gap,
        )  # fmt: skip
        hm = hidden_matrices(tr.U, tr.W, acts, se, n_eval=cfg.n_eval,
                             seed=derive_seed(seed, tag, "eval"))  # fmt: skip
        rd_sigma = rel_diff(hm.w_sigma, hm.u_sigma).numpy()
        rd_gamma = rel_diff(hm.w_gamma, hm.u_gamma).numpy()
        div = tr.diverged or any(find_divergence(row).diverged for row in tr.loss)
        for i, act in enumerate(acts):
            out["series"][f"{mode}_{act}"] = {
                "rel_diff_sigma": float(rd_sigma[i]),
                "rel_diff_gamma": float(rd_gamma[i]),
                "eval_loss": float(hm.eval_loss[i]),
                "norm_sq_W": float((tr.W[i] ** 2).sum()),
                "norm_sq_U": float((tr.U[i] ** 2).sum()),
                "step": tr.step,
                "loss": tr.loss[i],
                "rel_diff_sigma_over_time": tr.monitor[i],
                "w_sigma_block": hm.w_sigma[i, :k, :k].numpy(),
                "u_sigma_block": hm.u_sigma[i, :k, :k].numpy(),
                "w_gamma_block": hm.w_gamma[i, :k, :k].numpy(),
                "u_gamma_block": hm.u_gamma[i, :k, :k].numpy(),
                "diverged": bool(div),
            }
    out["noise_floor"] = float(se.sum())
    out["n_show"] = k
    return out


def heatmaps(
    results: dict[str, Any], acts: Sequence[str], kind: str, modes: Sequence[str], path: Any
) -> Any:
    """Heat maps ``W·Wᵀ`` | ``Uᵀ·U`` (``kind`` = "sigma" or "gamma"), a row per (act, mode)."""
    from matplotlib.figure import Figure

    from noetherflow.experiments._base import save_figure

    rows = [(a, m) for a in acts for m in modes]
    fig = Figure(figsize=(8.4, 3.8 * len(rows)))
    axes = np.asarray(fig.subplots(len(rows), 2)).reshape(len(rows), 2)
    sym = "Σ̄" if kind == "sigma" else "Γ"
    for (act, mode), (ax_w, ax_u) in zip(rows, axes, strict=True):
        s = results["series"][f"{mode}_{act}"]
        a = np.asarray(s[f"w_{kind}_block"])
        b = np.asarray(s[f"u_{kind}_block"])
        vmax = float(max(np.abs(a).max(), np.abs(b).max()))
        for ax, m, lab in ((ax_w, a, f"W{sym}_xWᵀ"), (ax_u, b, f"Uᵀ{sym}_εU")):
            if kind == "gamma":
                lab = lab.replace("_x", "_W").replace("_ε", "_U")
            im = ax.imshow(m, cmap="RdBu_r", vmin=-vmax, vmax=vmax)
            ax.set_title(f"{act}, {mode.upper()}: {lab}", fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
        fig.colorbar(im, ax=[ax_w, ax_u], shrink=0.8)
        rd = s[f"rel_diff_{kind}"]
        ax_w.set_ylabel(f"rel. diff {rd:.3f}", fontsize=9)
    fig.suptitle(f"hidden-space matrices (first {results['n_show']} of the hidden units)")
    return save_figure(fig, path)

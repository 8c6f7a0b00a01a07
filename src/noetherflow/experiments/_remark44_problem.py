"""Remark 4.4's problem (a two-layer linear net with its data), its minibatch gradients and
charges, and GD and gradient flow on it with every step checked by the library's monitor.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import Tensor, nn

import noetherflow as nf
from noetherflow.experiments._base import derive_seed
from noetherflow.train import run_gd

if TYPE_CHECKING:
    from noetherflow.experiments.remark44 import Config

_DT = torch.float64


def make_problem(cfg: Config, seed: int) -> dict[str, Tensor]:
    """Data ``X`` [n, d_x], ``Y`` [n, d_y] and the shared init ``W0`` [d, d_x], ``U0`` [d_y, d]."""
    g = torch.Generator().manual_seed(derive_seed(seed, "remark44", "problem"))
    X = torch.randn(cfg.n_samples, cfg.d_x, generator=g, dtype=_DT)
    V = torch.randn(cfg.d_y, cfg.d_x, generator=g, dtype=_DT) / math.sqrt(cfg.d_x)
    Y = X @ V.T + cfg.noise_std * torch.randn(cfg.n_samples, cfg.d_y, generator=g, dtype=_DT)
    W0 = torch.randn(cfg.d, cfg.d_x, generator=g, dtype=_DT) / math.sqrt(cfg.d_x)
    U0 = torch.randn(cfg.d_y, cfg.d, generator=g, dtype=_DT) / math.sqrt(cfg.d)
    return {"X": X, "Y": Y, "W0": W0, "U0": U0}


def loss_fn(out: Tensor, target: Tensor) -> Tensor:
    """Batch mean of ``‖f(x) − y‖²`` (sum over outputs)."""
    return ((out - target) ** 2).sum(dim=-1).mean()


def make_model(U: Tensor, W: Tensor) -> tuple[nn.Sequential, nf.SymmetrySet]:
    """``nn.Sequential(Linear(d_x, d), Linear(d, d_y))`` holding ``(W, U)``, and its symmetries."""
    first = nn.Linear(W.shape[1], W.shape[0], bias=False).to(_DT)
    second = nn.Linear(U.shape[1], U.shape[0], bias=False).to(_DT)
    with torch.no_grad():
        first.weight.copy_(W)
        second.weight.copy_(U)
    syms = nf.SymmetrySet(
        [
            nf.Rescaling(first, second, label="rescaling"),
            nf.DoubleRotation(first, second, label="rotation"),
        ]
    )
    return nn.Sequential(first, second), syms


def weights(model: nn.Sequential) -> tuple[nn.Parameter, nn.Parameter]:
    """``(W, U)``: the parameters of the two layers of :func:`make_model`'s model."""
    first, second = model[0], model[1]
    assert isinstance(first, nn.Linear) and isinstance(second, nn.Linear)
    return cast(nn.Parameter, first.weight), cast(nn.Parameter, second.weight)


def batch_grads(
    U: Tensor, W: Tensor, x: Tensor, y: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Mean-loss gradients over a batch, batched over runs.

    ``U`` [R, d_y, d], ``W`` [R, d, d_x], ``x`` [R, S, d_x] (or [S, d_x]), ``y`` likewise.
    Per sample ``∇_U = 2 r hᵀ``, ``∇_W = 2 Uᵀ r xᵀ`` with ``h = Wx``, ``r = Uh − y``.
    Returns ``(g_U, g_W, r, h)`` with ``r`` [R, S, d_y], ``h`` [R, S, d].
    """
    h = x @ W.transpose(-2, -1)
    r = h @ U.transpose(-2, -1) - y
    s = x.shape[-2]
    g_u = (2.0 / s) * r.transpose(-2, -1) @ h
    g_w = (2.0 / s) * U.transpose(-2, -1) @ r.transpose(-2, -1) @ x
    return g_u, g_w, r, h


def charge_matrix(U: Tensor, W: Tensor) -> Tensor:
    """``C = UᵀU − WWᵀ`` (batched)."""
    return U.transpose(-2, -1) @ U - W @ W.transpose(-2, -1)


def run_gd_checked(cfg: Config, prob: dict[str, Tensor], steps: int) -> dict[str, Any]:
    """Full-batch GD (γ = 0) through :func:`noetherflow.train.run_gd`; at each of the first
    ``cfg.gd_check_steps`` steps ``nf.charges`` after the step against ``nf.exact_step_charges``
    before it, relative to ``‖θ‖² = ‖U‖² + ‖W‖²`` (≥ |θᵀAθ|) and, where the change exceeds
    ``1e-6 ‖θ‖²``, to the change itself."""
    model, syms = make_model(prob["U0"], prob["W0"])
    Wp, Up = weights(model)
    X, Y = prob["X"], prob["Y"]
    c0 = nf.charges(syms)
    rec_steps, trace, resc0 = [0], [float(torch.trace(c0["rotation"]))], [float(c0["rescaling"][0])]
    acc = {"max_resid": 0.0, "max_change_rel": 0.0}
    pending: dict[str, Any] = {}

    def check(step: int, m: nn.Module) -> None:
        with torch.no_grad():
            if pending:  # compare the state after the previous step with its prediction
                after = nf.charges(syms)
                scale = float(Up.square().sum() + Wp.square().sum())
                for name in syms.names:
                    err = float((after[name] - pending["pred"][name]).abs().max())
                    resid = err / scale if math.isfinite(err) else math.inf
                    acc["max_resid"] = max(acc["max_resid"], resid)
                    change = float((pending["pred"][name] - pending["before"][name]).abs().max())
                    if change > 1e-6 * scale:
                        acc["max_change_rel"] = max(acc["max_change_rel"], err / change)
                pending.clear()
            if step < min(cfg.gd_check_steps, steps):
                g_u, g_w, _, _ = batch_grads(Up, Wp, X, Y)
                pred = nf.exact_step_charges(syms, {Wp: g_w, Up: g_u}, lr=cfg.lr)
                pending.update(pred=pred, before=nf.charges(syms))

    def record(step: int, m: nn.Module) -> None:
        if step > 0 and (step % cfg.record_every == 0 or step == steps):
            with torch.no_grad():
                C = charge_matrix(Up, Wp)
            rec_steps.append(step)
            trace.append(float(torch.trace(C)))
            resc0.append(float(-C[0, 0]))

    def first(step: int, m: nn.Module) -> None:
        check(step, m)
        record(step, m)

    # step by step up to a multiple of record_every past the checks, then every record_every
    n1 = min(steps, -(-min(cfg.gd_check_steps, steps) // cfg.record_every) * cfg.record_every)
    run_gd(model, loss_fn, X, Y, lr=cfg.lr, steps=n1, callback=first, log_every=1)
    check(n1, model)
    if steps > n1:
        run_gd(
            model,
            loss_fn,
            X,
            Y,
            lr=cfg.lr,
            steps=steps - n1,
            log_every=cfg.record_every,
            callback=lambda k, m: record(n1 + k, m) if k > 0 else None,
        )
    final = nf.charges(syms)
    with torch.no_grad():
        loss = float(loss_fn(model(X), Y))
    return {
        "step": np.asarray(rec_steps),
        "trace": np.asarray(trace),
        "rescaling0": np.asarray(resc0),
        "max_rel_residual": acc["max_resid"],
        "max_residual_over_change": acc["max_change_rel"],
        "rel_change_of_charges": float(
            (final["rotation"] - c0["rotation"]).norm() / c0["rotation"].norm()
        ),
        "final_loss": loss,
    }


def run_gf_checked(cfg: Config, prob: dict[str, Tensor]) -> dict[str, Any]:
    """Gradient flow (γ = 0) by DOP853 over ``t = η·n_steps``; charges on a grid."""
    from scipy.integrate import solve_ivp

    X, Y = prob["X"].numpy(), prob["Y"].numpy()
    U0, W0 = prob["U0"].numpy(), prob["W0"].numpy()
    n_u = U0.size
    n = X.shape[0]

    def rhs(_t: float, theta: np.ndarray) -> np.ndarray:
        U = theta[:n_u].reshape(U0.shape)
        W = theta[n_u:].reshape(W0.shape)
        h = X @ W.T
        r = h @ U.T - Y
        g_u = (2.0 / n) * r.T @ h
        g_w = (2.0 / n) * U.T @ r.T @ X
        return -np.concatenate([g_u.ravel(), g_w.ravel()])

    t_end = cfg.lr * cfg.n_steps
    t_eval = np.linspace(0.0, t_end, cfg.gf_points + 1)
    sol = solve_ivp(
        rhs,
        (0.0, t_end),
        np.concatenate([U0.ravel(), W0.ravel()]),
        method="DOP853",
        t_eval=t_eval,
        rtol=cfg.gf_rtol,
        atol=cfg.gf_atol,
    )
    if not sol.success:
        raise RuntimeError(f"gradient flow integration failed: {sol.message}")
    model, syms = make_model(prob["U0"], prob["W0"])
    Wp, Up = weights(model)
    c0 = nf.charges(syms)
    scale = float(Up.detach().square().sum() + Wp.detach().square().sum())
    max_rel = 0.0
    trace, resc0 = [], []
    for j in range(sol.y.shape[1]):
        th = torch.as_tensor(sol.y[:, j])
        vals = {Up: th[:n_u].reshape(U0.shape), Wp: th[n_u:].reshape(W0.shape)}
        c = {name: s.charge_of(vals) for name, s in syms.items()}
        for name in syms.names:
            max_rel = max(max_rel, float((c[name] - c0[name]).abs().max()) / scale)
        trace.append(float(torch.trace(c["rotation"])))
        resc0.append(float(c["rescaling"][0]))
    U_end = torch.as_tensor(sol.y[:n_u, -1]).reshape(U0.shape)
    W_end = torch.as_tensor(sol.y[n_u:, -1]).reshape(W0.shape)
    return {
        "time": t_eval,
        "trace": np.asarray(trace),
        "rescaling0": np.asarray(resc0),
        "max_rel_change": max_rel,
        "n_fev": int(sol.nfev),
        "final_loss": float(loss_fn(prob["X"] @ W_end.T @ U_end.T, prob["Y"])),
    }

"""Thm 5.4: the noise-equilibrium solution of deep linear nets, by SGD and by the chain solver.

A deep linear net ``f(x) = W_D⋯W_1x`` learns realisable data ``y = Vx + ε`` with anisotropic
``Σ_x``, ``Σ_ε`` (per-sample loss ``‖f(x) − y‖²``, paper eq. 16). At the global minimum the
noise equilibrium of the double-rotation charges of every adjacent pair is (Thm 5.4, in the
corrected form of :func:`~noetherflow.theory.ziyin2024.deep_linear_sgd_solution`)

    ``W_i = c U_iU_{i−1}ᵀ`` for ``1 < i < D``,  ``c = (Tr S′ / sqrt(Tr Σ_x Tr Σ_ε))^{1/D}``,

with ``V′ = Σ_ε^{1/2}VΣ_x^{1/2} = LS′R`` (rank ``k``): every intermediate layer is ``c`` times
a semi-orthogonal map of the learned ``k``-dimensional subspace, ``‖W_i‖_F² = k c²``. The
paper's eq. (19), ``(Tr S′)^{2/D} k^{1−2/D}``, is the special case ``Tr Σ_x = Tr Σ_ε = k``;
the data here have ``Tr Σ_x ≠ Tr Σ_ε ≠ k`` so that the two differ, and both are recorded.

Two independent checks:

1. SGD (fresh minibatches of the data model, several random inits, depths ``D = 3, 4``)
   trained to convergence: measured ``‖W_i‖_F²`` and singular values of every layer.
2. The chain solver of the core engine (:func:`noetherflow.solve_equilibrium`, block sweeps
   of pairwise geometric means) started from a random point of the orbit of a global
   minimum; its result must be Thm 5.4's closed form (compared through orbit invariants).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from noetherflow._divergence import all_finite, find_divergence
from noetherflow.experiments._base import Claim, Kind, Op, derive_seed
from noetherflow.experiments._claims import over_seeds
from noetherflow.experiments._deep_linear import library_chain_flow_check
from noetherflow.experiments._thm54_solver import chain_solver_check
from noetherflow.theory.ziyin2024 import (
    deep_linear_intermediate_norm_sq,
    deep_linear_sgd_solution,
    paper_eq19_norm_sq,
)
from noetherflow.train import GeometricDecay, lr_sequence

DESCRIPTION = (
    "Deep linear nets (Thm 5.4): SGD's intermediate layers are balanced, scaled-orthogonal; the "
    "chain solver reaches the closed form."
)

PAPER = (
    "Thm 5.4 (§5.3, eqs. 17–19): at the global minimum of a deep linear net the noise "
    "equilibrium makes every intermediate layer a rescaled orthogonal map of the learned "
    "subspace with balanced norms Tr[Σ_i²] = (Tr S′)^{2/D} d^{1−2/D}, equal to the first "
    "layer's Tr[Σ_1²] (eq. 19)."
)
PAPER_ORDER = 5.4

_DTYPE = torch.float64


@dataclass(frozen=True)
class Config:
    """Settings of the Thm 5.4 experiment (the paper gives no synthetic setting; all ours).

    Choices and why:

    - Loss ``‖W_D⋯W_1x − y‖²`` (sum over outputs, paper eq. 16), minibatch mean, no weight
      decay. ``d_x=6``, ``d_y=5``, ``V`` of rank ``k=3`` with singular values
      ``v_singular`` between random orthonormal bases: rank-deficient, so the learned
      subspace is a proper subspace of input and output.
    - ``Σ_x`` has eigenvalues ``sx_eigs`` (trace 9), ``Σ_ε`` eigenvalues ``se_eigs``
      (trace 2), each in a random orthonormal basis: anisotropic and not diagonal.
      ``sqrt(Tr Σ_x Tr Σ_ε) = 4.24 ≠ k = 3``, so the printed eq. (19) and the general
      prediction differ (by 26% for D = 3) and the experiment can tell which one holds.
    - Hidden width ``= k`` (Thm 5.4's ``d = rank V′``). With a wider hidden layer the parts
      of the layers outside the learned subspace get almost no gradient once the product
      has converged and keep init-dependent values (measured: +13% on ‖W_2‖² at width 5),
      which no statement of the theorem covers; the chain solver would also report them as
      directions at infinity.
    - ``n_runs=4`` random inits per depth (fan-in normal, ``init_scale=0.7``), trained as a
      batch. ``batch_size=16``, ``lr=0.05`` (stable for D = 3, 4 here) for the first
      ``1 − decay_frac`` of the steps, then a geometric decay to ``lr/20``: at constant η the
      equilibrium carries an O(η/S) bias (measured +10–14% on the intermediate norms at
      η = 0.05); the slow decay lets SGD follow the equilibrium towards the small-η one of
      the theorem. ``steps=80000`` (the norms still drift by ~1% per 10⁴ steps at the end).
    - The paper's protocol (constant η, no decay) runs as well, from other inits, at
      ``lr`` for ``steps``; its norms are time averages over the records after a burn-in of
      ``burn_in_frac=0.5`` of the steps.
    - The printed eq. 19 is claimed (and expected to fail) at ``printed_depth=3``, where it
      separates most from the general form (26%; 19% at D = 4, and the gap shrinks with D).
    - Prediction: the population ``V, Σ_x, Σ_ε`` (SGD samples the population). The
      prediction at each run's learned product is recorded too.
    - Chain solver: a depth-``D`` chain of ``nn.Linear(bias=False)`` at the Thm 5.4 solution,
      moved by random ``G_i`` (i.i.d. N(0, 1) entries) between adjacent layers (product
      unchanged to 1e-15). Its data: a product design ``{(x_a, ε_b)}`` of ``n_design²``
      samples whose ``x_a`` (resp. ``ε_b``) have *exactly* the second moment ``Σ_x`` (resp.
      ``Σ_ε``) and ``ε_b`` zero mean, ``y = Vx_a + ε_b``: every moment the equilibrium
      depends on then factorises exactly as under independence
      (``E[‖x‖²εεᵀ] = Tr Σ_x Σ_ε`` …), the residuals are exactly the noise and the chain sits
      at the batch's global minimum, so the batch's equilibrium *is* the population's and
      the closed form applies to 1e-15. Statistics with ``estimator="reference"``;
      ``solve_equilibrium(time="continuous", weight_decay=0)``. Compared through the orbit
      invariants ``(W_i⋯W_1)ᵀ(W_i⋯W_1)`` (``i < D``; invariant to the remaining orthogonal
      freedom ``W_i → O_iW_iO_{i−1}ᵀ``) and ``‖W_i‖_F²``.
    """

    d_x: int = 6
    d_y: int = 5
    v_singular: tuple[float, ...] = (1.5, 1.0, 0.6)
    sx_eigs: tuple[float, ...] = (0.6, 0.96, 1.32, 1.68, 2.04, 2.4)
    se_eigs: tuple[float, ...] = (0.08, 0.24, 0.4, 0.56, 0.72)
    depths: tuple[int, ...] = (3, 4)
    n_runs: int = 4
    init_scale: float = 0.7
    lr: float = 0.05
    lr_final: float = 0.0025
    decay_frac: float = 0.9
    batch_size: int = 16
    steps: int = 80000
    n_records: int = 200
    n_design: int = 12
    solver_tol: float = 1e-12
    burn_in_frac: float = 0.5
    printed_depth: int = 3
    n_eval: int = 4000

    @classmethod
    def quick(cls) -> Config:
        """Same problem, 12k SGD steps and 3 runs (norms within ~5–8% instead of ~2–4%).

        (Two runs until the issue asked for ≥ 3 seeds per claim.)
        """
        return cls(steps=12000, n_runs=3, n_records=60)

    @property
    def rank(self) -> int:
        return len(self.v_singular)


def setup(cfg: Config) -> list[dict[str, str]]:
    """Deviations from the paper's setting (Thm 5.4 has no synthetic experiment)."""
    full = Config()
    rows = [
        {
            "quantity": "data",
            "paper": "none (Fig. 5 is MNIST)",
            "ours": f"y = Vx + ε, d_x = {cfg.d_x}, d_y = {cfg.d_y}, rank V = {cfg.rank}; "
            f"Tr Σ_x = {sum(cfg.sx_eigs):g}, Tr Σ_ε = {sum(cfg.se_eigs):g}",
            "why": "realisable, anisotropic, Tr Σ_x ≠ Tr Σ_ε ≠ k so eq. 19 and the general form "
            "differ",
        },
        {
            "quantity": "depth, width",
            "paper": "any D; d = rank V′",
            "ours": f"D ∈ {list(cfg.depths)}, hidden width k = {cfg.rank}",
            "why": "wider layers keep init-dependent parts the theorem does not cover",
        },
        {
            "quantity": "η",
            "paper": "not stated (constant)",
            "ours": f"{cfg.lr:g} constant (paper's protocol claim); annealed run: geometric decay "
            f"to {cfg.lr_final:g} over the last {cfg.decay_frac:.0%}",
            "why": "the theorem is a small-η statement; constant η biases norms by O(η/S)",
        },
        {
            "quantity": "S",
            "paper": "not stated",
            "ours": f"{cfg.batch_size}, fresh samples",
            "why": "online SGD on the data model",
        },
        {
            "quantity": "steps",
            "paper": "not stated",
            "ours": f"{cfg.steps}",
            "why": "the norms settle (drift ~1% per 10⁴ steps at the end, full)",
        },
        {
            "quantity": "loss",
            "paper": "‖W_D⋯W_1x − y‖² (eq. 16)",
            "ours": "the same, minibatch mean, no weight decay",
            "why": "-",
        },
        {
            "quantity": "seeds",
            "paper": "-",
            "ours": (
                f"{cfg.n_runs} inits per depth (annealed) and {cfg.n_runs} others "
                "(constant η), each with its own minibatches"
            ),
            "why": "claims take the max over inits; per-init values, mean and spread in the notes",
        },
    ]
    if cfg != full:
        rows.append(
            {
                "quantity": "quick mode",
                "paper": "-",
                "ours": f"{cfg.steps} steps, {cfg.n_runs} inits (full: {full.steps}, "
                f"{full.n_runs})",
                "why": "norms within ~5–8% instead of ~2–4%",
            }
        )
    return rows


def _orthogonal(n: int, gen: torch.Generator) -> Tensor:
    q, r = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=_DTYPE))
    return q * torch.sign(torch.diagonal(r))


def problem(cfg: Config, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(V, Σ_x, Σ_ε)`` of shapes ``[d_y, d_x]``, ``[d_x, d_x]``, ``[d_y, d_y]``."""
    if len(cfg.sx_eigs) != cfg.d_x or len(cfg.se_eigs) != cfg.d_y:
        raise ValueError(
            f"sx_eigs has {len(cfg.sx_eigs)} and se_eigs {len(cfg.se_eigs)} entries; expected "
            f"d_x={cfg.d_x} and d_y={cfg.d_y}."
        )
    gen = torch.Generator().manual_seed(derive_seed(seed, "thm54", "problem"))
    qx, qe = _orthogonal(cfg.d_x, gen), _orthogonal(cfg.d_y, gen)
    sx = qx @ torch.diag(torch.tensor(cfg.sx_eigs, dtype=_DTYPE)) @ qx.T
    se = qe @ torch.diag(torch.tensor(cfg.se_eigs, dtype=_DTYPE)) @ qe.T
    k = cfg.rank
    left, right = _orthogonal(cfg.d_y, gen)[:, :k], _orthogonal(cfg.d_x, gen)[:, :k]
    V = left @ torch.diag(torch.tensor(cfg.v_singular, dtype=_DTYPE)) @ right.T
    return V, 0.5 * (sx + sx.T), 0.5 * (se + se.T)


def _sqrtm(m: Tensor) -> Tensor:
    ev, evec = torch.linalg.eigh(m)
    return (evec * ev.clamp_min(0).sqrt()) @ evec.T


def trace_s_prime(V: Tensor, sx: Tensor, se: Tensor) -> float:
    """``Tr S′``: the nuclear norm of ``Σ_ε^{1/2}VΣ_x^{1/2}``."""
    return float(torch.linalg.svdvals(_sqrtm(se) @ V @ _sqrtm(sx)).sum())


# --------------------------------------------------------------------------------------
# SGD
# --------------------------------------------------------------------------------------


def train_deep_linear(
    cfg: Config,
    V: Tensor,
    sx: Tensor,
    se: Tensor,
    depth: int,
    seed: int,
    *,
    constant: bool = False,
) -> dict[str, Any]:
    """SGD on ``‖W_D⋯W_1x − y‖²`` for ``cfg.n_runs`` inits at once (float64).

    The learning rate is ``cfg.lr`` throughout if ``constant``, else constant and then a
    geometric decay to ``cfg.lr_final`` over the last ``cfg.decay_frac`` of the steps.
    Records ``‖W_i‖_F²`` and ``‖W_1Σ_x^{1/2}‖_F²`` every ``steps // n_records`` steps.
    """
    R, S, k = cfg.n_runs, cfg.batch_size, cfg.rank
    dims = [cfg.d_x] + [k] * (depth - 1) + [cfg.d_y]
    gen = torch.Generator().manual_seed(seed)
    Ws = [
        torch.randn(R, dims[i + 1], dims[i], generator=gen, dtype=_DTYPE)
        * (cfg.init_scale / math.sqrt(dims[i]))
        for i in range(depth)
    ]
    lx, le = torch.linalg.cholesky(sx), torch.linalg.cholesky(se)
    sched = (
        None
        if constant
        else GeometricDecay(cfg.steps, decay_frac=cfg.decay_frac, final_lr=cfg.lr_final)
    )
    lrs = lr_sequence(sched, cfg.lr, cfg.steps)
    every = max(1, cfg.steps // cfg.n_records)
    sx_half = _sqrtm(sx)

    def norms(ws: list[Tensor]) -> Tensor:
        first = ws[0] @ sx_half
        cols = [(w * w).sum(dim=(-2, -1)) for w in ws] + [(first * first).sum(dim=(-2, -1))]
        return torch.stack(cols, dim=1)  # [R, D + 1]: ‖W_i‖², then ‖W_1Σ_x^{1/2}‖²

    rec_step: list[int] = [0]
    rec_norms: list[Tensor] = [norms(Ws)]
    rec_loss: list[float] = []
    acc, n_acc, t, chunk = 0.0, 0, 0, 500
    diverged = False
    while t < cfg.steps:
        m = min(chunk, cfg.steps - t)
        xs = torch.randn((m, R, S, cfg.d_x), generator=gen, dtype=_DTYPE) @ lx.T
        ys = xs @ V.T + torch.randn((m, R, S, cfg.d_y), generator=gen, dtype=_DTYPE) @ le.T
        for j in range(m):
            hs = [xs[j]]
            for w in Ws:
                hs.append(hs[-1] @ w.transpose(-2, -1))
            r = hs[-1] - ys[j]
            acc += float((r * r).sum()) / (R * S)
            n_acc += 1
            g = (2.0 / S) * r
            grads: list[Tensor] = []
            for i in range(depth - 1, -1, -1):
                grads.append(g.transpose(-2, -1) @ hs[i])
                if i > 0:
                    g = g @ Ws[i]
            eta = float(lrs[t])
            Ws = [w - eta * gw for w, gw in zip(Ws, reversed(grads), strict=True)]
            t += 1
            if t % every == 0 or t == cfg.steps:
                rec_step.append(t)
                rec_norms.append(norms(Ws))
                rec_loss.append(acc / n_acc)
                acc, n_acc = 0.0, 0
        if not bool(all_finite(Ws)):
            diverged = True
            break
    prod = Ws[0]
    for w in Ws[1:]:
        prod = w @ prod
    return {
        "weights": Ws,
        "product": prod,
        "step": np.asarray(rec_step),
        "norms": torch.stack(rec_norms, dim=1).numpy(),  # [R, T, D + 1]
        "loss": np.asarray(rec_loss),
        "diverged": diverged or find_divergence(rec_loss).diverged,
    }


def _depth_result(
    cfg: Config, V: Tensor, sx: Tensor, se: Tensor, depth: int, seed: int
) -> dict[str, Any]:
    tr = train_deep_linear(cfg, V, sx, se, depth, derive_seed(seed, "thm54", "sgd", depth))
    const = train_deep_linear(
        cfg, V, sx, se, depth, derive_seed(seed, "thm54", "constant", depth), constant=True
    )
    window = const["step"] >= cfg.burn_in_frac * cfg.steps
    const_avg = const["norms"][:, window, :].mean(axis=1)  # [R, D + 1]
    Ws: list[Tensor] = tr["weights"]
    k = cfg.rank
    sol = deep_linear_sgd_solution(V, sx, se, hidden_dims=[k] * (depth - 1))
    pred = deep_linear_intermediate_norm_sq(V, sx, se, depth=depth)
    eq19 = paper_eq19_norm_sq(trace_s_prime(V, sx, se), sol.rank, depth)
    measured = np.stack([(w * w).sum(dim=(-2, -1)).numpy() for w in Ws], axis=1)  # [R, D]
    inter = measured[:, 1:-1]
    svals = [torch.linalg.svdvals(w)[:, :k].numpy() for w in Ws[1:-1]]  # each [R, k]
    spread = np.stack([s[:, 0] / s[:, -1] - 1.0 for s in svals], axis=1)  # [R, D−2]
    pred_learned = [
        deep_linear_intermediate_norm_sq(tr["product"][r], sx, se, depth=depth)
        for r in range(cfg.n_runs)
    ]
    prod_err = (torch.linalg.matrix_norm(tr["product"] - V) / torch.linalg.matrix_norm(V)).numpy()
    first = (Ws[0] @ _sqrtm(sx)).square().sum(dim=(-2, -1)).numpy()  # ‖W_1Σ_x^{1/2}‖², [R]
    return {
        "measured_first_scaled_sq_norm": first,
        "predicted_first_scaled_sq_norm": sol.scaled_first_norm_sq,
        "first_rel_dev": np.abs(first / sol.scaled_first_norm_sq - 1.0),
        "first_rel_dev_eq19": np.abs(first / eq19 - 1.0),
        "constant_time_avg_sq_norms": const_avg[:, :depth],
        "constant_intermediate_rel_dev": np.abs(const_avg[:, 1 : depth - 1] / pred - 1.0),
        "constant_first_rel_dev": np.abs(const_avg[:, depth] / sol.scaled_first_norm_sq - 1.0),
        "constant_diverged": bool(const["diverged"]),
        "measured_sq_norms": measured,
        "predicted_sq_norm": pred,
        "paper_eq19_sq_norm": eq19,
        "predicted_sq_norms_all_layers": np.asarray(sol.norms_sq),
        "predicted_sq_norm_at_learned_product": np.asarray(pred_learned),
        "intermediate_rel_dev": np.abs(inter / pred - 1.0),
        "intermediate_rel_dev_eq19": np.abs(inter / eq19 - 1.0),
        "intermediate_singular_values": np.stack(svals, axis=1),  # [R, D−2, k]
        "singular_value_spread": spread,
        "product_rel_err": prod_err,
        "step": tr["step"],
        "norms_over_time": tr["norms"],
        "loss": tr["loss"],
        "noise_floor": float(torch.trace(se)),
        "diverged": bool(tr["diverged"]),
        "library": library_chain_flow_check(
            [w[0] for w in Ws],
            V,
            sx,
            se,
            lr=cfg.lr,
            batch_size=cfg.batch_size,
            n_eval=cfg.n_eval,
            seed=derive_seed(seed, "thm54", "eval", depth),
        ),
    }


# --------------------------------------------------------------------------------------
# chain solver
# --------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------
# the experiment
# --------------------------------------------------------------------------------------


PER_RUN_KEYS = (
    "intermediate_rel_dev",
    "intermediate_rel_dev_eq19",
    "first_rel_dev",
    "first_rel_dev_eq19",
    "constant_intermediate_rel_dev",
    "constant_first_rel_dev",
    "singular_value_spread",
)
"""Per-run deviations whose max over runs is a claim's value (the note shows every run)."""


def _per_run(series: dict[str, Any], cfg: Config, key: str) -> list[float]:
    """Max over depths (and layers) of ``series[D][key]`` for every run; ``key == '*_eq19'``
    intermediate deviations only at ``cfg.printed_depth`` (as the printed-eq.-19 claim)."""
    depths = [cfg.printed_depth] if key == "intermediate_rel_dev_eq19" else list(cfg.depths)
    arrs = [
        np.asarray(series[f"D{d}"][key], dtype=float).reshape(cfg.n_runs, -1)
        for d in depths
        if f"D{d}" in series
    ]
    if not arrs:
        return [math.nan] * cfg.n_runs
    return np.concatenate(arrs, axis=1).max(axis=1).tolist()


def run(cfg: Config, seed: int, out_dir: Path) -> dict[str, Any]:
    """SGD per depth, then the chain solver per depth."""
    V, sx, se = problem(cfg, seed)
    series: dict[str, Any] = {}
    for depth in cfg.depths:
        series[f"D{depth}"] = _depth_result(cfg, V, sx, se, depth, seed)
    chains = [chain_solver_check(cfg, V, sx, se, depth, seed) for depth in cfg.depths]
    dev = max(float(np.max(series[f"D{d}"]["intermediate_rel_dev"])) for d in cfg.depths)
    dev19 = max(float(np.max(series[f"D{d}"]["intermediate_rel_dev_eq19"])) for d in cfg.depths)
    spread = max(float(np.max(series[f"D{d}"]["singular_value_spread"])) for d in cfg.depths)
    return {
        "series": series,
        "chain_solver": chains,
        "trace_sigma_x": float(torch.trace(sx)),
        "trace_sigma_eps": float(torch.trace(se)),
        "trace_s_prime": trace_s_prime(V, sx, se),
        "rank": cfg.rank,
        "max_norm_rel_dev": dev,
        "max_norm_rel_dev_eq19": dev19,
        "max_singular_value_spread": spread,
        "chain_max_gram_rel_err": max(c["gram_rel_err_after"] for c in chains),
        "chain_max_norm_rel_err": max(c["norm_rel_err_after"] for c in chains),
        "any_diverged": any(series[f"D{d}"]["diverged"] for d in cfg.depths),
        "max_first_rel_dev": max(
            float(np.max(series[f"D{d}"]["first_rel_dev"])) for d in cfg.depths
        ),
        "max_first_rel_dev_eq19": max(
            float(np.max(series[f"D{d}"]["first_rel_dev_eq19"])) for d in cfg.depths
        ),
        "printed_depth_rel_dev_eq19": (
            float(np.max(series[f"D{cfg.printed_depth}"]["intermediate_rel_dev_eq19"]))
            if cfg.printed_depth in cfg.depths
            else float("nan")
        ),
        "constant_max_norm_rel_dev": max(
            float(np.max(series[f"D{d}"]["constant_intermediate_rel_dev"])) for d in cfg.depths
        ),
        "constant_max_first_rel_dev": max(
            float(np.max(series[f"D{d}"]["constant_first_rel_dev"])) for d in cfg.depths
        ),
        "constant_any_diverged": any(series[f"D{d}"]["constant_diverged"] for d in cfg.depths),
        "per_run": {key: _per_run(series, cfg, key) for key in PER_RUN_KEYS},
        "library_flow_vs_oracle": max(
            series[f"D{d}"]["library"]["flow_vs_oracle"] for d in cfg.depths
        ),
        "library_pair_imbalance": {
            d: series[f"D{d}"]["library"]["pair_imbalance"] for d in cfg.depths
        },
    }


def claims(results: dict[str, Any], cfg: Config) -> list[Claim]:
    s = results["series"]
    preds = ", ".join(
        f"D={d}: general {s[f'D{d}']['predicted_sq_norm']:.4g}, printed eq. 19 "
        f"{s[f'D{d}']['paper_eq19_sq_norm']:.4g}"
        for d in cfg.depths
    )
    div = "; SGD diverged" if results["any_diverged"] else ""
    chains = results["chain_solver"]
    pd = cfg.printed_depth
    per_run = ", ".join(
        f"D={d}: "
        + "/".join(
            f"{v:.3g}"
            for v in np.asarray(s[f"D{d}"]["intermediate_rel_dev"], dtype=float).max(axis=1)
        )
        for d in cfg.depths
    )
    cdiv = "; constant-η SGD diverged" if results["constant_any_diverged"] else ""
    pr = {k: over_seeds(v) for k, v in results["per_run"].items()}

    def runs(key: str) -> str:
        return f"per init, {pr[key].note()}"

    first_pred = ", ".join(
        f"D={d}: Tr Σ_x c² = {s[f'D{d}']['predicted_first_scaled_sq_norm']:.4g}, printed "
        f"{s[f'D{d}']['paper_eq19_sq_norm']:.4g}"
        for d in cfg.depths
    )
    return [
        Claim(
            id="thm54_norms_constant_lr",
            statement="The paper's protocol (constant η): every intermediate layer's ‖W_i‖_F², "
            "time-averaged over the stationary window, is within 10% of Thm 5.4's k·c² "
            "(corrected; max over depths, runs, layers of |average/prediction − 1|)",
            value=results["constant_max_norm_rel_dev"],
            op=Op.LT,
            threshold=0.1,
            note=f"{runs('constant_intermediate_rel_dev')}; η = {cfg.lr:g} constant, "
            f"{cfg.n_runs} inits per depth, window: records after {cfg.burn_in_frac:.0%} of "
            f"{cfg.steps} steps; first layer (‖W_1Σ_x^{{1/2}}‖²): "
            f"{results['constant_max_first_rel_dev']:.3g}" + cdiv,
            why=f"at constant η = {cfg.lr:g} the stationary norms sit "
            f"{results['constant_max_norm_rel_dev']:.1%} from k·c²; annealing the same runs "
            f"brings it to {results['max_norm_rel_dev']:.1%}: a finite-η bias of the "
            "constant-η equilibrium",
        ),
        Claim(
            id="thm54_norms_printed_eq19",
            kind=Kind.PRINTED,
            statement=f"Against the printed eq. 19, (Tr S′)^{{2/D}} k^{{1−2/D}}: after SGD "
            f"(annealed) at D = {pd}, every intermediate ‖W_i‖_F² is within 10% of it (max over "
            "runs and layers of |‖W_i‖²/eq. 19 − 1|)",
            value=results["printed_depth_rel_dev_eq19"],
            op=Op.LT,
            threshold=0.1,
            note=f"{runs('intermediate_rel_dev_eq19')}; printed "
            f"{s[f'D{pd}']['paper_eq19_sq_norm']:.4g} vs corrected "
            f"{s[f'D{pd}']['predicted_sq_norm']:.4g} at D = {pd} (Tr Σ_x = "
            f"{results['trace_sigma_x']:.3g}, Tr Σ_ε = {results['trace_sigma_eps']:.3g}, k = "
            f"{results['rank']}); the same run against the corrected form: "
            f"{float(np.max(s[f'D{pd}']['intermediate_rel_dev'])):.3g}" + div,
            why=f"eq. 19 assumes Tr Σ_x = Tr Σ_ε = k (here {results['trace_sigma_x']:.3g}, "
            f"{results['trace_sigma_eps']:.3g}, {results['rank']}): it predicts "
            f"{s[f'D{pd}']['paper_eq19_sq_norm']:.4g} where the corrected form predicts "
            f"{s[f'D{pd}']['predicted_sq_norm']:.4g}, which the runs match to "
            f"{float(np.max(s[f'D{pd}']['intermediate_rel_dev'])):.1%}",
        ),
        Claim(
            id="thm54_first_layer_norm",
            statement="Eq. 19's first-layer norm, corrected: after SGD (annealed), "
            "Tr[Σ_1²] = ‖W_1Σ_x^{1/2}‖_F² is within 10% of Tr[Σ_x]·c² (max over depths and runs "
            "of |measured/prediction − 1|)",
            value=results["max_first_rel_dev"],
            op=Op.LT,
            threshold=0.1,
            note=f"{runs('first_rel_dev')}; predictions {first_pred}" + div,
        ),
        Claim(
            id="thm54_first_layer_printed_eq19",
            kind=Kind.PRINTED,
            statement="Eq. 19 as printed: Tr[Σ_1²] = ‖W_1Σ_x^{1/2}‖_F² equals the intermediate "
            "layers' (Tr S′)^{2/D} k^{1−2/D}: after SGD (annealed), max over depths and runs of "
            "|measured/eq. 19 − 1|",
            value=results["max_first_rel_dev_eq19"],
            op=Op.LT,
            threshold=0.1,
            note=f"{runs('first_rel_dev_eq19')}; holds only if Tr Σ_x = Tr Σ_ε = k, which these "
            "data avoid" + div,
            why=f"the first layer's Tr[Σ_1²] is Tr Σ_x·c², not the intermediate layers' value "
            f"(equal only if Tr Σ_x = k; here {results['trace_sigma_x']:.3g} vs "
            f"{results['rank']}); against the corrected form the runs are within "
            f"{results['max_first_rel_dev']:.1%}",
        ),
        Claim(
            id="thm54_norms",
            statement="Annealed η (ours, not the paper's protocol): after SGD, every intermediate "
            "layer's ‖W_i‖_F² is within 10% of Thm 5.4's k·c², c = (Tr S′/√(TrΣ_x TrΣ_ε))^{1/D} "
            "(max over depths, runs, layers of |‖W_i‖²/prediction − 1|)",
            value=results["max_norm_rel_dev"],
            op=Op.LT,
            threshold=0.1,
            note=f"{runs('intermediate_rel_dev')}; predictions {preds}; against the printed eq. "
            f"19 the max deviation is {results['max_norm_rel_dev_eq19']:.3g}; per depth and run "
            f"(max over layers): {per_run}{div}",
        ),
        Claim(
            id="thm54_orthogonal",
            statement="After SGD, the intermediate layers are scaled orthogonal on the learned "
            "subspace (max over depths, runs, layers of σ_1/σ_k − 1 over the top k = rank V "
            "singular values)",
            value=results["max_singular_value_spread"],
            op=Op.LT,
            threshold=0.1,
            note=runs("singular_value_spread") + div,
        ),
        Claim(
            id="library_chain_flow_matches",
            kind=Kind.BEYOND,
            statement="At the end of SGD (run 1 per depth), the library's rotation flow of every "
            "adjacent pair (nf.DoubleRotation, nf.collect_stats, nf.noether_flow on the "
            "nn.Module, fresh samples) equals (η/S)(M_U − M_W) from per-sample gradients "
            "written out by hand (max relative Frobenius difference, float64)",
            value=results["library_flow_vs_oracle"],
            op=Op.LT,
            threshold=1e-8,
            note="‖M_U − M_W‖/‖M_W‖ on the sample (max over pairs): "
            + ", ".join(f"D={d}: {v:.3g}" for d, v in results["library_pair_imbalance"].items())
            + f" ({cfg.n_eval} samples)",
        ),
        Claim(
            id="chain_solver_matches",
            kind=Kind.BEYOND,
            statement="The chain solver, started from a random orbit point of a global minimum, "
            "reaches Thm 5.4's closed form (max over depths and i < D of the relative Frobenius "
            "error of (W_i⋯W_1)ᵀ(W_i⋯W_1), float64)",
            value=results["chain_max_gram_rel_err"],
            op=Op.LT,
            threshold=1e-6,
            note="before solving: "
            + ", ".join(f"D={c['depth']}: {c['gram_rel_err_before']:.3g}" for c in chains)
            + f"; max ‖W_i‖² rel. error after: {results['chain_max_norm_rel_err']:.2g}",
        ),
    ]


def plot(results: dict[str, Any], cfg: Config, out_dir: Path) -> list[Path]:
    from noetherflow.experiments._thm54_plot import plot_thm54

    return plot_thm54(results, cfg, out_dir)

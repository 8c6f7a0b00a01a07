"""Fig. 4: SGD noise flattens a Kaiming-initialised factorisation, which is why warmup works.

Rank-1 matrix factorisation ``f(x) = UWx`` with ``U ∈ R^{d_y×1}``, ``W ∈ R^{1×d_x}`` trained
on ``y = Vx + ε`` with a rank-1 target ``V``. The per-sample loss is the paper's eq. (12)
without weight decay, ``ℓ = ‖UWx − y‖²`` (sum over outputs), and the sharpness is
``S(θ) = Tr ∇²L(θ)``, exact at every point (Prop. 5.3 with its factor 2, see
:func:`~noetherflow.theory.ziyin2024.two_layer_hessian_trace`):
``S = 2(d_y‖WΣ_x^{1/2}‖² + ‖U‖²Tr Σ_x)``. With no weight decay the charge
``C = ‖U‖² − ‖W‖²`` obeys ``C' = C + η²(‖g_U‖² − ‖g_W‖²)`` exactly, and at the global
minimum ``E[ΔC] = −4η²σ_x²σ_ε² d C / S`` (``d_x = d_y = d``): SGD noise balances the
layers, while gradient flow conserves ``C``. A Kaiming start (``‖U‖² ≈ d_y``, ``‖W‖² ≈ 1``)
is far from balance, so SGD flattens it (progressive flattening); after flattening a
learning rate that diverged at initialisation is stable (warmup).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from noetherflow._divergence import diverged_mask, find_divergence
from noetherflow.experiments._base import Claim, Op, derive_seed, save_figure
from noetherflow.experiments._fig4_claims import (
    _direction_claims,
    _orbit_and_library_claims,
    _reachable_claims,
    _warmup_failures,
)
from noetherflow.experiments._rank1 import (
    library_checks,
    orbit_stability,
    sharpness,
)

if TYPE_CHECKING:
    from noetherflow.theory.ziyin2024 import InitScheme

DESCRIPTION = (
    "Rank-1 factorisation: SGD from Kaiming init flattens Tr∇²L to the noise equilibrium; "
    "η_max diverges from init but not after a warmup at η_small."
)

PAPER = (
    "Fig. 4 (§5.2): SGD from Kaiming init on a rank-1 factorisation diverges at η = 0.008 and "
    "is stable after 5000 steps at η = 0.001 (warmup), because the noise improves the stability "
    "condition S; GD's and Xavier's S \"increases only slightly\"; Kaiming and Xavier reach the "
    "same S (the equilibrium is unique)."
)
PAPER_ORDER = 4.0


def setup(cfg: Config) -> list[dict[str, str]]:
    """Every deviation from the paper's setup, one row each (issue #17)."""
    quick = Config.quick()
    rc = cfg.reachable()
    return [
        {
            "quantity": "model sizes",
            "paper": "rank-1 factorisation, sizes not given",
            "ours": f"d_x = d_y = {cfg.d_io}, hidden width {cfg.hidden}",
            "why": "large d makes GD's change small against SGD's (≈ 2/(d − 1))",
        },
        {
            "quantity": "data",
            "paper": "not given",
            "ours": f"x ~ N(0, {cfg.input_var:g}·I), y = Vx + ε, ε ~ N(0, {cfg.noise_var:g}·I), "
            f"rank-1 V of norm {cfg.target_norm:g}, fresh samples every step",
            "why": "input variance sets the curvature so η_max diverges from Kaiming; online SGD "
            "makes Thm 5.2's population moments exact",
        },
        {
            "quantity": "second setting",
            "paper": "—",
            "ours": f"input variance {rc.input_var:g}, label-noise variance {rc.noise_var:g} "
            "(claims reachable_*)",
            "why": "in the first setting no orbit point is stable at η_max (issue #17)",
        },
        {
            "quantity": "batch size S",
            "paper": "not given",
            "ours": str(cfg.batch_size),
            "why": "largest noise",
        },
        {
            "quantity": "loss convention",
            "paper": "ℓ = ‖UWx − y‖² (eq. 12)",
            "ours": "same, mean over the batch, no weight decay",
            "why": "—",
        },
        {
            "quantity": "Kaiming init of U",
            "paper": "σ_U² = 1",
            "ours": "fan-in, σ_U² = 1/d = 1 (d = 1)",
            "why": "identical for the rank-1 model",
        },
        {
            "quantity": "Xavier init",
            "paper": "σ² = 1/(fan_in + fan_out)",
            "ours": f"xavier_normal_ with gain {cfg.xavier_gain:.3g} (same variance)",
            "why": "—",
        },
        {
            "quantity": "steps",
            "paper": "not given (5000 + more)",
            "ours": f"{cfg.n_steps} (quick {quick.n_steps})",
            "why": "equilibrium by ~12000",
        },
        {
            "quantity": "seeds",
            "paper": "1 curve per run",
            "ours": f"{cfg.n_seeds} (quick {quick.n_seeds})",
            "why": "divergence is a fraction",
        },
        {
            "quantity": "GD",
            "paper": "GD",
            "ours": "GD on the population loss (exact gradient)",
            "why": "the expected gradient is known in closed form",
        },
        {
            "quantity": "S",
            "paper": "stability condition, Tr ∇²L",
            "ours": "Tr ∇²L of the population loss, closed form (Prop. 5.3 with its factor 2)",
            "why": "exact at every step",
        },
    ]


_RUNS = ("sgd_kaiming_max", "sgd_kaiming_warmup", "sgd_kaiming", "sgd_xavier", "gd_kaiming")
_LABELS = {
    "sgd_kaiming_max": "SGD, Kaiming, η_max constant",
    "sgd_kaiming_warmup": "SGD, Kaiming, η_small then η_max (warmup)",
    "sgd_kaiming": "SGD, Kaiming, η_small",
    "sgd_xavier": "SGD, Xavier, η_small",
    "gd_kaiming": "GD, Kaiming, η_small",
}


@dataclass(frozen=True)
class Config:
    """Settings of the Fig. 4 experiment. The paper gives only η = 0.008, 0.001 and a
    switch after 5000 steps; everything else is our choice.

    Choices and why:

    - **"Rank-1"** = hidden width ``hidden=1`` and a rank-1 target ``V = v·u*w*ᵀ``
      (``u*, w*`` random unit vectors, ``target_norm`` ``v = 1``), so the global minimum is
      reachable. With ``d = 1`` Kaiming's fan-in variance of ``U`` is ``1/d = 1``, which is
      exactly the paper's ``σ_U² = 1`` (its formula is right only for this rank-1 model).
    - Kaiming: ``σ_U² = 1/d``, ``σ_W² = 1/d_x``
      (:func:`~noetherflow.theory.ziyin2024.init_variances`). Xavier: the paper's variant
      ``σ² = 1/(fan_in + fan_out)``, i.e. ``xavier_normal_`` with gain ``1/√2``
      (``xavier_gain``); it starts with ``‖U‖² ≈ ‖W‖² ≈ 1`` = balanced at the scale of
      ``V``, hence the paper's "increases only slightly".
    - ``d_x = d_y = d_io = 16``, ``x ~ N(0, input_var·I)`` with ``input_var = 5``,
      ``ε ~ N(0, noise_var·I)`` with ``noise_var = 1``, fresh samples every step (online
      SGD on the population loss, so Thm 5.2's population moments are exact), batch size 1.
      ``input_var·d_io²`` sets the per-sample curvature at a Kaiming start,
      ``≈ 2σ_x²d_io²``: 2560, so ``η_max = 0.008`` is far beyond the edge of stability
      there (it diverges for every seed we tried) while ``η_small = 0.001`` survives; after
      flattening (``‖U‖² ≈ v``) the curvature is ``≈ 2σ_x²d_io v = 160`` and ``η_max`` is
      stable. The paper's learning rates are thus used unscaled.
      ``noise_var`` sets the flattening rate ``4η²σ_x²σ_ε²d_io`` per step at the minimum
      (3.2e-4 at ``η_small``: a few e-folds in ``warmup_steps``), while keeping the
      finite-``η`` excess loss ``≈ ½ησ_ε²S`` a few percent of ``L*``.
    - Large ``d_io`` also makes the GD claim meaningful: GD conserves ``‖U‖² − ‖W‖²``, so
      from Kaiming it only shrinks ``‖W‖²`` from ≈ 1 to ≈ ``v²/d_io`` and ``|ΔS_GD|/|ΔS_SGD|``
      is ≈ ``2/(d_io − 1)`` (0.13 here; it would exceed 1/5 for ``d_io < 11``).
    - GD is gradient descent on the population loss (exact expected gradient), at
      ``η_small`` from the same Kaiming initialisations as the SGD runs; every Kaiming run of
      a seed shares its initialisation and data stream.
    - ``S`` is computed in closed form (Prop. 5.3; checked against autograd in the tests)
      every ``log_every`` steps; ``S_end`` is the mean over the last ``end_window`` of the
      steps and over seeds. The prediction is
      :func:`~noetherflow.theory.ziyin2024.two_layer_sgd_sharpness` (Thm 5.2 at the global
      minimum, ``d = 1``); eq. (15)'s ``S_end = 2min(d, d_x)Tr Σ_x`` assumes an
      autoencoder (``V = I``), which a rank-1 model cannot fit, so it does not apply. Eq.
      (15)'s ``S_init`` (:func:`~noetherflow.theory.ziyin2024.sharpness_at_init`) does and
      is reported.
    - "Converged" (warmup claim; the issue gives no threshold): finite, and the population
      loss has stopped moving — its means over the two halves of the final window differ by
      less than ``converged_tol`` = 5% — below its initial value. SGD at ``η_max`` settles
      at a noise floor ≈ 14% above ``L* = d_yσ_ε²`` here, so "converged" cannot mean
      "at ``L*``".
    - A diverging run is data: its per-step minibatch losses go to inf/NaN and
      :func:`~noetherflow._divergence.find_divergence` records the step and last
      finite loss.
    - Second setting (issue #17; ``reachable()``, claims ``reachable_*``):
      ``reachable_input_var = 1.5``, ``reachable_noise_var = 4``. In the first setting no
      point of the symmetry orbit of the init is stable at ``η_max``; here most seeds have
      one (pilot in NOTES), so warmup and teleport test the paper's mechanism. The orbit's
      flattest point is the minimum of ``E_x λ_max(∇²ℓ_x)`` (``hessian_samples`` fresh
      samples, closed form) over ``orbit_grid`` values of λ in ``±orbit_span``.
    - The library's equilibrium: ``nf.collect_stats`` on ``stats_batch`` fresh samples at each
      final SGD-Kaiming state, ``nf.solve_equilibrium`` (continuous time, ``η_small``, S = 1),
      ``nf.teleport``; its S is compared with Thm 5.2 like ``S_end``.
    - float64 throughout.
    """

    d_io: int = 16
    hidden: int = 1
    input_var: float = 5.0
    noise_var: float = 1.0
    target_norm: float = 1.0
    batch_size: int = 1
    lr_small: float = 0.001
    lr_max: float = 0.008
    warmup_steps: int = 5000
    n_steps: int = 30000
    n_seeds: int = 32
    xavier_gain: float = 2.0**-0.5
    log_every: int = 50
    end_window: float = 0.2
    converged_tol: float = 0.05
    reachable_input_var: float = 1.5
    reachable_noise_var: float = 4.0
    hessian_samples: int = 256
    orbit_grid: int = 81
    orbit_span: float = 4.0
    stats_batch: int = 4096

    @classmethod
    def quick(cls) -> Config:
        """Same problem, fewer steps (the equilibrium is reached by ~12000) and seeds."""
        return cls(n_steps=20000, n_seeds=8)

    def reachable(self) -> Config:
        """The second setting: input and label variances where the orbit reaches stability."""
        return dataclasses.replace(
            self, input_var=self.reachable_input_var, noise_var=self.reachable_noise_var
        )


# --------------------------------------------------------------------------------------
# Simulation: all runs of all seeds at once, as batched matrix products over a run axis
# --------------------------------------------------------------------------------------


def _inits(cfg: Config, seed: int, scheme: InitScheme) -> tuple[np.ndarray, np.ndarray]:
    from noetherflow.theory.ziyin2024 import init_variances

    d, n = cfg.hidden, cfg.d_io
    gain = cfg.xavier_gain if scheme == "xavier" else 1.0
    var_w, var_u = init_variances(scheme, d_x=n, d=d, d_y=n, gain=gain)
    rng = np.random.default_rng(derive_seed(seed, "fig4", "init", scheme))
    U = rng.standard_normal((cfg.n_seeds, n, d)) * math.sqrt(var_u)
    W = rng.standard_normal((cfg.n_seeds, d, n)) * math.sqrt(var_w)
    return U, W


def _target(cfg: Config, seed: int) -> np.ndarray:
    rng = np.random.default_rng(derive_seed(seed, "fig4", "target"))
    u = rng.standard_normal(cfg.d_io)
    w = rng.standard_normal(cfg.d_io)
    out: np.ndarray = cfg.target_norm * np.outer(u / np.linalg.norm(u), w / np.linalg.norm(w))
    return out


def _simulate(cfg: Config, seed: int) -> dict[str, Any]:
    """Train every run; per-step minibatch losses and logged S / population loss.

    SGD runs live on a leading axis ``[4, n_seeds]`` (``_RUNS[:4]``); the three Kaiming SGD
    runs of a seed share their initialisation and data stream, Xavier has its own stream.
    numpy, not torch: at these sizes the cost is per-call overhead, numpy's is ~5× lower.
    """
    n_s, n, bsz = cfg.n_seeds, cfg.d_io, cfg.batch_size
    V = _target(cfg, seed)
    Uk, Wk = _inits(cfg, seed, "kaiming")
    Ux, Wx = _inits(cfg, seed, "xavier")
    U = np.stack([Uk, Uk, Uk, Ux])  # [4, n_s, d_y, d]
    W = np.stack([Wk, Wk, Wk, Wx])  # [4, n_s, d, d_x]
    n_sgd = U.shape[0]
    # η·(2/B): the 2 of ∇‖r‖², the mean over the batch
    lr_before = (2.0 / bsz) * np.array([cfg.lr_max, cfg.lr_small, cfg.lr_small, cfg.lr_small])
    lr_after = (2.0 / bsz) * np.array([cfg.lr_max, cfg.lr_max, cfg.lr_small, cfg.lr_small])
    lr_before, lr_after = lr_before[:, None, None, None], lr_after[:, None, None, None]
    Ug, Wg = Uk.copy(), Wk.copy()  # GD
    rng_k = np.random.default_rng(derive_seed(seed, "fig4", "data", "kaiming"))
    rng_x = np.random.default_rng(derive_seed(seed, "fig4", "data", "xavier"))
    sx, se = math.sqrt(cfg.input_var), math.sqrt(cfg.noise_var)
    Vt = V.T
    gd_step = 2.0 * cfg.input_var * cfg.lr_small
    l_star = n * cfg.noise_var

    batch_loss = np.empty((cfg.n_steps, n_sgd, n_s))
    gd_loss = np.empty((cfg.n_steps, n_s))
    log_steps = [*range(0, cfg.n_steps, cfg.log_every), cfg.n_steps]
    s_log: list[np.ndarray] = []
    l_log: list[np.ndarray] = []

    def log() -> None:
        U_all = np.concatenate([U.reshape(-1, *U.shape[2:]), Ug])
        W_all = np.concatenate([W.reshape(-1, *W.shape[2:]), Wg])
        P = U_all @ W_all - V
        s_log.append(sharpness(U_all, W_all, cfg.input_var))
        l_log.append(cfg.input_var * (P * P).sum((1, 2)) + l_star)

    shape = (2, n_s, bsz, n)
    lr = lr_before
    with np.errstate(over="ignore", invalid="ignore"):
        for k in range(cfg.n_steps):
            if k == cfg.warmup_steps:
                lr = lr_after
            if k % cfg.log_every == 0:
                log()
            z = rng_k.standard_normal(shape)
            zx = rng_x.standard_normal(shape)
            x = np.stack([z[0], z[0], z[0], zx[0]]) * sx  # [4, n_s, B, d_x]
            y = x @ Vt + se * np.stack([z[1], z[1], z[1], zx[1]])
            h = x @ W.swapaxes(-1, -2)  # [4, n_s, B, d]
            r = h @ U.swapaxes(-1, -2) - y  # [4, n_s, B, d_y]
            batch_loss[k] = (r * r).sum((-2, -1))
            r *= lr
            W -= (r @ U).swapaxes(-1, -2) @ x
            U -= r.swapaxes(-1, -2) @ h
            # GD on the population loss L = σ_x²‖UW − V‖² + L*
            P = Ug @ Wg - V
            gd_loss[k] = (P * P).sum((1, 2))
            Ug, Wg = Ug - gd_step * (P @ Wg.swapaxes(1, 2)), Wg - gd_step * (Ug.swapaxes(1, 2) @ P)
        log()
    batch_loss /= bsz
    gd_loss = cfg.input_var * gd_loss + l_star
    s_all = np.stack(s_log, axis=1)  # [runs, logs]
    l_all = np.stack(l_log, axis=1)
    losses = np.concatenate([batch_loss.reshape(cfg.n_steps, -1), gd_loss], axis=1).T
    return {
        "V": V,
        "log_steps": np.asarray(log_steps),
        "S": s_all,
        "pop_loss": l_all,
        "step_loss": losses,  # [runs, steps]
        "U": np.concatenate([U.reshape(-1, *U.shape[2:]), Ug]),
        "W": np.concatenate([W.reshape(-1, *W.shape[2:]), Wg]),
    }


def _split(arr: np.ndarray, n_s: int) -> dict[str, np.ndarray]:
    return {name: arr[i * n_s : (i + 1) * n_s] for i, name in enumerate(_RUNS)}


def _nanmean_rows(a: np.ndarray) -> np.ndarray:
    """Mean over seeds (axis 0) of the finite entries; NaN where no seed is finite."""
    a = np.where(np.isfinite(a), a, np.nan)
    count = np.sum(np.isfinite(a), axis=0)
    total = np.nansum(a, axis=0)
    out: np.ndarray = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    return out


def run(cfg: Config, seed: int, out_dir: Path) -> dict[str, Any]:
    """Both settings (``input_var`` of the figure, and ``reachable()``); see :func:`_analyse`."""
    out = _analyse(cfg, seed)
    reach = _analyse(cfg.reachable(), seed)
    for key in ("step", *(f"S_{n}" for n in _RUNS)):
        if key != "step":
            out["series"][f"reachable_{key}"] = reach["series"][key]
    out["reachable"] = {k: v for k, v in reach.items() if k != "series"}
    return out


def _analyse(cfg: Config, seed: int) -> dict[str, Any]:
    """Five kinds of run × ``n_seeds``; S over steps, divergence, predictions, the orbit's
    flattest point and the library's equilibrium."""
    import torch

    from noetherflow.theory.ziyin2024 import (
        init_variances,
        sharpness_at_init,
        two_layer_hessian_trace,
        two_layer_sgd_sharpness,
    )

    sim = _simulate(cfg, seed)
    n, d, n_s = cfg.d_io, cfg.hidden, cfg.n_seeds
    steps = sim["log_steps"]
    S = _split(sim["S"], n_s)
    L = _split(sim["pop_loss"], n_s)
    step_loss = _split(sim["step_loss"], n_s)
    sigma_x = cfg.input_var * torch.eye(n, dtype=torch.float64)
    sigma_e = cfg.noise_var * torch.eye(n, dtype=torch.float64)
    V = torch.as_tensor(sim["V"])
    s_pred = two_layer_sgd_sharpness(V, sigma_x, sigma_e, hidden_dim=d, reduction="sum")
    s_init_pred = {}
    for scheme in ("kaiming", "xavier"):
        gain = cfg.xavier_gain if scheme == "xavier" else 1.0
        var_w, var_u = init_variances(scheme, d_x=n, d=d, d_y=n, gain=gain)
        s_init_pred[scheme] = sharpness_at_init(
            var_w, var_u, trace_sigma_x=cfg.input_var * n, d=d, d_y=n, reduction="sum"
        )
    # our vectorised S must equal the theory module's Prop 5.3 at the final states
    check = []
    for U_f, W_f in zip(sim["U"], sim["W"], strict=True):
        if not (diverged_mask(U_f).any() or diverged_mask(W_f).any()):
            ref = two_layer_hessian_trace(
                torch.as_tensor(U_f), torch.as_tensor(W_f), sigma_x, reduction="sum"
            )
            got = float(sharpness(U_f, W_f, cfg.input_var))
            check.append(abs(got - ref) / ref)

    window = steps >= (1.0 - cfg.end_window) * cfg.n_steps
    l_star = n * cfg.noise_var
    per_run: dict[str, Any] = {}
    for name in _RUNS:
        divs = [find_divergence(row) for row in step_loss[name]]
        s_end_seed = np.mean(S[name][:, window], axis=1)
        l_end_seed = np.mean(L[name][:, window], axis=1)
        l0 = L[name][:, 0]
        l_prev = np.mean(L[name][:, window & (steps < (1.0 - cfg.end_window / 2) * cfg.n_steps)], 1)
        l_last = np.mean(L[name][:, steps >= (1.0 - cfg.end_window / 2) * cfg.n_steps], 1)
        per_run[name] = {
            "lr_before_warmup": cfg.lr_max if name == "sgd_kaiming_max" else cfg.lr_small,
            "n_diverged": int(sum(dv.diverged for dv in divs)),
            "diverged_at_step": [dv.step for dv in divs],
            "last_finite_loss": [dv.last_finite_value for dv in divs],
            "S_init_mean": float(np.mean(S[name][:, 0])),
            "S_init_per_seed": S[name][:, 0],
            "S_end_per_seed": s_end_seed,
            "S_end_mean": float(np.mean(s_end_seed))
            if np.all(np.isfinite(s_end_seed))
            else math.nan,
            "loss_end_per_seed": l_end_seed,
            "excess_left_frac": (l_end_seed - l_star) / (l0 - l_star),
            "loss_drift": np.abs(l_last / l_prev - 1.0),
            "loss_below_init": l_end_seed < l0,
        }
    series: dict[str, Any] = {"step": steps}
    for name in _RUNS:
        series[f"S_{name}"] = _nanmean_rows(S[name])
        series[f"S_{name}_per_seed"] = S[name]
        series[f"loss_{name}"] = _nanmean_rows(L[name])
    return {
        "series": series,
        "runs": per_run,
        "S_pred_end": s_pred,
        "S_pred_init": s_init_pred,
        "L_star": l_star,
        "prop53_check_max_rel_err": max(check) if check else math.nan,
        "target_singular_value": cfg.target_norm,
        "orbit": orbit_stability(cfg, seed, sim["V"], *_inits(cfg, seed, "kaiming")),
        "library": library_checks(
            cfg, seed, sim["V"], sim["U"][2 * n_s : 3 * n_s], sim["W"][2 * n_s : 3 * n_s]
        ),
        "input_var": cfg.input_var,
        "noise_var": cfg.noise_var,
    }


def claims(results: dict[str, Any], cfg: Config) -> list[Claim]:
    runs = results["runs"]
    big, warm = runs["sgd_kaiming_max"], runs["sgd_kaiming_warmup"]
    sgd, xav, gd = runs["sgd_kaiming"], runs["sgd_xavier"], runs["gd_kaiming"]
    steps_div = [s for s in big["diverged_at_step"] if s is not None]
    warm_bad, drift = _warmup_failures(warm, cfg)
    s_pred = float(results["S_pred_end"])
    s_init, s_end = float(sgd["S_init_mean"]), float(sgd["S_end_mean"])
    d_sgd = s_end - s_init
    d_gd = float(gd["S_end_mean"]) - float(gd["S_init_mean"])
    same = abs(s_end - float(xav["S_end_mean"])) / (0.5 * (s_end + float(xav["S_end_mean"])))
    return [
        Claim(
            id="kaiming_large_lr_diverges",
            statement=f"SGD at constant η_max = {cfg.lr_max} from Kaiming init diverges "
            "(fraction of seeds whose loss became non-finite)",
            value=big["n_diverged"] / cfg.n_seeds,
            op=Op.GE,
            threshold=1.0,
            note=(f"divergence steps {sorted(steps_div)}" if steps_div else "no seed diverged"),
        ),
        Claim(
            id="warmup_stable",
            statement=f"η_small = {cfg.lr_small} for {cfg.warmup_steps} steps, then η_max = "
            f"{cfg.lr_max}: finite and converged (number of seeds that diverged, or whose "
            f"population loss still drifts by ≥ {cfg.converged_tol:.0%} between the two halves "
            "of the final window, or ends above its initial value)",
            value=warm_bad,
            op=Op.EQ,
            threshold=0,
            note=f"{warm['n_diverged']} diverged; loss drift per seed "
            f"{np.round(drift, 4).tolist()}; final excess loss / initial excess "
            f"{np.round(np.asarray(warm['excess_left_frac'], dtype=float), 4).tolist()}",
        ),
        Claim(
            id="progressive_flattening",
            statement="SGD from Kaiming init flattens: S_end / S_init (mean over seeds)",
            value=s_end / s_init,
            op=Op.LT,
            threshold=1.0,
            note=f"S_init = {s_init:.4g} (eq. 15 expects {results['S_pred_init']['kaiming']:.4g}),"
            f" S_end = {s_end:.4g}",
        ),
        Claim(
            id="flattening_matches_theory",
            statement="S_end of SGD from Kaiming init vs Thm 5.2 + Prop 5.3 "
            "(two_layer_sgd_sharpness): |S_end / S_pred − 1|",
            value=abs(s_end / s_pred - 1.0),
            op=Op.LT,
            threshold=0.15,
            note=f"S_end = {s_end:.4g}, S_pred = {s_pred:.4g}",
        ),
        Claim(
            id="same_equilibrium",
            statement="SGD from Kaiming and from Xavier reach the same S: "
            "|S_K − S_X| / mean(S_K, S_X) at the end",
            value=same,
            op=Op.LT,
            threshold=0.05,
            note=f"S_end Kaiming {s_end:.4g}, Xavier {float(xav['S_end_mean']):.4g} "
            f"(Xavier S_init {float(xav['S_init_mean']):.4g})",
        ),
        Claim(
            id="gd_small_change",
            statement="GD from Kaiming changes S much less than SGD: |ΔS_GD| / |ΔS_SGD|",
            value=abs(d_gd) / abs(d_sgd) if d_sgd != 0 else math.inf,
            op=Op.LT,
            threshold=0.2,
            note=f"ΔS_GD = {d_gd:.4g}, ΔS_SGD = {d_sgd:.4g}",
        ),
        *_direction_claims(runs),
        *_orbit_and_library_claims(results, cfg, prefix=""),
        *_reachable_claims(results["reachable"], cfg),
    ]


def plot(results: dict[str, Any], cfg: Config, out_dir: Path) -> list[Path]:
    from matplotlib.figure import Figure

    s = results["series"]
    steps = np.asarray(s["step"], dtype=float)
    fig = Figure(figsize=(14, 5))
    ax, ax_r = fig.subplots(1, 2)
    colors = {
        "sgd_kaiming_max": "C1",
        "sgd_kaiming_warmup": "C2",
        "sgd_kaiming": "C0",
        "sgd_xavier": "C4",
        "gd_kaiming": "C3",
    }
    styles = {"sgd_xavier": "--", "gd_kaiming": ":"}
    for name in _RUNS:
        per_seed = np.asarray(s[f"S_{name}_per_seed"], dtype=float)
        for row in per_seed:
            ax.plot(steps, row, color=colors[name], lw=0.4, alpha=0.25)
        mean = np.asarray(s[f"S_{name}"], dtype=float)
        label = (
            _LABELS[name]
            .replace("η_max", f"η={cfg.lr_max}")
            .replace("η_small", f"η={cfg.lr_small}")
        )
        if name == "sgd_kaiming_max":
            at = results["runs"][name]["diverged_at_step"]
            hit = [(st, row[0]) for st, row in zip(at, per_seed, strict=True) if st is not None]
            label += f" — diverged {len(hit)}/{cfg.n_seeds} (×: step of divergence)"
            if hit:
                ax.plot(*zip(*hit, strict=True), "x", color=colors[name], ms=7, mew=1.5)
        ax.plot(steps, mean, color=colors[name], ls=styles.get(name, "-"), lw=1.8, label=label)
    ax.axhline(
        float(results["S_pred_end"]), color="k", lw=1, ls="-.", label="Thm 5.2 + Prop 5.3 (SGD)"
    )
    ax.axvline(cfg.warmup_steps, color="0.5", lw=0.8, ls=":")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("S(θ) = Tr ∇²L")
    ax.set_title(
        f"d_x = d_y = {cfg.d_io}, input variance {cfg.input_var:g}: flattening and warmup",
        fontsize=9,
    )
    ax.legend(fontsize=7, loc="upper right")
    rc, reach = cfg.reachable(), results["reachable"]
    for name in _RUNS:
        ax_r.plot(
            steps,
            np.asarray(s[f"reachable_S_{name}"], dtype=float),
            color=colors[name],
            ls=styles.get(name, "-"),
            lw=1.8,
            label=f"{_LABELS[name]}, {reach['runs'][name]['n_diverged']} div.",
        )
    ax_r.axhline(
        float(reach["S_pred_end"]), color="k", lw=1, ls="-.", label="Thm 5.2 + Prop 5.3 (SGD)"
    )
    ax_r.axvline(cfg.warmup_steps, color="0.5", lw=0.8, ls=":")
    ax_r.set_yscale("log")
    ax_r.set_xlabel("step")
    ax_r.set_ylabel("S(θ) = Tr ∇²L")
    ax_r.set_title(
        f"input variance {rc.input_var:g}, label noise {rc.noise_var:g}: the orbit of the init "
        "reaches stability at η_max",
        fontsize=9,
    )
    ax_r.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return [save_figure(fig, out_dir / "fig4.png")]

"""Fig. 6: a two-layer tanh net's hidden representations agree with Thm 5.2 under SGD, not GD.

``f(x) = U tanh(Wx)`` autoencodes ``y = x + ε``, ``x ~ N(0, I_40)``, ``Var ε_1 = 5``,
``Var ε_i = 1`` otherwise (paper §5.4). SGD and GD start from the same init. Thm 5.2 at the
global minimum (eq. 14) predicts ``WΣ̄_xWᵀ = UᵀΣ̄_εU`` (Σ̄ = Σ / Tr Σ) for a linear net; the
tanh net has the symmetry only approximately. Shared machinery: ``_nonlinear``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from noetherflow.experiments._base import Claim, Op
from noetherflow.experiments._claims import over_seeds
from noetherflow.experiments._nonlinear import NonlinearConfig, run_nonlinear
from noetherflow.experiments._nonlinear_plot import heatmaps

DESCRIPTION = "Two-layer tanh autoencoder: SGD's WΣ̄_xWᵀ matches UᵀΣ̄_εU (Thm 5.2), GD's does not."

PAPER = (
    "Fig. 6 (§5.4): the latent representations of a two-layer tanh net trained with SGD "
    "agree with Thm 5.2, WΣ̄_xWᵀ ≈ UᵀΣ̄_εU (x ∈ R⁴⁰ isotropic, Var ε_1 = 5, 10⁴ iterations), "
    "while under GD from the same init they are dissimilar."
)
PAPER_ORDER = 6.0


@dataclass(frozen=True)
class Config(NonlinearConfig):
    """Settings of the Fig. 6 experiment (paper §5.4; App. A.4 gives no further detail).

    The paper fixes the data (n = 40, ``Var ε_1 = 5``), the activation and the 10⁴
    iterations of SGD or GD from the same init; everything else is ours. Not all of it was
    fixed before looking at the claim: the width, the schedule and the GD variant were
    changed after measuring (the record is in ``NOTES`` and below).

    - Loss ``‖U tanh(Wx) − y‖²`` (sum over outputs, minibatch mean; eq. 12), no biases, no
      weight decay. Training in float32, evaluation in float64 (see ``_nonlinear``).
    - ``hidden=200`` (5n). The claim rests on the rotation symmetry of the *linear* net,
      which tanh breaks by its curvature; at width H each unit carries ‖w_j‖² ≈ n/H, so a
      wide layer keeps the pre-activations in tanh's near-linear range. Tried first: H = 40
      (= n), where the curvature wins (W shrinks, U grows): relative difference 1.3–1.6.
    - ``init_scale=1``: fan-in normal ``W ~ N(0, 1/n)``, ``U ~ N(0, 1/H)``, the same for SGD
      and GD: ``WWᵀ`` and ``UᵀU`` of independent random matrices differ strongly, which GD
      keeps (it conserves ``WWᵀ − UᵀU`` up to tanh's curvature) and SGD forgets.
    - SGD: fresh minibatches of ``batch_size=16``, ``lr=0.02`` for the first half, then a
      geometric decay to ``lr_final=0.002``. ``steps=10000`` as in the paper. Tried: a
      constant η (the paper's protocol): 0.45–0.47 (now claimed, ``sgd_similar_constant_lr``);
      a 30k-step schedule decaying to 5e-4: 0.41–0.44 (training longer moves *away* from
      the relation: tanh's curvature takes over).
    - GD: *deterministic* gradient descent on the same population risk, ``gd_lr=0.02``
      (SGD's), ``gd_steps=10000``. The label noise integrates out of the population
      gradient exactly; the expectation over x is a fixed whitened quadrature of
      ``gd_points=512`` inputs (exact for the linear part of the net). Its quadrature loss
      against the held-out loss is recorded (``gd_fit_gap``); see ``_nonlinear`` for why
      not a fixed noisy training set.
    - Compared are the paper's matrices (eq. 14) with the population Σ̄'s (``I/40`` and
      ``diag(5, 1, …)/44``); the relative difference is ``‖A − B‖_F / (½(‖A‖_F + ‖B‖_F))``.
      The gradient-noise matrices of ``_nonlinear`` are recorded too (series, not claimed).
      Heat maps show the first 40 hidden units (the full 200 × 200 matrices enter the
      numbers).
    """

    activations: tuple[str, ...] = ("tanh",)
    constant_seeds: int = 3
    n_seeds: int = 3

    @classmethod
    def quick(cls) -> Config:
        """Same net; 5000 SGD steps (decay over the last half); 1500 GD steps on 256 points."""
        return cls(steps=5000, gd_steps=1500, gd_points=256, n_eval=4000, n_records=50)


def setup(cfg: Config) -> list[dict[str, str]]:
    """Deviations from the paper's setup (§5.4, Fig. 6), one row each."""
    full = Config()
    rows = [
        {
            "quantity": "hidden width",
            "paper": "not stated",
            "ours": f"{cfg.hidden}",
            "why": (
                "tanh's curvature breaks the symmetry less in a wide layer (H = 40 gave 1.3–1.6)"
            ),
        },
        {
            "quantity": "η, schedule",
            "paper": "not stated (constant)",
            "ours": f"{cfg.lr:g} constant (paper's protocol claim, {cfg.constant_seeds} seeds); "
            f"annealed run: geometric decay to {cfg.lr_final:g} over the last "
            f"{cfg.decay_frac:.0%}",
            "why": "chosen after measuring 0.45–0.47 at constant η (annealed claim labelled)",
        },
        {
            "quantity": "S",
            "paper": "not stated",
            "ours": f"{cfg.batch_size}, fresh samples",
            "why": "online SGD on the data model",
        },
        {
            "quantity": "GD",
            "paper": "GD, 10⁴ iterations",
            "ours": f"deterministic GD on a {cfg.gd_points}-point whitened quadrature of the "
            f"population risk, η = {cfg.gd_lr:g}, {cfg.gd_steps} steps",
            "why": "full-batch GD on a fixed noisy set memorises it at this width",
        },
        {
            "quantity": "loss",
            "paper": "eq. 12",
            "ours": "‖U tanh(Wx) − y‖², minibatch mean, no biases, no weight decay",
            "why": "-",
        },
        {
            "quantity": "init",
            "paper": "the same init for SGD and GD",
            "ours": f"fan-in normal × {cfg.init_scale:g}",
            "why": "-",
        },
        {
            "quantity": "precision",
            "paper": "-",
            "ours": "training float32, evaluation float64",
            "why": "2.6× faster; round-off far below the effects",
        },
        {
            "quantity": "seeds",
            "paper": "one run",
            "ours": f"annealed SGD and GD: {cfg.n_seeds} seeds; constant η: {cfg.constant_seeds} "
            "seeds",
            "why": "claims: mean over seeds; spread in the notes",
        },
    ]
    if cfg != full:
        rows.append(
            {
                "quantity": "quick mode",
                "paper": "-",
                "ours": f"{cfg.steps} SGD steps, {cfg.gd_steps} GD steps on "
                f"{cfg.gd_points} points, {cfg.n_eval} evaluation samples",
                "why": "time; the quick annealed claim fails (0.314, 3 seeds)",
            }
        )
    return rows


def run(cfg: Config, seed: int, out_dir: Path) -> dict[str, Any]:
    """SGD and GD from the same inits (``n_seeds``); Thm 5.2's hidden matrices at the end."""
    res = run_nonlinear(cfg, seed, "fig6")
    act = cfg.activations[0]
    sgd = np.asarray(res["series"][f"sgd_{act}"]["rel_diff_sigma_seeds"])
    gd = np.asarray(res["series"][f"gd_{act}"]["rel_diff_sigma_seeds"])
    res["sgd_rel_diff"] = sgd
    res["gd_rel_diff"] = gd
    res["gd_over_sgd"] = gd / sgd
    res["gd_fit_gap"] = res["series"][f"gd_{act}"]["gd_fit_gap"]
    res["any_diverged"] = any(s["diverged"] for s in res["series"].values())
    res["constant_rel_diff"] = res["constant"]["by_activation"][act]["rel_diff_sigma"]
    return res


def claims(results: dict[str, Any], cfg: Config) -> list[Claim]:
    div = "; SGD or GD diverged" if results["any_diverged"] else ""
    const = over_seeds(results["constant_rel_diff"])
    sgd = over_seeds(results["sgd_rel_diff"])
    ratio, gd = over_seeds(results["gd_over_sgd"]), over_seeds(results["gd_rel_diff"])
    window = results["constant"]["window_steps"]
    return [
        Claim(
            id="sgd_similar_constant_lr",
            statement="The paper's protocol (constant η): under SGD the tanh net's WΣ̄_xWᵀ ≈ "
            "UᵀΣ̄_εU (Thm 5.2, eq. 14): relative Frobenius difference, time-averaged over the "
            "stationary window, mean over seeds",
            value=const.mean,
            op=Op.LT,
            threshold=0.3,
            note=f"{const.note()}; η = {cfg.lr:g} constant; averaged at steps {window}"
            + ("; a constant-η run diverged" if results["constant"]["diverged"] else ""),
            why=f"eq. 14 is exact only for a linear net and tanh breaks the rotation symmetry; at "
            f"constant η = {cfg.lr:g} the difference is {const.mean:.3g}, annealed "
            f"{sgd.mean:.3g} (GD {gd.mean:.3g})",
        ),
        Claim(
            id="sgd_similar",
            statement="Annealed η (ours, not the paper's protocol): under SGD the tanh net's "
            "WΣ̄_xWᵀ ≈ UᵀΣ̄_εU (Thm 5.2, eq. 14): relative Frobenius difference ‖A − B‖_F / "
            "(½(‖A‖_F + ‖B‖_F)), mean over seeds",
            value=sgd.mean,
            op=Op.LT,
            threshold=0.3,
            note=sgd.note() + div,
            why=f"eq. 14 is exact only for a linear net; tanh's curvature breaks the rotation "
            f"symmetry (at width 40 the difference was 1.3–1.6, at width {cfg.hidden} it is "
            f"{sgd.mean:.3g}; GD {gd.mean:.3g})",
        ),
        Claim(
            id="gd_dissimilar",
            statement="Under GD from the same init the two matrices are dissimilar: GD's "
            "relative difference / SGD's (per seed; value: mean over seeds)",
            value=ratio.mean,
            op=Op.GE,
            threshold=3.0,
            note=f"{ratio.note()}; GD's relative difference {gd.note()}; GD's held-out loss "
            f"exceeds its quadrature loss by {results['gd_fit_gap']:.3g} (seed 0; noise floor "
            f"{results['noise_floor']:.3g})",
        ),
    ]


def plot(results: dict[str, Any], cfg: Config, out_dir: Path) -> list[Path]:
    return [heatmaps(results, cfg.activations, "sigma", ("sgd", "gd"), out_dir / "fig6.png")]

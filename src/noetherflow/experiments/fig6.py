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

from noetherflow.experiments._base import Claim, Op
from noetherflow.experiments._nonlinear import NonlinearConfig, heatmaps, run_nonlinear

DESCRIPTION = "Two-layer tanh autoencoder: SGD's WΣ̄_xWᵀ matches UᵀΣ̄_εU (Thm 5.2), GD's does not."


@dataclass(frozen=True)
class Config(NonlinearConfig):
    """Settings of the Fig. 6 experiment (paper §5.4; App. A.4 gives no further detail).

    The paper fixes the data (n = 40, ``Var ε_1 = 5``), the activation and the 10⁴
    iterations; everything else is ours:

    - Loss ``‖U tanh(Wx) − y‖²`` (sum over outputs, minibatch mean; eq. 12), no biases, no
      weight decay, float64.
    - ``hidden=200`` (5n). The claim rests on the rotation symmetry of the *linear* net,
      which tanh breaks by its curvature; at width H each unit carries ‖w_j‖² ≈ n/H, so a
      wide layer keeps the pre-activations in tanh's near-linear range. Measured with these
      settings at H = 40 the curvature wins (W shrinks, U grows; rel. difference 1.3).
    - ``init_scale=1``: fan-in normal ``W ~ N(0, 1/n)``, ``U ~ N(0, 1/H)``, the same for SGD
      and GD: ``WWᵀ`` and ``UᵀU`` of independent random matrices differ strongly, which GD
      keeps (it conserves the charges) and SGD forgets.
    - SGD: fresh minibatches of ``batch_size=16``, ``lr=0.02`` for the first half, then a
      geometric decay to ``lr_final=0.002`` (the constant-η fluctuation floor of the matrices
      is ~0.45; a longer decay lets the tanh curvature take over again: 0.44 with a 30k-step
      schedule decaying to 5e-4). ``steps=10000`` as in the paper.
    - GD: the population-gradient (large-batch) limit, ``gd_batch=256`` fresh samples per
      step (16× less gradient noise than SGD), ``gd_lr=0.02``, ``gd_steps=10000``; see
      ``_nonlinear`` for why not a fixed training set, and for the residual noise-driven
      drift this leaves over 10⁴ steps (it lowers GD's difference).
    - Σ̄'s are the population ones (``I/40`` and ``diag(5, 1, …)/44``); the relative
      difference is ``‖A − B‖_F / (½(‖A‖_F + ‖B‖_F))``. Heat maps show the first 40 hidden
      units (the full 200 × 200 matrices enter the numbers).
    """

    activations: tuple[str, ...] = ("tanh",)

    @classmethod
    def quick(cls) -> Config:
        """Same net; 5000 SGD steps (decay over the last half), 600 GD steps of 128 samples."""
        return cls(steps=5000, gd_steps=600, gd_batch=128, n_eval=4000, n_records=50)


def run(cfg: Config, seed: int, out_dir: Path) -> dict[str, Any]:
    """SGD and GD from the same init; Thm 5.2's hidden matrices at the end."""
    res = run_nonlinear(cfg, seed, "fig6")
    act = cfg.activations[0]
    sgd = res["series"][f"sgd_{act}"]["rel_diff_sigma"]
    gd = res["series"][f"gd_{act}"]["rel_diff_sigma"]
    res["sgd_rel_diff"] = sgd
    res["gd_rel_diff"] = gd
    res["gd_over_sgd"] = gd / sgd
    res["any_diverged"] = any(s["diverged"] for s in res["series"].values())
    return res


def claims(results: dict[str, Any], cfg: Config) -> list[Claim]:
    div = "SGD or GD diverged" if results["any_diverged"] else ""
    return [
        Claim(
            id="sgd_similar",
            statement="Under SGD the tanh net's WΣ̄_xWᵀ ≈ UᵀΣ̄_εU (Thm 5.2, eq. 14): relative "
            "Frobenius difference ‖A − B‖_F / (½(‖A‖_F + ‖B‖_F))",
            value=results["sgd_rel_diff"],
            op=Op.LT,
            threshold=0.3,
            note=div,
        ),
        Claim(
            id="gd_dissimilar",
            statement="Under GD from the same init the two matrices are dissimilar: GD's "
            "relative difference / SGD's",
            value=results["gd_over_sgd"],
            op=Op.GE,
            threshold=3.0,
            note=f"GD's relative difference {results['gd_rel_diff']:.3g}",
        ),
    ]


def plot(results: dict[str, Any], cfg: Config, out_dir: Path) -> list[Path]:
    return [heatmaps(results, cfg.activations, "sigma", ("sgd", "gd"), out_dir / "fig6.png")]

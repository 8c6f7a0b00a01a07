"""Theorem 4.3 (continuous time): the flow of a charge along its symmetry orbit.

For each of three one-generator symmetries on real ``nn.Module``\\ s (a ReLU neuron's
rescaling, scale invariance before a LayerNorm, a one-parameter subgroup of a double
rotation; :mod:`noetherflow.experiments._orbit`) and each weight decay γ ≥ 0, the model is
moved along its orbit ``θ_λ = e^{λA}θ`` on a grid of λ; at every point the library collects
statistics (``nf.collect_stats``) and reports the SGF flow ``G = −4γC + (η/S)Tr[ΣA]``
(``nf.noether_flow``, time="continuous") and the charge (``nf.charges``). Claims: part 1
(``G`` strictly decreasing, ``C`` strictly increasing), parts 2–3 (exactly one zero, or
``λ* = ±∞`` when one side of ``G`` has no terms: scale invariance with γ = 0), agreement of
``nf.solve_equilibrium`` with the zero, and part 4 (``λ*(θ)`` differentiable: finite
differences of the solver's ``λ*`` against the implicit-function theorem). Everything is
cross-checked against an independent closed form (per-sample gradients at θ transported along
the orbit, paper eqs. 102–108).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from noetherflow.experiments import _orbit
from noetherflow.experiments._base import Claim

DESCRIPTION = (
    "Thm 4.3: along a symmetry orbit the SGF charge flow is strictly decreasing with one zero "
    "(or λ* = ±∞), found by nf.solve_equilibrium; λ*(θ) is differentiable."
)
PAPER = (
    "Theorem 4.3 (§4.3): for any θ and γ ≥ 0, G(θ_λ) (eq. 7) and −C(θ_λ) are monotonically "
    "decreasing in λ; there is a λ* ∈ ℝ ∪ {±∞} with G(θ_λ*) = 0; if G ≠ 0 it is unique and G "
    "strictly monotonic; if Σ(θ) is differentiable, λ*(θ) is differentiable."
)
PAPER_ORDER = 4.3


@dataclass(frozen=True)
class Config:
    """Settings of ``thm43``. The theorem has no experimental setting; these are ours.

    - Problems (:func:`noetherflow.experiments._orbit.make_problem`): ``n = 128`` samples,
      ``x ~ N(0, I_5)``, ``y = tanh(xV) + 0.5ε`` (3 outputs), hidden width 3, float64, per-sample
      loss ``‖f(x) − y‖²`` (sum over outputs), batch loss the mean. B of the rotation has
      eigenvalues (1, 0.4, −0.7) (several magnitudes, both signs).
    - SGF with ``η = lr = 0.05``, ``S = batch_size = 8`` (σ² = η/(2S)); the continuous flow is
      ``−4γC + (η/S)Tr[ΣA]`` (our correction of eq. 7's σ², docs/concepts/flow.md).
    - ``weight_decays = (0, 0.01)``: γ = 0 gives λ* = +∞ for scale invariance (all of A's
      eigenvalues are positive), finite λ* elsewhere.
    - Grid: ``n_grid`` values of λ in [−4, 4] (charges over ``e^{±8}``); three problem seeds.
    """

    n: int = 128
    d_x: int = 5
    hidden: int = 3
    d_y: int = 3
    lr: float = 0.05
    batch_size: int = 8
    weight_decays: tuple[float, ...] = (0.0, 0.01)
    grid_lo: float = -4.0
    grid_hi: float = 4.0
    n_grid: int = 33
    n_seeds: int = 3
    fd_h: float = 1e-5

    @classmethod
    def quick(cls) -> Config:
        """A coarser λ grid (9 points), same problems, seeds and cases."""
        return cls(n_grid=9)


def cases(cfg: Config) -> list[_orbit.Case]:
    return [("continuous", cfg.batch_size, g) for g in cfg.weight_decays]


def run_orbits(cfg: Any, seed: int, case_list: list[_orbit.Case]) -> list[dict[str, Any]]:
    """Every family × problem seed × case; one record per case (see ``_orbit.run_family``)."""
    grid = np.linspace(cfg.grid_lo, cfg.grid_hi, cfg.n_grid)
    out: list[dict[str, Any]] = []
    for i in range(cfg.n_seeds):
        for fam in _orbit.FAMILIES:
            prob = _orbit.make_problem(
                fam, seed + i, n=cfg.n, d_x=cfg.d_x, h=cfg.hidden, d_y=cfg.d_y
            )
            verified = prob.syms.verify(
                prob.model, prob.X, loss_fn=_orbit.loss_fn, targets=prob.Y, strict=True
            )
            recs = _orbit.run_family(
                prob, case_list, lr=cfg.lr, grid=grid, fd_h=cfg.fd_h, seed=seed + i
            )
            for r in recs:
                r["verified_rel_change"] = max(v.rel_change for v in verified)
            out.extend(recs)
    return out


def run(cfg: Config, seed: int, out_dir: Path) -> dict[str, Any]:
    recs = run_orbits(cfg, seed, cases(cfg))
    return {"records": recs, "series": {"records": recs}}


def setup(cfg: Config) -> list[dict[str, str]]:
    rows = [
        {
            "quantity": "model and data",
            "paper": "any model with an exponential symmetry",
            "ours": f"three float64 models (ReLU MLP, LayerNorm net, linear net), {cfg.n} "
            f"Gaussian samples, width {cfg.hidden}",
            "why": "a theorem: small models make an exact closed-form check possible",
        },
        {
            "quantity": "noise term",
            "paper": "σ²Tr[ΣA] (eq. 7)",
            "ours": "(η/S)Tr[ΣA] = 2σ²Tr[ΣA]",
            "why": "Itô's lemma on eq. 1 (docs/concepts/flow.md)",
        },
        {
            "quantity": "η, S, γ",
            "paper": "any, γ ≥ 0",
            "ours": f"η = {cfg.lr}, S = {cfg.batch_size}, γ ∈ {list(cfg.weight_decays)}",
            "why": "γ = 0 covers λ* = ±∞, γ > 0 a finite zero",
        },
        {
            "quantity": "orbit",
            "paper": "λ ∈ ℝ",
            "ours": f"{cfg.n_grid} points in [{cfg.grid_lo}, {cfg.grid_hi}]; zeros by bracketing",
            "why": "a grid; the closed form checks the whole line",
        },
        {
            "quantity": "seeds",
            "paper": "—",
            "ours": f"{cfg.n_seeds} problem seeds",
            "why": "different data, initialisation and B",
        },
    ]
    if cfg.n_grid != Config().n_grid:
        rows.append(
            {
                "quantity": "quick mode",
                "paper": "—",
                "ours": f"{cfg.n_grid} grid points (full: {Config().n_grid})",
                "why": "time",
            }
        )
    return rows


def claims(results: dict[str, Any], cfg: Config) -> list[Claim]:
    return _orbit.orbit_claims(results["records"], "SGF, γ ≥ 0")


def plot(results: dict[str, Any], cfg: Config, out_dir: Path) -> list[Path]:
    title = f"Thm 4.3: SGF flow along the orbit (η = {cfg.lr}, S = {cfg.batch_size})"
    return [_orbit.plot_orbits(results["records"], out_dir / "thm43.png", title)]

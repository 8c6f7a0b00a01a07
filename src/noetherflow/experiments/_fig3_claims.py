"""Claims of the Fig. 3 experiment (kept apart from its runs): each statistic is computed
per seed (the single-seed definition), the claim's value is its mean over the seeds."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from noetherflow.experiments._claims import Claim, Op, over_seeds


def _max_rel_dev(a: Any, b: Any) -> float:
    dev = np.abs(np.asarray(a, dtype=float) / np.asarray(b, dtype=float) - 1.0)
    return float(np.max(dev)) if not np.isnan(dev).any() else math.nan


def _at(series: dict[str, Any], key: str, phi: float) -> float:
    phis = np.asarray(series["phi_x"], dtype=float)
    i = int(np.argmin(np.abs(phis - phi)))
    if abs(phis[i] - phi) > 1e-9:
        return math.nan
    return float(np.asarray(series[key], dtype=float)[i])


def seed_view(series: dict[str, Any], j: int) -> dict[str, Any]:
    """``series`` with every per-seed key (``<key>_seeds``) replaced by seed ``j``'s row."""
    out = dict(series)
    for k, v in series.items():
        if k.endswith("_seeds"):
            out[k[: -len("_seeds")]] = np.asarray(v, dtype=float)[j]
    return out


def _per_seed(results: dict[str, Any], stat: Callable[[dict[str, Any]], float]) -> list[float]:
    s = results["series"]
    return [stat(seed_view(s, j)) for j in range(int(s.get("seed_count", 1)))]


def _flat_sharp_summary(s: dict[str, Any], margin: float = 0.01) -> str:
    """Where SGD ends sharper / flatter than GD + WD (beyond ``margin``, relative)."""
    phis = np.asarray(s["phi_x"], dtype=float)
    meas = np.asarray(s["sharpness_ratio"], dtype=float)
    theo = np.asarray(s["theory_sharpness_ratio"], dtype=float)
    pairs = ", ".join(
        f"φ={p:g}: {m:.3f} (theory {t:.3f})" for p, m, t in zip(phis, meas, theo, strict=True)
    )

    def fmt(mask: np.ndarray) -> str:
        return "{" + ", ".join(f"{p:g}" for p in phis[mask]) + "}"

    sharper, flatter = meas > 1.0 + margin, meas < 1.0 - margin
    same = ~(sharper | flatter)
    return (
        f"S_SGD/S_GD+WD (mean over seeds): {pairs}. SGD flatter (by > {margin:.0%}) at φ_x ∈ "
        f"{fmt(flatter)}, sharper at φ_x ∈ {fmt(sharper)}, equal within {margin:.0%} at φ_x ∈ "
        f"{fmt(same)}; theory (γ → 0): (√φ_x + √(2 − φ_x))/2 ≤ 1, i.e. never sharper in this "
        "setting."
    )


def _aniso(s: dict[str, Any]) -> np.ndarray:
    return np.abs(np.asarray(s["phi_x"], dtype=float) - 1.0) > 0.25


def _label_sharper(s: dict[str, Any]) -> np.ndarray:
    meas = np.asarray(s["label_noise_sgd_sharpness"], dtype=float)
    return meas / np.asarray(s["label_noise_balanced_sharpness"], dtype=float)


def fig3_claims(results: dict[str, Any], cfg: Any) -> list[Claim]:
    """The paper's protocol claims first, then the annealed ones."""
    return _paper_protocol_claims(results, cfg) + _annealed_claims(results, cfg)


def _paper_protocol_claims(results: dict[str, Any], cfg: Any) -> list[Claim]:
    s = results["series"]
    phis = np.asarray(s["phi_x"], dtype=float)
    aniso = _aniso(s)

    def gap(v: dict[str, Any]) -> float:
        return _max_rel_dev(v["constant_norm_ratio"], v["theory_norm_ratio"])

    def gap_half(v: dict[str, Any]) -> float:
        return _max_rel_dev(v["constant_half_norm_ratio"], v["theory_norm_ratio"])

    def shrink(v: dict[str, Any]) -> float:
        g = gap(v)
        return gap_half(v) / g if g > 0 else math.nan

    def sharper(v: dict[str, Any]) -> float:
        return float(np.min(_label_sharper(v)[aniso])) if aniso.any() else math.nan

    def label_dev(v: dict[str, Any]) -> float:
        return _max_rel_dev(v["label_noise_sgd_sharpness"], v["label_noise_theory_sharpness"])

    def ratio_dev(v: dict[str, Any]) -> float:
        return _max_rel_dev(v["label_noise_sgd_norm_ratio"], v["label_noise_theory_norm_ratio"])

    g, gh, sh = (over_seeds(_per_seed(results, f)) for f in (gap, gap_half, shrink))
    sp, ld, rd = (over_seeds(_per_seed(results, f)) for f in (sharper, label_dev, ratio_dev))
    theo = np.asarray(s["label_noise_theory_sharpness"], dtype=float) / np.asarray(
        s["label_noise_balanced_sharpness"], dtype=float
    )
    pairs = ", ".join(
        f"φ_ε={p:g}: {m:.3f} (theory {t:.3f})"
        for p, m, t in zip(phis, _label_sharper(s), theo, strict=True)
    )
    div = any(d["diverged"] for v in results["variant_divergence"].values() for d in v)
    dnote = "; a run diverged" if div else ""
    return [
        Claim(
            id="sgd_norm_ratio_theory_constant_lr",
            statement="The paper's protocol (constant η): SGD's ‖W‖_F²/‖U‖_F², time-averaged "
            "over the stationary window, is within 10% of Thm 5.2 at every φ_x (max over φ_x of "
            "|measured/theory − 1| per seed; value: mean over seeds)",
            value=g.mean,
            op=Op.LT,
            threshold=0.1,
            note=f"{g.note()}; η = {cfg.lr:g} constant, {cfg.steps} steps, window after "
            f"{cfg.burn_in_frac:.0%}; {len(phis)} values of φ_x" + dnote,
            why=f"a finite-η bias, as Fig. 3's caption says: the error is {g.mean:.1%} at "
            f"η = {cfg.lr:g} and {gh.mean:.1%} at η/2 (ratio {sh.mean:.2f}, an O(η) bias)",
        ),
        Claim(
            id="gap_shrinks_with_lr_constant",
            statement="Fig. 3's caption: the systematic error between experiment and theory "
            "decreases as η decreases (constant η): error at η/2 (4× the steps) / error at η, "
            "error = max over φ_x of |‖W‖²/‖U‖² / Thm 5.2 − 1| (per seed; value: mean over "
            "seeds)",
            value=sh.mean,
            op=Op.LT,
            threshold=1.0,
            note=f"{sh.note()}; error at η = {cfg.lr:g}: {g.note()}; at η = {cfg.lr / 2:g}: "
            f"{gh.note()}" + dnote,
        ),
        Claim(
            id="label_noise_sgd_sharper",
            statement="With isotropic inputs and anisotropic label noise SGD ends sharper than "
            "the balanced (weight-decay) solution: min over φ_ε with |φ_ε − 1| > 0.25 of "
            "measured Tr ∇²L(SGD) / Tr ∇²L(balanced, closed form) (per seed; value: mean over "
            "seeds)",
            value=sp.mean,
            op=Op.GT,
            threshold=1.0,
            note=f"{sp.note('.4g')}; S_SGD/S_balanced (mean over seeds): {pairs}; annealed η "
            "as the main runs" + dnote,
        ),
        Claim(
            id="label_noise_sharpness_theory",
            statement="With anisotropic label noise, SGD's Tr ∇²L is within 10% of Prop. 5.3 "
            "at the Thm 5.2 solution at every φ_ε (max |measured/theory − 1| per seed; value: "
            "mean over seeds)",
            value=ld.mean,
            op=Op.LT,
            threshold=0.1,
            note=f"{ld.note()}; ‖W‖²/‖U‖²: max |measured/theory − 1| {rd.note()}" + dnote,
        ),
    ]


def _annealed_claims(results: dict[str, Any], cfg: Any) -> list[Claim]:
    s = results["series"]
    phis = np.asarray(s["phi_x"], dtype=float)
    lo, hi = float(phis.min()), float(phis.max())

    def dev_sgd(v: dict[str, Any]) -> float:
        return _max_rel_dev(v["sgd_norm_ratio"], v["theory_norm_ratio"])

    def dev_sgdwd(v: dict[str, Any]) -> float:
        return _max_rel_dev(v["sgdwd_norm_ratio"], v["theory_sgdwd_norm_ratio"])

    def ends(v: dict[str, Any]) -> float:
        return min(abs(_at(v, "sgd_norm_ratio", lo) - 1.0), abs(_at(v, "sgd_norm_ratio", hi) - 1.0))

    def iso(v: dict[str, Any]) -> float:
        return abs(_at(v, "sgd_norm_ratio", 1.0) - 1.0)

    def gd_dev(v: dict[str, Any]) -> float:
        return float(np.max(np.abs(np.asarray(v["gdwd_norm_ratio"], dtype=float) - 1.0)))

    def sh_sgd(v: dict[str, Any]) -> float:
        return _max_rel_dev(v["sgd_sharpness"], v["theory_sharpness"])

    def sh_sgdwd(v: dict[str, Any]) -> float:
        return _max_rel_dev(v["sgdwd_sharpness"], v["theory_sgdwd_sharpness"])

    def both(f: Callable[[dict[str, Any]], float], g: Callable[[dict[str, Any]], float]) -> Any:
        pairs = zip(_per_seed(results, f), _per_seed(results, g), strict=True)
        return over_seeds([max(a, b) for a, b in pairs])

    ratio, sharp = both(dev_sgd, dev_sgdwd), both(sh_sgd, sh_sgdwd)
    d_sgd, d_wd = (over_seeds(_per_seed(results, f)) for f in (dev_sgd, dev_sgdwd))
    s_sgd, s_wd = (over_seeds(_per_seed(results, f)) for f in (sh_sgd, sh_sgdwd))
    e, i0, gd = (over_seeds(_per_seed(results, f)) for f in (ends, iso, gd_dev))
    balanced = [a < 0.05 and b > 0.1 for a, b in zip(i0.values, e.values, strict=True)]
    init = results["init_norm_sq"]
    return [
        Claim(
            id="sgd_norm_ratio_theory",
            statement="Annealed η (ours, not the paper's protocol): the layer-norm ratio "
            "‖W‖_F²/‖U‖_F² of every SGD run (with and without weight decay 1e-4) is within 10% "
            "of Thm 5.2 (max over runs of |measured/theory − 1| per seed; value: mean over "
            "seeds)",
            value=ratio.mean,
            op=Op.LT,
            threshold=0.1,
            note=f"{ratio.note()}; SGD {d_sgd.note()}, SGD+WD {d_wd.note()} (theory with ridge "
            "γS/η)",
        ),
        Claim(
            id="balanced_only_isotropic",
            statement="SGD's norm ratio is within 5% of 1 at φ_x = 1 and off by more than 10% "
            f"at both ends of the sweep (φ_x = {lo:g} and {hi:g}), for every seed",
            value=all(balanced),
            op=Op.EQ,
            threshold=True,
            note=f"holds for {sum(balanced)} of {len(balanced)} seeds; |ratio − 1| at φ_x = 1: "
            f"{i0.note()}; min over the two ends of |ratio − 1|: {e.note()}; seed-mean ratio "
            f"{_at(s, 'sgd_norm_ratio', lo):.4g} at φ_x = {lo:g}, "
            f"{_at(s, 'sgd_norm_ratio', hi):.4g} at φ_x = {hi:g}",
        ),
        Claim(
            id="gd_wd_balanced",
            statement="GD + weight decay ends balanced at every φ_x (max over φ_x of "
            "|‖W‖_F²/‖U‖_F² − 1| per init; value: mean over the seeds' inits)",
            value=gd.mean,
            op=Op.LT,
            threshold=0.05,
            note=f"{gd.note()}; γ = {cfg.gd_weight_decay:g}, η = {cfg.gd_lr:g}, {cfg.gd_steps} "
            "steps; init ‖W₀‖² = "
            + "/".join(f"{v:.3g}" for v in init["W"])
            + ", ‖U₀‖² = "
            + "/".join(f"{v:.3g}" for v in init["U"]),
        ),
        Claim(
            id="sharpness_theory",
            statement="Annealed η (ours): Tr ∇²L of every converged SGD run (with and without "
            "weight decay) is within 10% of Prop. 5.3 at the Thm 5.2 solution (max "
            "|measured/theory − 1| per seed; value: mean over seeds)",
            value=sharp.mean,
            op=Op.LT,
            threshold=0.1,
            note=f"{sharp.note()}; SGD {s_sgd.note()}, SGD+WD {s_wd.note()}. "
            + _flat_sharp_summary(s),
        ),
    ]

"""Teleport vs warmup on a small CNN with BatchNorm (digits), and the grad-norm teleport.

Same harness and comparison as :mod:`noetherflow.experiments.teleport_mlp` (no warmup,
linear warmup, equilibrium teleport at the start and every k steps), on
``conv(1→c1) → BN → ReLU → conv(c1→c2) → BN → ReLU → maxpool 2 → linear(→10)``, trained by
SGD with weight decay. The convolutions feeding BatchNorm are scale invariant per channel
(in training mode, up to BN's eps), so with weight decay their equilibrium norm is finite
(the closed-form balance of noise and decay, paper §4.2 and eq. 24 with γ > 0); the BN
affine parameters and the next layer form per-channel rescalings. Added: the symmetry
teleportation of Zhao et al. (2022), gradient ascent on ‖∇L‖² over the same group elements
(:func:`~noetherflow.baselines.zhao2022.gradient_norm_teleport`), at the start and every k steps,
in the same harness, so that the two teleports are compared side by side.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from noetherflow.experiments._base import Claim, Op, derive_seed
from noetherflow.experiments._teleport_harness import (
    Stacked,
    digits_split,
    plot_curves,
    run_comparison,
    teleport_claims,
    train_stacked,
)

DESCRIPTION = (
    "CNN + BatchNorm on digits, SGD + weight decay: no warmup, warmup, equilibrium teleport "
    "(start / every k) and Zhao et al.'s grad-norm teleport side by side."
)

PAPER = (
    "§5.3 (warmup): a CNN trained at a fixed large η_max diverges unless the learning rate is "
    "warmed up (ref. 10); the theory says gradient noise drives Kaiming init. to a stabler "
    "status. Not an experiment of the paper: equilibrium teleport as a replacement for warmup, "
    "and Zhao et al.'s (2022) gradient-norm teleport as a baseline."
)
PAPER_ORDER = 4.07  # beside teleport-fig4 (Fig. 4, warmup)
KIND = "beyond"  # every claim is ours (the paper has no such experiment)

METHODS = (
    "none",
    "warmup",
    "teleport_start",
    "teleport_every",
    "gradnorm_start",
    "gradnorm_every",
)


@dataclass(frozen=True)
class Config:
    """Settings of ``teleport-cnn``; the data, split, schedules and criteria are
    ``teleport-mlp``'s (see its Config).

    Choices and why:

    - Model: ``c1 = 8``, ``c2 = 16`` channels, 3×3 convolutions with padding 1 and no bias
      (a bias before BatchNorm is cancelled by it), BatchNorm in training mode with batch
      statistics, ReLU, 2×2 max-pooling, one linear layer; float64. Test metrics use the
      test set's own batch statistics (train-mode BatchNorm on all 497 test images) rather
      than running averages: a teleport rescales the channels feeding BatchNorm, which
      leaves train-mode BatchNorm invariant but not running statistics (they would lag
      until re-estimated; the tool does not transform BatchNorm buffers).
    - SGD with ``weight_decay = 1e-3`` (torch's coupled L2: γ = 5e-4 in the paper's
      convention), batch size 32, no momentum.
    - Equilibrium teleport: statistics by the micro-batch estimator (BatchNorm couples the
      samples of a batch, so per-sample gradients are undefined; micro-batches of
      ``micro_batch_size = 8`` samples, ``teleport_batch = 512``: 64 micro-batches, quick 256:
      32), all symmetries ``nf.find_symmetries`` verifies, solved jointly. Enough statistics:
      ``microbatch_stats_sufficient`` solves at each seed's initialisation on
      ``stats_check_batches`` independent teleport batches and compares the solutions.
    - Grad-norm teleport (Zhao et al., 2022): ``gradnorm_steps = 20`` normalised ascent steps
      of size ``gradnorm_step_size = 0.1`` in λ on the same batch and the same diagonal
      symmetries (each generator moves by at most 2: ‖∇L‖² of a scale-invariant layer grows
      without bound as its norm shrinks, and Zhao et al. also take a few steps only), on its
      own batch of ``gradnorm_batch = 64`` training images (each ascent step is a double
      backward pass). Its job is to raise ‖∇L‖²; ``gradnorm_gain`` reports by how much.
    - Claims as for ``teleport-mlp``, for both equilibrium teleports; the grad-norm
      teleport is a baseline and gets no claim of its own, but its numbers sit next to the
      others in the results, the claims' notes and the figure.
    """

    c1: int = 8
    c2: int = 16
    batch_size: int = 32
    n_steps: int = 300
    warmup_steps: int = 75
    teleport_every: int = 75
    teleport_batch: int = 512
    micro_batch_size: int = 8
    lrs: tuple[float, ...] = (0.5, 0.71, 1.0, 1.41)
    n_seeds: int = 3
    n_test: int = 497
    eval_every: int = 50
    diverge_factor: float = 10.0
    train_frac: float = 0.5
    weight_decay: float = 1e-3
    gradnorm_steps: int = 20
    gradnorm_step_size: float = 0.1
    gradnorm_batch: int = 64
    stats_check_batches: int = 2

    @classmethod
    def quick(cls) -> Config:
        """Fewer steps, two learning rates, narrower (3 seeds)."""
        return cls(
            n_steps=100,
            warmup_steps=40,
            teleport_every=50,
            eval_every=25,
            lrs=(0.5, 1.0),
            c1=4,
            c2=8,
            teleport_batch=256,
        )


def build_cnn(c1: int, c2: int) -> Any:
    import torch
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, c1, 3, padding=1, bias=False),
        nn.BatchNorm2d(c1),
        nn.ReLU(),
        nn.Conv2d(c1, c2, 3, padding=1, bias=False),
        nn.BatchNorm2d(c2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(c2 * 16, 10),
    ).to(torch.float64)


class StackedCNN(Stacked):
    """:func:`build_cnn` over a run axis: grouped convolutions, per-run BatchNorm channels."""

    def __init__(self, n_runs: int, c1: int, c2: int) -> None:
        import torch

        self.c1, self.c2, self.n_runs = c1, c2, n_runs
        self.params = [
            torch.zeros(n_runs, *p.shape, dtype=torch.float64, requires_grad=True)
            for p in self.template().parameters()
        ]

    def template(self) -> Any:
        return build_cnn(self.c1, self.c2)

    def forward(self, x: Any) -> Any:
        import torch
        import torch.nn.functional as F

        w1, g1, b1, w2, g2, b2, wf, bf = self.params
        R, B = x.shape[0], x.shape[1]
        h = x.transpose(0, 1).reshape(B, R * x.shape[2], *x.shape[3:])  # [B, R·C, H, W]
        h = F.conv2d(h, w1.flatten(0, 1), padding=1, groups=R)
        h = F.batch_norm(h, None, None, g1.flatten(), b1.flatten(), training=True)
        h = F.conv2d(torch.relu(h), w2.flatten(0, 1), padding=1, groups=R)
        h = F.batch_norm(h, None, None, g2.flatten(), b2.flatten(), training=True)
        h = F.max_pool2d(torch.relu(h), 2)  # [B, R·c2, 4, 4]
        h = h.reshape(B, R, -1).transpose(0, 1)  # [R, B, c2·16]
        return torch.baddbmm(bf[:, None, :], h, wf.transpose(1, 2))


def _run_method(method: str, cfg: Config, seeds: Sequence[int]) -> list[dict[str, Any]]:
    stacked = StackedCNN(len(cfg.lrs) * len(seeds), cfg.c1, cfg.c2)
    return train_stacked(
        method,
        cfg.lrs,
        seeds,
        cfg=cfg,
        stacked=stacked,
        shape=(1, 8, 8),
        estimator="microbatch",
        micro_batch_size=cfg.micro_batch_size,
        gradnorm_steps=cfg.gradnorm_steps,
        gradnorm_step_size=cfg.gradnorm_step_size,
    )


def stats_check(cfg: Config, seeds: Sequence[int]) -> dict[str, Any]:
    """Micro-batch statistics at each seed's initialisation from ``stats_check_batches``
    independent teleport batches: the solved λ's spread relative to their size."""
    import torch
    import torch.nn.functional as F

    import noetherflow as nf

    spreads = []
    for s in seeds:
        x, y, _, _ = digits_split(s, cfg.n_test)
        x = x.reshape(-1, 1, 8, 8)
        torch.manual_seed(derive_seed(s, "init"))
        model = build_cnn(cfg.c1, cfg.c2)
        syms = nf.find_symmetries(model, x[:16])
        gen = torch.Generator().manual_seed(derive_seed(s, "stats-check"))
        lams = []
        for _ in range(cfg.stats_check_batches):
            idx = torch.randint(0, len(x), (cfg.teleport_batch,), generator=gen)
            st = nf.collect_stats(
                model,
                syms,
                F.cross_entropy,
                x[idx],
                y[idx],
                estimator="microbatch",
                micro_batch_size=cfg.micro_batch_size,
            )
            sol = nf.solve_equilibrium(
                syms,
                st,
                lr=max(cfg.lrs),
                batch_size=cfg.batch_size,
                weight_decay=cfg.weight_decay / 2,
                time="discrete",
            )
            lams.append(torch.cat([torch.as_tensor(v).reshape(-1) for v in sol.elements.values()]))
        size = float(max(v.abs().max() for v in lams))
        spread = max(float((a - b).abs().max()) for a in lams for b in lams)
        spreads.append(spread / size if size > 0 else math.inf)
    return {"rel_spread": spreads, "n_micro_batches": cfg.teleport_batch // cfg.micro_batch_size}


def run(cfg: Config, seed: int, out_dir: Path) -> dict[str, Any]:
    """All methods × learning rates × seeds (runs of a method batched); summary at η*."""
    out = run_comparison("teleport-cnn", _run_method, METHODS, cfg, seed)
    seeds = [derive_seed(seed, "teleport-cnn", i) % 2**31 for i in range(cfg.n_seeds)]
    out["stats_check"] = stats_check(cfg, seeds)
    return out


def setup(cfg: Config) -> list[dict[str, str]]:
    """Deviations from the paper's warmup setting (§5.3; the paper has no teleport)."""
    full = Config()
    rows = [
        {
            "quantity": "model, data",
            "paper": "CNNs (ref. 10) on images",
            "ours": f"conv {cfg.c1}-{cfg.c2} + BatchNorm + linear on sklearn digits (8×8), float64",
            "why": "no image data set downloadable here; small and fast",
        },
        {
            "quantity": "η",
            "paper": "η_max with and without warmup",
            "ours": f"{list(cfg.lrs)}",
            "why": "largest stable rate per method",
        },
        {
            "quantity": "S, weight decay",
            "paper": "—",
            "ours": f"S = {cfg.batch_size}, torch weight_decay {cfg.weight_decay} (γ = "
            f"{cfg.weight_decay / 2:g}), plain SGD",
            "why": "scale invariance needs γ > 0 for a finite equilibrium",
        },
        {
            "quantity": "statistics",
            "paper": "—",
            "ours": f"micro-batches of {cfg.micro_batch_size}, {cfg.teleport_batch} samples per "
            "teleport",
            "why": "BatchNorm couples the samples",
        },
        {
            "quantity": "baseline",
            "paper": "— (Zhao et al. 2022)",
            "ours": f"{cfg.gradnorm_steps} normalised ascent steps of {cfg.gradnorm_step_size} on "
            f"{cfg.gradnorm_batch} images",
            "why": "enough steps to raise ‖∇L‖² measurably (gradnorm_gain)",
        },
        {"quantity": "seeds", "paper": "—", "ours": str(cfg.n_seeds), "why": "issue: ≥ 3"},
    ]
    if cfg.n_steps != full.n_steps:
        rows.append(
            {
                "quantity": "quick mode",
                "paper": "—",
                "ours": f"channels {cfg.c1}-{cfg.c2}, {cfg.n_steps} steps, lrs "
                f"{list(cfg.lrs)}, teleport batch {cfg.teleport_batch}",
                "why": f"time (full: {full.c1}-{full.c2}, {full.n_steps} steps, lrs "
                f"{list(full.lrs)}, batch {full.teleport_batch})",
            }
        )
    return rows


def claims(results: dict[str, Any], cfg: Config) -> list[Claim]:
    out = teleport_claims(results, cfg, ("teleport_start", "teleport_every"))
    star, stable = results["at_lr_star"], results["largest_stable_lr"]
    extra = "; grad-norm teleport (Zhao+22): " + ", ".join(
        f"{m} acc {star[m]['final_test_acc_mean']:.4f} ± {star[m]['final_test_acc_std']:.4f}, "
        f"trains {star[m]['n_trains']}/{cfg.n_seeds}, largest stable lr {stable[m]}"
        for m in ("gradnorm_start", "gradnorm_every")
    )
    out = [dataclasses.replace(c, note=c.note + extra) for c in out]  # keeps kind and why
    firsts = [
        r["gradnorm_ratio"][0]
        for r in results["runs"]
        if r["method"].startswith("gradnorm") and r["gradnorm_ratio"]
    ]
    sc = results["stats_check"]
    none = star["none"]
    out += [
        Claim(
            id="none_fails_at_warmup_lr",
            statement=f"The comparison can fail: at η* = {results['lr_star']} some seeds fail "
            f"to train without warmup; seeds that train without warmup (of {cfg.n_seeds})",
            value=none["n_trains"],
            op=Op.LT,
            threshold=cfg.n_seeds,
            note=f"no warmup at η*: {none['n_diverged']} diverged",
        ),
        Claim(
            id="gradnorm_gain",
            statement="The grad-norm baseline does its job: ‖∇L‖² after / before its first "
            "teleport (mean over runs; Zhao et al. 2022 ascend ‖∇L‖²)",
            value=float(np.mean(firsts)) if firsts else math.nan,
            op=Op.GE,
            threshold=2.0,
            note=f"range {min(firsts):.3g}–{max(firsts):.3g} over {len(firsts)} runs"
            if firsts
            else "no grad-norm teleport ran",
        ),
        Claim(
            id="microbatch_stats_sufficient",
            statement=f"Micro-batch statistics ({sc['n_micro_batches']} micro-batches of "
            f"{cfg.micro_batch_size}) fix the teleport: max over seeds of the spread of λ "
            f"between {cfg.stats_check_batches} independent teleport batches at "
            "initialisation, relative to max|λ|",
            value=max(sc["rel_spread"]),
            op=Op.LT,
            threshold=0.1,
            note="per seed " + ", ".join(f"{v:.3f}" for v in sc["rel_spread"]),
            why=f"two independent teleport batches of {sc['n_micro_batches']} micro-batches give "
            f"solutions up to {max(sc['rel_spread']):.1%} apart (relative to max|λ|): the "
            "statistics are still noisy at this batch",
        ),
    ]
    return out


def plot(results: dict[str, Any], cfg: Config, out_dir: Path) -> list[Path]:
    title = (
        f"CNN {cfg.c1}-{cfg.c2} channels + BatchNorm on digits, SGD S={cfg.batch_size}, "
        f"weight decay {cfg.weight_decay}"
    )
    return [plot_curves(results, cfg, out_dir / "teleport_cnn.png", METHODS, title)]

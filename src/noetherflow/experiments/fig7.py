"""Fig. 7 (App. A.1): under scale invariance SGD's parameter norm grows, GD's stays put.

Two tanh networks with a hidden layer of width ``h``, ``u`` ∈ R^{d_out×h} (``u_j`` its
``j``-th column) and ``w`` ∈ R^{h×d_in} (``w_j`` its ``j``-th row):

    Net-A:  f(x) = Σ_j (u_j / ‖w‖_F) tanh(w_jᵀx / ‖u‖_F),
    Net-B:  f(x) = Σ_j (u_j / ‖u‖_F) tanh(w_jᵀx / ‖w‖_F).

App. A.1 calls ``w`` and ``u`` matrices and writes ``‖w‖`` next to ``‖u‖_F``; we read both
as whole-layer Frobenius norms. (The per-row reading ``‖w_j‖`` has the same symmetries.)
Both nets are invariant under ``(u, w) → ρ(u, w)`` (``A = I``), so every per-sample gradient
is orthogonal to ``θ = (u, w)`` and one step ``θ' = θ − ηg`` gives exactly

    ‖θ'‖² = ‖θ‖² + η²‖g‖²:

the total norm never decreases, under SGD (noise keeps ``g`` nonzero, so it keeps growing)
and under GD (where ``∇L → 0`` and the growth stops). Net-B is in addition invariant under
scaling ``u`` alone and ``w`` alone, so each layer's norm is monotone as well; Net-A has
no layer-wise symmetry and its two layers may move in opposite directions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from noetherflow.experiments._base import (
    Claim,
    Op,
    derive_seed,
    save_figure,
)

DESCRIPTION = (
    "Scale-invariant tanh nets: SGD's total parameter norm grows monotonically, GD's stays "
    "flat; Net-B's layers (each scale invariant) both grow."
)

PAPER = (
    "Fig. 7 (App. A.1): for scale-invariant networks (Net-A, Net-B) SGD's parameter norm "
    "increases monotonically while GD's stays almost constant (eq. 24 without weight decay: "
    "the equilibrium is at infinity)."
)
PAPER_ORDER = 7.0


def setup(cfg: Config) -> list[dict[str, str]]:
    """Every deviation from the paper's setup, one row each (issue #17)."""
    quick = Config.quick()
    return [
        {
            "quantity": "norm of w",
            "paper": "‖w‖ next to ‖u‖_F (App. A.1)",
            "ours": "both whole-layer Frobenius norms",
            "why": "the same symmetries either way",
        },
        {
            "quantity": "sizes",
            "paper": "not given",
            "ours": f"d_in = {cfg.d_in}, width {cfg.hidden}, d_out = {cfg.d_out}",
            "why": "small",
        },
        {
            "quantity": "data",
            "paper": "not given",
            "ours": f"{cfg.n_samples} samples x ~ N(0, I), y = βᵀx + {cfg.noise_std:g}ξ, "
            f"‖β‖ = {cfg.target_norm:g}",
            "why": "label noise keeps SGD's gradients nonzero",
        },
        {
            "quantity": "η, S",
            "paper": "not given",
            "ours": f"η = {cfg.lr:g}; SGD S = {cfg.batch_size} (with replacement), GD full batch",
            "why": "—",
        },
        {
            "quantity": "schedule / γ / momentum",
            "paper": "—",
            "ours": "constant η, γ = 0, no momentum",
            "why": "the exact norm identity",
        },
        {
            "quantity": "loss convention",
            "paper": "not given",
            "ours": "squared error, mean over the batch",
            "why": "—",
        },
        {
            "quantity": "steps",
            "paper": "not given",
            "ours": f"{cfg.n_steps} (quick {quick.n_steps})",
            "why": "per-step claims",
        },
        {"quantity": "seeds", "paper": "—", "ours": "1", "why": "the claims are exact per step"},
    ]


NETS = ("A", "B")
METHODS = ("sgd", "gd")


@dataclass(frozen=True)
class Config:
    """Settings of the Fig. 7 experiment (App. A.1; the paper gives no sizes).

    Choices and why:

    - Linear Gaussian data: ``n_samples=256`` inputs ``x ~ N(0, I_{d_in})``, ``d_in=8``,
      targets ``y = βᵀx + noise_std·ξ`` with ``‖β‖ = target_norm=0.5`` (Net-B's output is
      at most a unit-norm linear map in its near-linear regime, so the target is reachable)
      and ``noise_std=0.5``: label noise keeps the per-sample gradients nonzero at the
      minimum, which is what drives the norm under SGD. ``d_out=1``, width ``hidden=16``.
    - Loss: squared error averaged over the minibatch; no weight decay, no momentum (both
      would break the exact identity).
    - SGD: ``batch_size=4`` drawn with replacement, ``lr=0.1``; GD: full batch, same lr,
      same number of steps ``n_steps=4000``, same init (``w ~ N(0, 1/d_in)``,
      ``u ~ N(0, 1/hidden)``, i.e. PyTorch's fan-in scaling), float64.
    - Growth of the total norm: ``‖θ_T‖/‖θ_0‖ − 1``. A "decreasing step" is
      ``‖θ_{t+1}‖² < ‖θ_t‖²`` in float64, with no tolerance (the per-step increase
      η²‖g‖² is many orders of magnitude above round-off here).
    """

    d_in: int = 8
    hidden: int = 16
    d_out: int = 1
    n_samples: int = 256
    target_norm: float = 0.5
    noise_std: float = 0.5
    batch_size: int = 4
    lr: float = 0.1
    n_steps: int = 4000
    n_records: int = 400
    identity_every: int = 10

    @classmethod
    def quick(cls) -> Config:
        """Same problem, fewer steps (the monotonicity claims are per step)."""
        return cls(n_steps=1000)


def forward(net: str, u: Tensor, w: Tensor, x: Tensor) -> Tensor:
    """Output ``[n, d_out]`` of Net-A or Net-B for inputs ``x`` ``[n, d_in]``."""
    nu, nw = u.norm(), w.norm()
    if net == "A":
        return torch.tanh(x @ w.T / nu) @ (u / nw).T
    if net == "B":
        return torch.tanh(x @ w.T / nw) @ (u / nu).T
    raise ValueError(f"net={net!r}; expected 'A' or 'B'.")


class ScaleInvariantNet(nn.Module):
    """Net-A or Net-B (:func:`forward`) as an ``nn.Module`` with parameters ``u``
    ``[d_out, h]`` and ``w`` ``[h, d_in]``, for :mod:`noetherflow.train` and the library's
    :class:`~noetherflow.ScaleInvariance` symmetries."""

    def __init__(self, net: str, u: Tensor, w: Tensor) -> None:
        super().__init__()
        if net not in NETS:
            raise ValueError(f"net={net!r}; expected 'A' or 'B'.")
        self.net = net
        self.u = nn.Parameter(u.detach().clone())
        self.w = nn.Parameter(w.detach().clone())

    def forward(self, x: Tensor) -> Tensor:
        return forward(self.net, self.u, self.w, x)

    def symmetries(self) -> Any:
        """The exact symmetries: ``(u, w) → ρ(u, w)`` for both nets ("total"); for Net-B also
        ``u`` alone and ``w`` alone."""
        import noetherflow as nf

        syms = [nf.ScaleInvariance([self.u, self.w], label="total")]
        if self.net == "B":
            syms += [
                nf.ScaleInvariance([self.u], label="u"),
                nf.ScaleInvariance([self.w], label="w"),
            ]
        return nf.SymmetrySet(syms)


def _mse(out: Tensor, target: Tensor) -> Tensor:
    """Squared error summed over outputs, mean over the batch."""
    return (out - target).pow(2).sum(-1).mean()


def _data(cfg: Config, seed: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(derive_seed(seed, "fig7", "data"))
    x = torch.randn(cfg.n_samples, cfg.d_in, generator=g, dtype=torch.float64)
    beta = torch.randn(cfg.d_in, cfg.d_out, generator=g, dtype=torch.float64)
    beta *= cfg.target_norm / beta.norm()
    y = x @ beta + cfg.noise_std * torch.randn(
        cfg.n_samples, cfg.d_out, generator=g, dtype=torch.float64
    )
    return x, y


def _init(cfg: Config, seed: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(derive_seed(seed, "fig7", "init"))
    w = torch.randn(cfg.hidden, cfg.d_in, generator=g, dtype=torch.float64) / cfg.d_in**0.5
    u = torch.randn(cfg.d_out, cfg.hidden, generator=g, dtype=torch.float64) / cfg.hidden**0.5
    return u, w


RUNS = tuple((net, m) for net in NETS for m in METHODS)


def _train_one(cfg: Config, seed: int, net: str, method: str) -> dict[str, Any]:
    """One run through :func:`noetherflow.train.run_sgd` (minibatches of ``batch_size`` drawn
    with replacement) or :func:`~noetherflow.train.run_gd`, logging every step.

    At each step the callback reads ‖u‖² and ‖w‖²; every ``identity_every`` steps it predicts
    the next charges with ``nf.exact_step_charges`` from the step's gradient (the minibatch
    replayed with :func:`~noetherflow.train.sample_batch`, which is drawn at every step to
    stay in sync), and the identity residual compares that prediction with the library's
    charges (``nf.charges``; ``total`` = ‖θ‖²) one step later.
    """
    import noetherflow as nf
    from noetherflow.train import run_gd, run_sgd, sample_batch

    x, y = _data(cfg, seed)
    u0, w0 = _init(cfg, seed)
    model = ScaleInvariantNet(net, u0, w0)
    syms = model.symmetries()
    batch_seed = derive_seed(seed, "fig7", "sgd", net) % 2**62
    replay = torch.Generator().manual_seed(batch_seed)
    u2: list[float] = []
    w2: list[float] = []
    resid: list[float] = []
    pred: dict[str, Tensor] = {}

    def step_grads(k: int) -> dict[nn.Parameter, Tensor] | None:
        """The gradient of step k (None when step k is not checked); SGD's replayed minibatch
        is drawn at every step so that the replay stays in sync with run_sgd."""
        if method == "sgd":
            idx = sample_batch(cfg.n_samples, cfg.batch_size, generator=replay)
        if k >= cfg.n_steps or k % cfg.identity_every != 0:
            return None
        loss = _mse(model(x[idx]), y[idx]) if method == "sgd" else _mse(model(x), y)
        gu, gw = torch.autograd.grad(loss, [model.u, model.w])
        return {model.u: gu, model.w: gw}

    def callback(k: int, m: nn.Module) -> None:
        if pred:
            ch = nf.charges(syms)
            resid.append(max(float((abs(ch[n] - pred[n]) / ch[n]).max()) for n in ch))
            pred.clear()
        u2.append(float(model.u.detach().pow(2).sum()))
        w2.append(float(model.w.detach().pow(2).sum()))
        grads = step_grads(k)
        if grads is not None:
            pred.update(nf.exact_step_charges(syms, grads, lr=cfg.lr))

    if method == "sgd":
        gen = torch.Generator().manual_seed(batch_seed)
        res = run_sgd(
            model,
            _mse,
            x,
            y,
            lr=cfg.lr,
            batch_size=cfg.batch_size,
            steps=cfg.n_steps,
            generator=gen,
            callback=callback,
        )
    else:
        res = run_gd(model, _mse, x, y, lr=cfg.lr, steps=cfg.n_steps, callback=callback)
    every = max(1, cfg.n_steps // cfg.n_records)
    steps_hist = np.asarray(res.history["step"])
    keep = (steps_hist % every == 0) | (steps_hist == steps_hist[-1])
    return {
        "u2": np.asarray(u2),
        "w2": np.asarray(w2),
        "rec_step": steps_hist[keep],
        "rec_loss": np.asarray(res.history["loss"])[keep],
        "identity_residual": max(resid) if resid else float("nan"),
        "divergence": {
            "diverged": res.diverged,
            "step": res.diverged_at_step,
            "last_finite_loss": res.last_finite_loss,
        },
    }


def _train(cfg: Config, seed: int) -> dict[tuple[str, str], dict[str, Any]]:
    """Every (net, method) run through the library's integrators."""
    return {(net, m): _train_one(cfg, seed, net, m) for net, m in RUNS}


def _decreasing(sq_norm: np.ndarray) -> int:
    return int(np.sum(np.diff(sq_norm) < 0))


def run(cfg: Config, seed: int, out_dir: Path) -> dict[str, Any]:
    """Net-A and Net-B, each with SGD and GD from one init on one data set."""
    outs = _train(cfg, seed)
    every = max(1, cfg.n_steps // cfg.n_records)
    series: dict[str, Any] = {"step": np.arange(0, cfg.n_steps + 1, every)}
    stats: dict[str, Any] = {}
    for (net, m), o in outs.items():
        key = f"net{net}_{m}"
        total = o["u2"] + o["w2"]
        idx = series["step"][series["step"] < len(total)]
        series[f"{key}_norm"] = np.sqrt(total[idx])
        series[f"{key}_u_norm"] = np.sqrt(o["u2"][idx])
        series[f"{key}_w_norm"] = np.sqrt(o["w2"][idx])
        series[f"{key}_loss_step"] = o["rec_step"]
        series[f"{key}_loss"] = o["rec_loss"]
        stats[key] = {
            "total_decreasing_steps": _decreasing(total),
            "u_decreasing_steps": _decreasing(o["u2"]),
            "w_decreasing_steps": _decreasing(o["w2"]),
            "total_growth": float(np.sqrt(total[-1] / total[0]) - 1.0),
            "u_change": float(np.sqrt(o["u2"][-1] / o["u2"][0]) - 1.0),
            "w_change": float(np.sqrt(o["w2"][-1] / o["w2"][0]) - 1.0),
            "identity_max_rel_residual": o["identity_residual"],
            "final_loss": float(o["rec_loss"][-1]),
            "divergence": o["divergence"],
        }
    a = outs[("A", "sgd")]
    du = np.sqrt(a["u2"] / a["u2"][0]) - 1.0
    dw = np.sqrt(a["w2"] / a["w2"][0]) - 1.0
    observation = {
        "u_change_end": float(du[-1]),
        "w_change_end": float(dw[-1]),
        "u_change_range": [float(du.min()), float(du.max())],
        "w_change_range": [float(dw.min()), float(dw.max())],
        "opposite_at_end": bool(du[-1] * dw[-1] < 0),
        "steps_with_opposite_sign": int(np.sum(du * dw < 0)),
    }
    return {
        "series": series,
        "stats": stats,
        "netA_sgd_layers": observation,
        "gd_over_sgd_growth": {
            net: stats[f"net{net}_gd"]["total_growth"] / stats[f"net{net}_sgd"]["total_growth"]
            for net in NETS
        },
    }


def claims(results: dict[str, Any], cfg: Config) -> list[Claim]:
    st = results["stats"]
    sgd_dec = sum(st[f"net{n}_sgd"]["total_decreasing_steps"] for n in NETS)
    ratios = results["gd_over_sgd_growth"]
    b = st["netB_sgd"]
    a = st["netA_sgd"]
    o = results["netA_sgd_layers"]
    verdict = "opposite" if o["opposite_at_end"] else "the same"
    obs = (
        f"Observation (not a claim), Net-A under SGD: ‖u‖ {o['u_change_end']:+.3g}, ‖w‖ "
        f"{o['w_change_end']:+.3g} relative to init at the end ({verdict} directions); ranges "
        f"‖u‖ [{o['u_change_range'][0]:+.3g}, {o['u_change_range'][1]:+.3g}], ‖w‖ "
        f"[{o['w_change_range'][0]:+.3g}, {o['w_change_range'][1]:+.3g}]; "
        f"{o['steps_with_opposite_sign']} of {cfg.n_steps} steps with the two layers on "
        f"opposite sides of their init; decreasing steps ‖u‖ {a['u_decreasing_steps']}, "
        f"‖w‖ {a['w_decreasing_steps']}."
    )
    return [
        Claim(
            id="sgd_total_norm_monotone",
            statement="Under SGD the total norm ‖(u, w)‖ of both nets never decreases "
            "(number of decreasing steps, Net-A + Net-B)",
            value=sgd_dec,
            op=Op.EQ,
            threshold=0,
            note=f"growth ‖θ_T‖/‖θ_0‖ − 1: Net-A {st['netA_sgd']['total_growth']:.3g}, "
            f"Net-B {st['netB_sgd']['total_growth']:.3g}; max |Δ‖θ‖² − η²‖g‖²|/‖θ‖² = "
            f"{max(s['identity_max_rel_residual'] for s in st.values()):.2g}",
        ),
        Claim(
            id="gd_norm_flat",
            statement="GD's relative growth of the total norm is less than 1/10 of SGD's "
            "(max over the two nets of growth_GD / growth_SGD)",
            value=max(ratios.values()),
            op=Op.LT,
            threshold=0.1,
            note=", ".join(
                f"Net-{n}: GD {st[f'net{n}_gd']['total_growth']:.3g} vs SGD "
                f"{st[f'net{n}_sgd']['total_growth']:.3g}"
                for n in NETS
            ),
        ),
        Claim(
            id="netB_each_layer_monotone",
            statement="Under SGD each layer norm of Net-B (‖u‖ and ‖w‖ separately) never "
            "decreases (number of decreasing steps, both layers)",
            value=b["u_decreasing_steps"] + b["w_decreasing_steps"],
            op=Op.EQ,
            threshold=0,
            note=f"Net-B: ‖u‖ {b['u_change']:+.3g}, ‖w‖ {b['w_change']:+.3g}. " + obs,
        ),
    ]


def plot(results: dict[str, Any], cfg: Config, out_dir: Path) -> list[Path]:
    from matplotlib.figure import Figure

    s = results["series"]
    fig = Figure(figsize=(15, 4.5))
    axes = fig.subplots(1, 3)
    panels = (
        ("norm", "total norm ‖(u, w)‖"),
        ("u_norm", "second layer ‖u‖_F"),
        ("w_norm", "first layer ‖w‖_F"),
    )
    styles = {"A": "C0", "B": "C3"}
    for ax, (suffix, title) in zip(axes, panels, strict=True):
        for net in NETS:
            for m, ls in (("sgd", "-"), ("gd", "--")):
                y = np.asarray(s[f"net{net}_{m}_{suffix}"])
                ax.plot(
                    np.asarray(s["step"])[: len(y)],
                    y,
                    ls,
                    color=styles[net],
                    label=f"Net-{net} {m.upper()}",
                )
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return [save_figure(fig, out_dir / "fig7.png")]

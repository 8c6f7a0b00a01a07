"""Generate the figures of the Concepts pages into ``docs/figures/`` (committed PNGs).

    python docs/gen_figures.py            # a few minutes on 2 CPU cores

Every number plotted is computed with noetherflow on small float64 ReLU nets and
scikit-learn's bundled digits; the script is deterministic (fixed seeds). Each figure is
written at 80 dpi to stay under 100 KB.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib
import numpy as np
import torch
from torch import nn

matplotlib.use("Agg")
import matplotlib.pyplot as plt

import noetherflow as nf

OUT = Path(__file__).resolve().parent / "figures"
sys.path.insert(0, str(Path(__file__).resolve().parent / "tutorials"))
from _common import digits  # noqa: E402


def _save(fig: plt.Figure, name: str) -> None:
    OUT.mkdir(exist_ok=True)
    fig.tight_layout()
    fig.savefig(OUT / name, dpi=80)
    plt.close(fig)
    print(f"wrote {OUT / name} ({(OUT / name).stat().st_size // 1024} KB)")


def _net(hidden: tuple[int, ...] = (16,), seed: int = 0) -> tuple[nn.Sequential, nf.SymmetrySet]:
    torch.manual_seed(seed)
    dims = (64, *hidden, 10)
    layers: list[nn.Module] = []
    for i in range(len(dims) - 1):
        layers += [nn.Linear(dims[i], dims[i + 1]), nn.ReLU()]
    model = nn.Sequential(*layers[:-1]).double()
    syms = nf.SymmetrySet(
        [
            nf.Rescaling(model[2 * i], model[2 * i + 2], label=f"h{i + 1}")
            for i in range(len(hidden))
        ]
    )
    return model, syms


def fig_symmetry() -> None:
    """Rescaling orbits of ℓ = (uwx − y)²: the hyperbolas uw = const, along which C changes."""
    w, u = np.meshgrid(np.linspace(-2.5, 2.5, 300), np.linspace(-2.5, 2.5, 300))
    loss = (u * w - 1.0) ** 2
    fig, ax = plt.subplots(figsize=(4.2, 3.6))
    cs = ax.contourf(w, u, np.log10(loss + 1e-3), levels=20, cmap="Greys")
    fig.colorbar(cs, ax=ax, label="log₁₀ loss")
    ax.contour(
        w,
        u,
        w**2 - u**2,
        levels=[-2, -1, 0, 1, 2],
        colors="tab:orange",
        linewidths=0.7,
        linestyles="dashed",
    )
    lam = np.linspace(-1.4, 1.4, 200)
    for w0, u0, col in ((0.5, 2.0, "tab:red"), (1.0, 0.4, "tab:green"), (-1.5, 1.0, "tab:blue")):
        ax.plot(
            w0 * np.exp(lam),
            u0 * np.exp(-lam),
            color=col,
            lw=1.5,
            label=f"orbit $e^{{λA}}θ$: uw = {w0 * u0:+.1f}",
        )
        ax.plot([w0], [u0], "o", color=col)
    ax.plot([], [], color="tab:orange", ls="--", lw=0.7, label="C = w² − u² = const")
    ax.set(
        xlim=(-2.5, 2.5),
        ylim=(-2.5, 2.5),
        xlabel="w",
        ylabel="u",
        title="rescaling symmetry of ℓ = (uwx − y)²",
    )
    ax.legend(fontsize=6, loc="lower left")
    _save(fig, "symmetry_orbits.png")


def fig_charges() -> None:
    """GF conserves C; GD drifts by η²∇LᵀA∇L per step; SGD drifts much more (no weight decay)."""
    x, y = digits(256)
    loss_fn = nn.CrossEntropyLoss()
    t_end = 20.0
    runs = {
        "gradient flow (GD, η = 0.005)": (0.005, None),
        "GD, η = 0.5": (0.5, None),
        "SGD, η = 0.5, S = 8": (0.5, 8),
    }
    fig, ax = plt.subplots(figsize=(5, 3.2))
    gen = torch.Generator().manual_seed(0)
    for label, (lr, s) in runs.items():
        model, syms = _net()
        c0 = nf.charges(syms)["h1"].clone()
        ts, dev = [], []
        for k in range(int(t_end / lr)):
            if s is None:
                xb, yb = x, y
            else:
                idx = torch.randint(0, 256, (s,), generator=gen)
                xb, yb = x[idx], y[idx]
            model.zero_grad()
            loss_fn(model(xb), yb).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= lr * p.grad
            if (k + 1) % max(1, int(0.2 / lr)) == 0:
                ts.append((k + 1) * lr)
                dev.append(float((nf.charges(syms)["h1"] - c0).norm()))
        ax.plot(ts, dev, label=label)
    ax.set(
        xlabel="time t = η · steps",
        ylabel="‖C(t) − C(0)‖ (16 neuron charges)",
        yscale="log",
        title="Noether charges: conserved by GF, not by SGD",
    )
    ax.legend(fontsize=7)
    _save(fig, "charges.png")


def _trained(steps: int = 300) -> tuple[nn.Sequential, nf.SymmetrySet, torch.Tensor, torch.Tensor]:
    x, y = digits(256)
    model, syms = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    opt.zero_grad()
    return model, syms, x, y


def fig_flow_factor() -> None:
    """Measured E[ΔC] of one SGD step (S = 1, exact average over the data) vs predictions."""
    model, syms, x, y = _trained()
    lr, loss_fn = 0.05, nn.CrossEntropyLoss()
    c0 = nf.charges(syms)["h1"].clone()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    measured = torch.zeros_like(c0)
    for i in range(x.shape[0]):  # S = 1 with replacement: the expectation is the data mean
        model.load_state_dict(state)
        model.zero_grad()
        loss_fn(model(x[i : i + 1]), y[i : i + 1]).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
        measured += (nf.charges(syms)["h1"] - c0) / x.shape[0]
    model.load_state_dict(state)
    st = nf.collect_stats(model, syms, loss_fn, x, y)
    ours = lr * nf.noether_flow(syms, st, lr=lr, batch_size=1)["h1"]  # dt = η per step
    paper = 0.5 * ours  # eq. (7): σ²Tr[ΣA] with σ² = η/(2S)
    disc = nf.noether_flow(syms, st, lr=lr, batch_size=1, time="discrete")["h1"]
    fig, ax = plt.subplots(figsize=(4.4, 3.6))
    m = measured.numpy()
    lim = [min(m.min(), 0) * 1.1, m.max() * 1.1]
    ax.plot(lim, lim, "k:", lw=0.8)
    ax.plot(m, disc.numpy(), "s", mfc="none", ms=7, label="discrete: η²Tr[A(∇L∇Lᵀ + Σ/S)]")
    ax.plot(m, ours.numpy(), "o", label="ours: η · (η/S)Tr[ΣA]")
    ax.plot(m, paper.numpy(), "x", label="paper eq. (7): η · σ²Tr[ΣA]")
    ax.set(
        xlabel="measured E[ΔC] per SGD step",
        ylabel="predicted",
        title="one step of SGD, 16 neuron charges",
    )
    ax.legend(fontsize=7)
    ratio = float((ours @ measured) / (measured @ measured))  # least-squares slope
    print(f"flow factor: slope ours/measured = {ratio:.3f}, paper/measured = {ratio / 2:.3f}")
    _save(fig, "flow_factor.png")


def fig_equilibrium() -> None:
    """The flow of each neuron's charge is monotone along its orbit (Thm 4.3); λ* is its root."""
    model, syms, x, y = _trained(100)
    loss_fn, hyper = nn.CrossEntropyLoss(), dict(lr=0.1, batch_size=16, weight_decay=1e-3)
    st = nf.collect_stats(model, syms, loss_fn, x, y)
    sol = nf.solve_equilibrium(syms, st, **hyper)
    lam_star = sol.elements["h1"]
    neurons = [0, 3, 7, 11]
    lams = torch.linspace(-2.5, 2.5, 41, dtype=torch.float64)
    w1, b1, w2 = model[0].weight, model[0].bias, model[2].weight
    saved = [t.detach().clone() for t in (w1, b1, w2)]
    curves = {j: [] for j in neurons}
    for lam in lams:
        with torch.no_grad():
            e = torch.exp(lam)
            w1.copy_(saved[0] * e)
            b1.copy_(saved[1] * e)
            w2.copy_(saved[2] / e)
        model.zero_grad()
        f = nf.noether_flow(syms, nf.collect_stats(model, syms, loss_fn, x, y), **hyper)["h1"]
        for j in neurons:
            curves[j].append(float(f[j]))
    with torch.no_grad():
        for t, s in zip((w1, b1, w2), saved, strict=True):
            t.copy_(s)
    fig, ax = plt.subplots(figsize=(4.8, 3.4))
    for j in neurons:
        (ln,) = ax.plot(lams.numpy(), curves[j], label=f"neuron {j}")
        ax.axvline(float(lam_star[j]), color=ln.get_color(), ls=":", lw=1)
    ax.axhline(0, color="k", lw=0.6)
    ax.set(
        xlabel="λ (all neurons scaled by $e^{λA}$)",
        ylabel="flow dC/dt",
        yscale="symlog",
        title="flow along the orbit; dotted: solver's λ*",
    )
    ax.set_yscale("symlog", linthresh=1e-5)
    ax.legend(fontsize=7)
    _save(fig, "equilibrium_orbit.png")


def fig_teleport() -> None:
    """Distance to the noise equilibrium during SGD, with and without a teleport at step 0."""
    x, y = digits(512)
    loss_fn = nn.CrossEntropyLoss()
    hyper = dict(lr=0.2, batch_size=16, weight_decay=1e-3)
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for tele in (False, True):
        model, syms = _net((32, 16))
        if tele:
            st = nf.collect_stats(model, syms, loss_fn, x, y)
            nf.teleport(model, nf.solve_equilibrium(syms, st, **hyper))
        opt = torch.optim.SGD(
            model.parameters(), lr=hyper["lr"], weight_decay=2 * hyper["weight_decay"]
        )
        gen = torch.Generator().manual_seed(1)
        steps, dist = [], []
        for k in range(1501):
            if k % 50 == 0:
                model.zero_grad()
                st = nf.collect_stats(model, syms, loss_fn, x, y)
                sol = nf.solve_equilibrium(syms, st, **hyper)
                steps.append(k)
                dist.append(float(torch.cat([d.flatten() for d in sol.distance.values()]).median()))
                model.zero_grad()
            idx = torch.randint(0, x.shape[0], (hyper["batch_size"],), generator=gen)
            loss_fn(model(x[idx]), y[idx]).backward()
            opt.step()
            opt.zero_grad()
        ax.plot(steps, dist, label="teleported at step 0" if tele else "plain SGD")
    ax.set(
        xlabel="SGD step",
        ylabel="median |λ*| over 48 neurons",
        title="distance to the noise equilibrium",
    )
    ax.legend(fontsize=8)
    _save(fig, "teleport.png")


if __name__ == "__main__":
    torch.set_num_threads(2)
    fig_symmetry()
    fig_charges()
    fig_flow_factor()
    fig_equilibrium()
    fig_teleport()

"""Tutorial: solve for the noise equilibrium and teleport there.

For a batch treated as the data distribution, ``nf.solve_equilibrium`` finds the group
element of every symmetry that zeroes its noise-driven flow (paper eq. 9 in our convention,
Thm 4.3 for existence and uniqueness): a joint convex Newton solve for the diagonal families
(rescaling, scale), the matrix geometric mean for a double rotation. ``nf.teleport`` applies
it in place — the function of the network does not change — and ``handle.undo()`` restores
the parameters bit for bit.

The second part shows an equilibrium *at infinity*: a layer feeding a normalisation is scale
invariant, and without weight decay SGD noise grows its norm for ever (paper eq. 24). The
solver reports that direction instead of looping.

The script ends by checking numbers: after the teleport the largest relative flow must drop
below 1e-8 and the outputs must stay unchanged to 1e-12; the scale-invariant layer must be
reported at infinity.

Run: ``python docs/tutorials/solve_teleport.py [--tiny]``
"""

from __future__ import annotations

import argparse

import torch
from sklearn.datasets import load_digits
from torch import nn

import noetherflow as nf


def relative_flow(
    flows: dict[str, torch.Tensor], model: nn.Module, syms: nf.SymmetrySet, hyper: dict[str, float]
) -> float:
    """max |flow| / max |4γC + ...|: the flow in units of its own decay term."""
    c = nf.charges(syms)
    scale = max(float(c[n].abs().max()) for n in syms.names) * 4 * hyper["weight_decay"]
    return max(float(flows[n].abs().max()) for n in syms.names) / scale


def main(tiny: bool = False) -> float:
    torch.manual_seed(0)
    data = load_digits()  # scikit-learn's bundled 8×8 digits, pixels scaled to [0, 1]
    idx = torch.randperm(len(data.target), generator=torch.Generator().manual_seed(0))
    idx = idx[: 128 if tiny else 1024].numpy()
    x, y = torch.tensor(data.data[idx] / 16.0), torch.tensor(data.target[idx])
    model = nn.Sequential(
        nn.Linear(64, 32),
        nn.ReLU(),
        nn.Linear(32, 16),
        nn.ReLU(),
        nn.Linear(16, 8),
        nn.Linear(8, 10),
    ).double()
    syms = nf.SymmetrySet(
        [
            nf.Rescaling(model[0], model[2], label="h1"),  # per neuron, across ReLU
            nf.Rescaling(model[2], model[4], label="h2"),
            nf.DoubleRotation(model[4], model[5], label="rot"),  # nothing between the two maps
        ]
    )
    syms.verify(model, x)
    loss_fn = nn.CrossEntropyLoss()
    hyper = dict(lr=0.1, batch_size=32, weight_decay=1e-3)  # η, S, γ of γ‖θ‖²

    stats = nf.collect_stats(model, syms, loss_fn, x, y)  # estimator="hooks", level="diag"
    before = relative_flow(nf.noether_flow(syms, stats, **hyper), model, syms, hyper)
    sol = nf.solve_equilibrium(syms, stats, **hyper)
    print(sol)  # distances to the equilibrium, convergence, directions at infinity

    with torch.no_grad():
        out0 = model(x).clone()
    handle = nf.teleport(model, sol)
    with torch.no_grad():
        change = float((model(x) - out0).abs().max() / out0.abs().max())
    stats = nf.collect_stats(model, syms, loss_fn, x, y)  # fresh statistics at the new θ
    after = relative_flow(nf.noether_flow(syms, stats, **hyper), model, syms, hyper)
    print(f"relative flow {before:.3e} → {after:.3e}; relative output change {change:.1e}")
    handle.undo()  # exactly back to where we were

    # An equilibrium at infinity: a linear layer feeding a LayerNorm, no weight decay.
    net = nn.Sequential(
        nn.Linear(64, 16),
        nn.LayerNorm(16, elementwise_affine=False),
        nn.ReLU(),
        nn.Linear(16, 10),
    ).double()
    sc = nf.SymmetrySet([nf.ScaleInvariance([net[0].weight, net[0].bias], label="ln")])
    sc.verify(net, x, tolerance=1e-4)  # LayerNorm's eps makes it exact only up to ~eps/var
    st = nf.collect_stats(net, sc, loss_fn, x, y)
    sol_inf = nf.solve_equilibrium(sc, st, lr=0.1, batch_size=32, weight_decay=0.0)
    for rep in sol_inf.at_infinity:
        print(f"at infinity: {rep.name}: {rep.reason}")

    assert after < 1e-8 * max(before, 1.0), (before, after)
    assert change < 1e-12, change
    assert [r.name for r in sol_inf.at_infinity] == ["ln"], sol_inf.at_infinity
    return after


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="run at the CI size (seconds)")
    main(parser.parse_args().tiny)

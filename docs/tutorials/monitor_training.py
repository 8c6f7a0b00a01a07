"""Tutorial: monitor the Noether charges of your own training loop.

A ReLU net on scikit-learn's bundled digits, trained with plain SGD and weight decay by an
ordinary PyTorch loop. ``nf.NoetherMonitor`` rides on the loop's own forward/backward pass
(no extra backward, no per-sample gradients materialised) and records, every ``every`` steps,
the charges C = θᵀAθ, their flows dC/dt and the distance to the noise equilibrium.

Two rules make the numbers exact:

* pass the optimizer (``optimizer=opt``): the monitor reads η and γ from its param groups at
  every record, so a scheduler is followed. noetherflow's γ is the coefficient of γ‖θ‖² in
  the loss (gradient 2γθ); ``torch.optim.SGD(weight_decay=λ)`` adds λθ to the gradient, so
  the monitor uses γ = λ/2 (and so must anything you compute by hand);
* read the monitor *before* ``opt.step()``: charges, flows and statistics then refer to the
  same θ.

The script ends by checking a number: with plain SGD (no momentum) every step obeys the exact
identity C(θ') = (1 − 2ηγ)²C(θ) + η²gᵀAg (``nf.exact_step_charges``); the largest relative
error over the run must be below 1e-10 in float64.

Run: ``python docs/tutorials/monitor_training.py [--tiny]``
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn

import noetherflow as nf


def main(tiny: bool = False) -> float:
    torch.manual_seed(0)
    n_steps, batch, every = (12, 32, 4) if tiny else (300, 64, 10)
    lr, gamma = 0.1, 5e-4  # η and γ of γ‖θ‖²
    data = load_digits()  # scikit-learn's bundled 8×8 digits, pixels scaled to [0, 1]
    idx = torch.randperm(len(data.target), generator=torch.Generator().manual_seed(0))
    idx = idx[: 512 if tiny else 1797].numpy()
    x_all, y_all = torch.tensor(data.data[idx] / 16.0), torch.tensor(data.target[idx])

    model = nn.Sequential(
        nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 10)
    ).double()
    syms = nf.SymmetrySet(
        [nf.Rescaling(model[0], model[2], label="h1"), nf.Rescaling(model[2], model[4], label="h2")]
    )
    syms.verify(model, x_all[:8])  # raises if a declared symmetry is not one
    loss_fn = nn.CrossEntropyLoss()  # reduction="mean": tell the monitor (the default)
    opt = torch.optim.SGD(model.parameters(), lr=lr, weight_decay=2 * gamma)  # λ = 2γ

    log_dir = Path(tempfile.mkdtemp(prefix="nf_monitor_"))
    # η and γ = λ/2 are read from the optimizer at every record; S is the loop's batch size
    mon = nf.NoetherMonitor(
        model,
        syms,
        every=every,
        optimizer=opt,
        batch_size=batch,
        logging=nf.LogOptions(log_dir=log_dir, progress=False),
    )
    gen = torch.Generator().manual_seed(1)
    worst = 0.0
    for _ in range(n_steps):
        idx = torch.randint(0, x_all.shape[0], (batch,), generator=gen)
        x, y = x_all[idx], y_all[idx]
        with mon.track():  # hooks only on record steps
            loss = loss_fn(model(x), y)
            loss.backward()
        mon.step(loss)
        # the exact identity, checked at every step (g = gradient of the data loss)
        predicted = nf.exact_step_charges(
            syms, {p: p.grad for p in syms.params()}, lr=lr, weight_decay=gamma
        )
        opt.step()
        opt.zero_grad()
        after = nf.charges(syms)
        for name in syms.names:
            err = (after[name] - predicted[name]).abs().max() / after[name].abs().max()
            worst = max(worst, float(err))
    mon.close()

    h = nf.load_history(log_dir)  # the same dict as mon.history, read from history.jsonl
    print(f"{len(h['step'])} records at steps {h['step'].tolist()}")
    print(f"loss {h['loss'][0]:.3f} → {h['loss'][-1]:.3f}")
    # the distance is measured every distance_every = 10·every steps (NaN in between)
    measured = np.isfinite(h[f"distance/{syms.names[0]}"]).all(axis=1)
    for name in syms.names:
        print(
            f"{name}: mean |C| {abs(h[f'charge/{name}'][-1]).mean():.3f}, "
            f"max |dC/dt| {abs(h[f'flow/{name}'][-1]).max():.3e}, "
            f"max distance |λ*| {h[f'distance/{name}'][measured][-1].max():.3f} "
            f"(step {h['step'][measured][-1]})"
        )
    print(f"exact identity, worst relative error over {n_steps} steps: {worst:.2e}")
    assert len(h["step"]) == n_steps // every
    assert (h["lr"] == lr).all() and (h["weight_decay"] == gamma).all()  # read from opt
    assert worst < 1e-10, worst
    return worst


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="run at the CI size (seconds)")
    main(parser.parse_args().tiny)

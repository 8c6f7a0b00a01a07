"""Cold vs warm-started equilibrium solve on the MLP benchmark (784-1024-1024-10, batch 256).

Solves once, trains ``--steps`` SGD steps, then solves the new problem from the identity
(cold) and from the first solution (warm, ``solve_equilibrium(..., init=...)``), side by side
in one process, and checks that both give the same λ*.

With ``--vgg``: instead, one solve of VGG11-bn (built by hand, eval mode, CIFAR-size 32×32
inputs, batch 16; symmetries from ``nf.find_symmetries``, BatchNorm-affine rescalings
included), timed, with the process's peak resident memory.

Usage: ``PYTHONPATH=src python benchmarks/bench_solver.py [--steps 10] [--tiny] [--vgg]``
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from torch import nn

import noetherflow as nf

VGG11 = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]


def vgg11_bn(num_classes: int = 10) -> nn.Sequential:
    """VGG11 with BatchNorm (configuration A of Simonyan & Zisserman), 32×32 inputs."""
    layers: list[nn.Module] = []
    c = 3
    for v in VGG11:
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(c, int(v), 3, padding=1), nn.BatchNorm2d(int(v)), nn.ReLU()]
            c = int(v)
    head = [nn.Flatten(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, num_classes)]
    return nn.Sequential(*layers, *head)


def bench_vgg(batch: int = 16) -> dict[str, Any]:
    """Time one equilibrium solve of VGG11-bn (eval mode); peak RSS of the process."""
    import resource

    torch.manual_seed(0)
    m = vgg11_bn().eval()
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    syms = nf.find_symmetries(m, x)
    st = nf.collect_stats(m, syms, nn.CrossEntropyLoss(), x, y, estimator="reference")
    t = time.perf_counter()
    sol = nf.solve_equilibrium(syms, st, lr=0.05, batch_size=batch, weight_decay=5e-4)
    t_solve = time.perf_counter() - t
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    print(
        f"VGG11-bn: {len(list(syms))} symmetries, solve {t_solve:.2f} s "
        f"({sol.iterations} it., converged={sol.converged}), peak RSS {rss_gb:.2f} GB"
    )
    return {"solve_s": t_solve, "converged": sol.converged, "peak_rss_gb": rss_gb}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=10, help="SGD steps between the two solves")
    ap.add_argument("--tiny", action="store_true", help="toy sizes (smoke test)")
    ap.add_argument("--vgg", action="store_true", help="one VGG11-bn solve instead")
    args = ap.parse_args(argv)
    if args.vgg:
        return bench_vgg()
    torch.manual_seed(0)
    d_in, width, batch = (20, 16, 32) if args.tiny else (784, 1024, 256)
    m = nn.Sequential(
        nn.Linear(d_in, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)
    )
    x, y = torch.randn(batch, d_in), torch.randint(0, 10, (batch,))
    syms = nf.find_symmetries(m, x)
    ce = nn.CrossEntropyLoss()
    kw: dict[str, Any] = {"lr": 0.05, "batch_size": batch, "weight_decay": 1e-4}
    first = nf.solve_equilibrium(syms, nf.collect_stats(m, syms, ce, x, y), **kw)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, weight_decay=1e-4)
    for _ in range(args.steps):
        opt.zero_grad()
        ce(m(x), y).backward()
        opt.step()
    st = nf.collect_stats(m, syms, ce, x, y)
    t = time.perf_counter()
    cold = nf.solve_equilibrium(syms, st, **kw)
    t_cold = time.perf_counter() - t
    t = time.perf_counter()
    warm = nf.solve_equilibrium(syms, st, init=first, **kw)
    t_warm = time.perf_counter() - t
    diff = max(
        float((torch.as_tensor(warm.elements[k]) - torch.as_tensor(v)).abs().max())
        for k, v in cold.elements.items()
    )
    res = {
        "cold_s": t_cold,
        "warm_s": t_warm,
        "cold_iterations": cold.iterations,
        "warm_iterations": warm.iterations,
        "max_abs_diff": diff,
    }
    print(
        f"cold {t_cold:.2f} s ({cold.iterations} Newton it.), warm {t_warm:.2f} s "
        f"({warm.iterations} it.), warm/cold {t_warm / t_cold:.2f}, max |Δλ*| {diff:.1e}"
    )
    return res


if __name__ == "__main__":
    main()

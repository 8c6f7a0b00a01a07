"""Cold vs warm-started equilibrium solve on the MLP benchmark (784-1024-1024-10, batch 256).

Solves once, trains ``--steps`` SGD steps, then solves the new problem from the identity
(cold) and from the first solution (warm, ``solve_equilibrium(..., init=...)``), side by side
in one process, and checks that both give the same λ*.

Usage: ``PYTHONPATH=src python benchmarks/bench_solver.py [--steps 10] [--tiny]``
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from torch import nn

import noetherflow as nf


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=10, help="SGD steps between the two solves")
    ap.add_argument("--tiny", action="store_true", help="toy sizes (smoke test)")
    args = ap.parse_args(argv)
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

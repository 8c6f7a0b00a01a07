"""Overhead of EquilibriumTeleport (and of the grad-norm teleport baseline) vs an SGD step.

    python benchmarks/bench_teleport.py [--quick] [--tiny] [--reps N] [--threads N]

For each workload, the median wall time of: one plain SGD step (forward, backward, step);
one equilibrium teleport, split into statistics (``collect_stats``) and solve
(``solve_equilibrium``), plus applying it and transforming the optimizer state; one
grad-norm teleport (Zhao et al. 2022, 10 ascent steps). The amortised overhead of
``every=k`` is teleport / (k · step). Workloads:

(a) ReLU MLP 64-256-256-256-10, batch 128, cross-entropy, hooks estimator (3 rescalings);
(b) CNN conv(1→16)-BN-ReLU-conv(16→32)-BN-ReLU-pool-linear on 8×8 inputs, batch 128,
    micro-batch estimator (m = 8; BatchNorm couples samples), weight decay;
(c) factorised linear 64-128-64 (a double rotation, closed-form geometric mean), batch 128.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import noetherflow as nf
from noetherflow.baselines.zhao2022 import gradient_norm_teleport
from noetherflow.teleportation.tool import EquilibriumTeleport


def _median_time(fn: Callable[[], Any], reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _workloads(tiny: bool) -> dict[str, dict[str, Any]]:
    w = 16 if tiny else 256
    c1, c2 = (2, 4) if tiny else (16, 32)
    n = 32 if tiny else 128
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    mlp = nn.Sequential(
        nn.Linear(64, w),
        nn.ReLU(),
        nn.Linear(w, w),
        nn.ReLU(),
        nn.Linear(w, w),
        nn.ReLU(),
        nn.Linear(w, 10),
    )
    cnn = nn.Sequential(
        nn.Conv2d(1, c1, 3, padding=1, bias=False),
        nn.BatchNorm2d(c1),
        nn.ReLU(),
        nn.Conv2d(c1, c2, 3, padding=1, bias=False),
        nn.BatchNorm2d(c2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(c2 * 16, 10),
    )
    lin = nn.Sequential(nn.Linear(64, w // 2, bias=False), nn.Linear(w // 2, 64, bias=False))

    def mse(o: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((o - y) ** 2).sum(1).mean()

    return {
        "mlp": {
            "model": mlp,
            "x": torch.randn(n, 64, generator=g),
            "y": torch.randint(0, 10, (n,), generator=g),
            "loss": F.cross_entropy,
            "kw": {},
            "wd": 0.0,
        },
        "cnn_bn": {
            "model": cnn,
            "x": torch.randn(n, 1, 8, 8, generator=g),
            "y": torch.randint(0, 10, (n,), generator=g),
            "loss": F.cross_entropy,
            "kw": {"estimator": "microbatch", "micro_batch_size": 8},
            "wd": 1e-3,
        },
        "linear_rotation": {
            "model": lin,
            "x": torch.randn(n, 64, generator=g),
            "y": torch.randn(n, 64, generator=g),
            "loss": mse,
            "kw": {},
            "wd": 0.0,
        },
    }


def bench(name: str, wl: dict[str, Any], reps: int, every: int) -> dict[str, Any]:
    model, x, y, loss_fn = wl["model"], wl["x"], wl["y"], wl["loss"]
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=wl["wd"])
    syms = nf.find_symmetries(model, x[:16])

    def step() -> None:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    step()  # warm up, creates the momentum buffers
    tp = EquilibriumTeleport(
        model,
        syms,
        loss_fn,
        lr=0.5,
        batch_size=32,
        weight_decay=wl["wd"] / 2,
        optimizer=opt,
        **wl["kw"],
    )
    t_step = _median_time(step, reps)
    t_stats = _median_time(
        lambda: nf.collect_stats(
            model,
            syms,
            loss_fn,
            x,
            y,
            level="solve",
            **{k: v for k, v in wl["kw"].items()},
        ),
        reps,
    )
    with warnings.catch_warnings():
        # Timing only: the BatchNorm workload's teleport is not kept within an eps tolerance.
        warnings.simplefilter("ignore", nf.EpsWarning)
        t_tele = _median_time(lambda: tp.teleport(x, y), reps)
    has_diag = any(s.commuting for s in syms)
    t_gn = (
        _median_time(lambda: gradient_norm_teleport(model, syms, loss_fn, x, y, steps=10), reps)
        if has_diag
        else float("nan")
    )
    return {
        "workload": name,
        "symmetries": [s.family.value for s in syms],
        "step_s": t_step,
        "stats_s": t_stats,
        "teleport_s": t_tele,
        "solve_and_apply_s": max(t_tele - t_stats, 0.0),
        "teleport_over_step": t_tele / t_step,
        f"amortised_every_{every}": t_tele / (every * t_step),
        "gradnorm_teleport_s": t_gn,
        "gradnorm_over_step": t_gn / t_step,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--tiny", action="store_true", help="toy sizes (smoke test)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--every", type=int, default=100)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    reps = args.reps or (2 if args.quick else 5)
    rows = [bench(k, v, reps, args.every) for k, v in _workloads(args.tiny).items()]
    cols = ["workload", "step_s", "stats_s", "teleport_s", "teleport_over_step"]
    cols += [f"amortised_every_{args.every}", "gradnorm_teleport_s", "gradnorm_over_step"]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in cols))
    return {"rows": rows, "reps": reps, "threads": torch.get_num_threads()}


if __name__ == "__main__":
    main(sys.argv[1:])

"""Equilibrium solve benchmarks (issue #15).

Default: cold vs warm-started solve on the MLP benchmark (784-1024-1024-10, batch 256).
Solves once, trains ``--steps`` SGD steps, then solves the new problem from the identity
(cold) and from the first solution (warm, ``solve_equilibrium(..., init=...)``), side by side
in one process, and checks that both give the same λ*.

With ``--mlp``, ``--vgg``, ``--resnet50`` or ``--gpt2``: the workload (see
:func:`build_workload`) is built once, then ``solve_equilibrium`` runs ``--reps`` interleaved
repetitions per solver (``--solvers cg,dense`` by default: the matrix-free Newton–CG and the
dense Newton reference; the token model has rotations only, so ``auto``), printing the median
time, every time, the peak-RSS increase of one solve (Linux VmHWM reset before each solve),
the iterations, and the largest difference between the solvers' solutions. Detection and
statistics are timed once, for context. The load average before and after is printed.

Usage::

    PYTHONPATH=src python benchmarks/bench_solver.py [--steps 10] [--tiny]
    PYTHONPATH=src python benchmarks/bench_solver.py --mlp --vgg --resnet50 --gpt2 [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
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


def resnet50(num_classes: int = 10, tiny: bool = False) -> nn.Module:
    """Hugging Face ResNet-50 (``ResNetModel(ResNetConfig())``, random init) + a linear head.

    ``tiny``: a two-stage bottleneck ResNet of width 8–16 (smoke test).
    """
    import transformers as T

    cfg = (
        T.ResNetConfig(embedding_size=8, hidden_sizes=[16, 32], depths=[1, 1])
        if tiny
        else T.ResNetConfig()
    )

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = T.ResNetModel(cfg)
            self.head = nn.Linear(cfg.hidden_sizes[-1], num_classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.body(x).pooler_output.flatten(1))

    return Net()


def _load_module(name: str) -> Any:
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_workload(name: str, tiny: bool) -> dict[str, Any]:
    """Model, symmetries, reference (or hooks) statistics and solver keywords of a workload.

    * ``mlp``: the MLP above (2048 strongly coupled generators), hooks statistics
      (``level="solve"``);
    * ``vgg``: VGG11-bn built by hand, eval mode, 32×32 inputs, batch 16 (tiny: batch 4);
    * ``resnet50``: HF ResNet-50 + Linear(2048, 10), eval mode, 64×64 inputs, batch 4;
    * ``gpt2``: the token model of ``bench_tokens.py`` (4 layers, width 256, 8 heads, batch
      8 × 128 tokens; tiny: 1 layer, width 32, 2 heads, 2 × 16 tokens), ``level="solve"``.

    Symmetries from ``nf.find_symmetries`` (BatchNorm-affine rescalings included).
    """
    import warnings

    torch.manual_seed(0)
    t0 = time.perf_counter()
    if name == "mlp":
        d_in, width, batch = (20, 16, 32) if tiny else (784, 1024, 256)
        m = nn.Sequential(
            nn.Linear(d_in, width),
            nn.ReLU(),
            nn.Linear(width, width),
            nn.ReLU(),
            nn.Linear(width, 10),
        )
        x, y = torch.randn(batch, d_in), torch.randint(0, 10, (batch,))
        syms = nf.find_symmetries(m, x)
        t_detect = time.perf_counter() - t0
        t0 = time.perf_counter()
        st = nf.collect_stats(m, syms, nn.CrossEntropyLoss(), x, y, level="solve")
        kw: dict[str, Any] = {"lr": 0.05, "batch_size": batch, "weight_decay": 1e-4}
    elif name == "gpt2":
        bt = _load_module("bench_tokens")
        if tiny:
            m, syms, x, y = bt.build("cpu", 64, layers=1, width=32, heads=2, batch=2, tokens=16)
        else:
            m, syms, x, y = bt.build("cpu", 1024)
        t_detect = time.perf_counter() - t0
        t0 = time.perf_counter()
        st = nf.collect_stats(m, syms, bt.loss_fn, x, y, level="solve")
        kw = {"lr": 0.01, "batch_size": int(x.shape[0]), "weight_decay": 1e-2}
    else:
        if name == "vgg":
            m, batch, size = vgg11_bn().eval(), (4 if tiny else 16), 32
        elif name == "resnet50":
            m, batch, size = resnet50(tiny=tiny).eval(), 4, (16 if tiny else 64)
        else:
            raise ValueError(f"workload {name!r}: expected 'mlp', 'vgg', 'resnet50' or 'gpt2'.")
        x, y = torch.randn(batch, 3, size, size), torch.randint(0, 10, (batch,))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # transformers' deprecation notices under tracing
            syms = nf.find_symmetries(m, x)
        t_detect = time.perf_counter() - t0
        t0 = time.perf_counter()
        st = nf.collect_stats(m, syms, nn.CrossEntropyLoss(), x, y, estimator="reference")
        kw = {"lr": 0.05, "batch_size": batch, "weight_decay": 5e-4}
    return {
        "syms": syms,
        "stats": st,
        "kw": kw,
        "detect_s": t_detect,
        "stats_s": time.perf_counter() - t0,
    }


def _status_mb(field: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def _reset_peak() -> float | None:
    """Linux: reset the peak RSS (VmHWM) to the current RSS; returns that RSS in MiB."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return _status_mb("VmRSS")


def _max_diff(a: nf.EquilibriumSolution, b: nf.EquilibriumSolution) -> float:
    return max(
        (
            float((torch.as_tensor(a.elements[k]) - torch.as_tensor(v)).abs().max())
            for k, v in b.elements.items()
        ),
        default=0.0,
    )


def time_solves(wl: dict[str, Any], methods: list[str], reps: int) -> dict[str, Any]:
    """Interleaved repetitions of ``solve_equilibrium(..., solver=method)`` per method.

    The order of the methods rotates each repetition. Per method: median and all times, the
    largest peak-RSS increase over one solve (Linux VmHWM reset before each solve; None
    elsewhere), Newton iterations or sweeps, convergence; and the largest difference of the
    solutions' elements between the methods.
    """
    times: dict[str, list[float]] = {m: [] for m in methods}
    peak: dict[str, float | None] = dict.fromkeys(methods)
    sols: dict[str, nf.EquilibriumSolution] = {}
    for r in range(reps):
        for meth in methods[r % len(methods) :] + methods[: r % len(methods)]:
            base = _reset_peak()
            t = time.perf_counter()
            sol = nf.solve_equilibrium(
                wl["syms"], wl["stats"], **wl["kw"], options=nf.SolveOptions(solver=meth)
            )
            times[meth].append(time.perf_counter() - t)
            hwm = _status_mb("VmHWM")
            if base is not None and hwm is not None:
                peak[meth] = max(peak[meth] or 0.0, hwm - base)
            sols[meth] = sol
    first = sols[methods[0]]
    return {
        "median_s": {m: statistics.median(v) for m, v in times.items()},
        "times_s": times,
        "peak_mb": peak,
        "iterations": {m: s.iterations for m, s in sols.items()},
        "converged": {m: s.converged for m, s in sols.items()},
        "max_abs_diff": max((_max_diff(first, s) for s in sols.values()), default=0.0),
        "generators": sum(getattr(s, "num_generators", 0) for s in wl["syms"]),
        "kinds": sorted({type(s).__name__ for s in wl["syms"]}),
    }


def bench_workload(name: str, *, reps: int, tiny: bool, methods: list[str]) -> dict[str, Any]:
    """Build ``name`` and time its solves; prints one line per method."""
    load0 = os.getloadavg()[0]
    wl = build_workload(name, tiny)
    res = time_solves(wl, methods, reps)
    res.update(
        workload=name,
        symmetries=len(wl["syms"]),
        detect_s=wl["detect_s"],
        stats_s=wl["stats_s"],
        threads=torch.get_num_threads(),
        load=(load0, os.getloadavg()[0]),
    )
    print(
        f"{name}: {res['symmetries']} symmetries ({', '.join(res['kinds'])}), "
        f"{res['generators']} diagonal generators; detect {res['detect_s']:.1f} s, "
        f"statistics {res['stats_s']:.1f} s; {res['threads']} threads, load "
        f"{res['load'][0]:.1f} → {res['load'][1]:.1f}"
    )
    for m in methods:
        pk = res["peak_mb"][m]
        ts = ", ".join(f"{t:.2f}" for t in res["times_s"][m])
        print(
            f"  solver={m}: median {res['median_s'][m]:.2f} s ({ts}), "
            f"{res['iterations'][m]} it., converged={res['converged'][m]}, peak ΔRSS "
            + ("n/a" if pk is None else f"{pk:.0f} MiB")
        )
    if len(methods) > 1:
        print(f"  max |Δ element| between solvers: {res['max_abs_diff']:.1e}")
    return res


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=10, help="SGD steps between the two solves")
    ap.add_argument("--tiny", action="store_true", help="toy sizes (smoke test)")
    ap.add_argument("--mlp", action="store_true", help="the MLP workload, solvers compared")
    ap.add_argument("--vgg", action="store_true", help="the VGG11-bn workload instead")
    ap.add_argument("--resnet50", action="store_true", help="the HF ResNet-50 workload instead")
    ap.add_argument("--gpt2", action="store_true", help="the GPT-2 token workload instead")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions per solver")
    ap.add_argument(
        "--solvers",
        default="cg,dense",
        help="comma-separated solver= values to compare (default cg,dense; gpt2: auto)",
    )
    args = ap.parse_args(argv)
    chosen = [w for w in ("mlp", "vgg", "resnet50", "gpt2") if getattr(args, w)]
    if chosen:
        out = {}
        for w in chosen:
            methods = args.solvers.split(",")
            if w == "gpt2" and args.solvers == "cg,dense":
                methods = ["auto"]  # rotations only: no joint diagonal Newton solve
            out[w] = bench_workload(w, reps=args.reps, tiny=args.tiny, methods=methods)
        return out
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

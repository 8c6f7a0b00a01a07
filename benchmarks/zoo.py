"""Zoo benchmark: symmetry detection, coverage and teleport on small real architectures.

```
python benchmarks/zoo.py [--markdown] [--reps N]
```

For each model of ``tests/real_models.py`` (GPT-2, BERT, Llama, ViT, ResNet, ConvNeXt from
Hugging Face ``transformers`` with tiny configs; PyTorch's transformer layers; a fused-qkv
attention; a ReLU6 block), in eval mode (BatchNorm models also in train mode):

* ``params``: trainable parameters; ``rescaling / scale / rotation``: symmetries found;
* ``covered``: share of the parameters (coordinates) acted on by some symmetry;
* ``detect s``: median wall time of ``find_symmetries`` over ``--reps`` runs;
* ``stats ×``: median ``collect_stats(estimator="reference")`` time over the median plain
  forward+backward (loss: mean square of the outputs against random targets), ``solve s``:
  time of ``solve_equilibrium``; "n/a" with the exception when a step does not run on that
  model (the reference estimator refuses BatchNorm in training mode, whose per-sample
  gradients are not defined);
* ``Δ eval / Δ train``: relative change of the outputs (float64) after teleporting with a
  random group element of size 0.5 for every symmetry, scale invariances clipped to the eps
  tolerance 1e-6 by ``noetherflow.symmetry.eps.clip_to_eps``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import real_models as RM

from noetherflow import collect_stats, find_symmetries
from noetherflow.equilibrium import EquilibriumSolution, solve_equilibrium
from noetherflow.symmetry._fx.capture import flat_outputs
from noetherflow.symmetry.coverage import covered_mask
from noetherflow.symmetry.eps import clip_to_eps
from noetherflow.symmetry.set import SymmetrySet
from noetherflow.teleport import teleport

BN_MODELS = ("resnet", "relu6_block")


def _to64(x: Any) -> Any:
    if isinstance(x, tuple):
        return tuple(_to64(t) for t in x)
    return x.to(torch.float64) if x.is_floating_point() else x


def _out(model: nn.Module, args: tuple[Any, ...], train: bool) -> Tensor:
    model.train(train)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return flat_outputs(model(*args))


def _covered(model: nn.Module, syms: SymmetrySet) -> float:
    total = covered = 0
    for p in model.parameters():
        mask = torch.zeros(p.shape, dtype=torch.bool)
        for s in syms:
            m = covered_mask(s, p)
            if m is not None:
                mask |= m
        total += p.numel()
        covered += int(mask.sum())
    return covered / max(total, 1)


def _teleport_change(model: nn.Module, x: Any, train: bool) -> tuple[float, float]:
    m64 = copy.deepcopy(model).to(torch.float64).train(train)
    x64 = _to64(x)
    args = x64 if isinstance(x64, tuple) else (x64,)
    syms = find_symmetries(m64, x64)
    gen = torch.Generator().manual_seed(0)
    sol = EquilibriumSolution(
        syms=syms,
        steps=[(i, s.random_element(0.5, gen)) for i, s in enumerate(syms)],
        elements={},
        distance={},
    )
    sol, _ = clip_to_eps(m64, sol, x64, tolerance=1e-6)
    before = {t: _out(copy.deepcopy(m64), args, t) for t in (False, True)}
    teleport(m64, sol)
    return tuple(  # type: ignore[return-value]
        float((_out(copy.deepcopy(m64), args, t) - before[t]).norm() / before[t].norm())
        for t in (False, True)
    )


def _stats_and_solve(model: nn.Module, x: Any, syms: SymmetrySet, reps: int) -> tuple[str, str]:
    args = x if isinstance(x, tuple) else (x,)
    out = flat_outputs(model(*args))
    n = (args[0].shape[0]) if isinstance(args[0], Tensor) else 1
    y = torch.randn(n, out.numel() // n)

    def loss_fn(o: Any, t: Tensor) -> Tensor:
        return (flat_outputs(o).reshape(t.shape) - t).square().mean()

    try:
        plain_t, stats_t = [], []
        for _ in range(reps + 1):  # the first repetition warms up and is dropped
            t0 = time.perf_counter()
            model.zero_grad()
            loss_fn(model(*args), y).backward()
            plain_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            stats = collect_stats(model, syms, loss_fn, x, y, estimator="reference")
            stats_t.append(time.perf_counter() - t0)
        ratio = statistics.median(stats_t[1:]) / statistics.median(plain_t[1:])
    except Exception as exc:  # report, do not hide: the table says why
        return f"n/a ({type(exc).__name__})", "n/a"
    try:
        t0 = time.perf_counter()
        solve_equilibrium(syms, stats, lr=0.1, batch_size=n, weight_decay=1e-3)
        solve = f"{time.perf_counter() - t0:.3f}"
    except Exception as exc:
        solve = f"n/a ({type(exc).__name__})"
    return f"{ratio:.1f}", solve


def run(reps: int) -> list[dict[str, Any]]:
    rows = []
    for name, factory in RM.MODELS.items():
        for train in (False, True) if name in BN_MODELS else (False,):
            torch.manual_seed(0)
            model, x = factory()
            model.train(train)
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                syms = find_symmetries(model, x)
                times.append(time.perf_counter() - t0)
            fam = {f: sum(1 for s in syms if s.family.value == f) for f in ("rescaling", "scale")}
            fam["rotation"] = sum(1 for s in syms if s.family.value == "rotation")
            stats, solve = _stats_and_solve(model, x, syms, reps)
            d_eval, d_train = _teleport_change(model, x, train)
            rows.append(
                {
                    "model": f"{name} ({'train' if train else 'eval'})",
                    "params": sum(p.numel() for p in model.parameters() if p.requires_grad),
                    **fam,
                    "covered": _covered(model, syms),
                    "detect_s": statistics.median(times),
                    "stats_x": stats,
                    "solve_s": solve,
                    "d_eval": d_eval,
                    "d_train": d_train,
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="detection repetitions (median)")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = run(args.reps)
    head = (
        "| model | params | rescaling | scale | rotation | covered | detect s | stats × | "
        "solve s | Δ eval | Δ train |"
    )
    print(head)
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['model']} | {r['params']:,} | {r['rescaling']} | {r['scale']} | "
            f"{r['rotation']} | {r['covered']:.0%} | {r['detect_s']:.3f} | {r['stats_x']} | "
            f"{r['solve_s']} | {r['d_eval']:.1e} | {r['d_train']:.1e} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

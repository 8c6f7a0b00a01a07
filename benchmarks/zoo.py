"""Zoo benchmark: detection, statistics, solve and teleport on small real architectures.

```
OMP_NUM_THREADS=1 python benchmarks/zoo.py [--reps N] [--only NAME ...] [--large-gpt2]
```

For each model of ``tests/real_models.py`` (GPT-2, BERT, Llama, ViT, ResNet, ConvNeXt from
Hugging Face ``transformers`` with tiny configs, random init; PyTorch's transformer layers; a
fused-qkv attention; a ReLU6 block), in eval mode (BatchNorm models also in train mode):

* ``params``: trainable parameters; ``rescaling / scale / rotation``: symmetries found;
* ``covered``: share of the parameters (coordinates) acted on by some symmetry;
* ``detect s``: median wall time of ``find_symmetries`` over ``--reps`` runs;
* ``stats ×``: median ``collect_stats`` time over the median plain forward+backward (the two
  interleaved, ``--reps`` repetitions after one warm-up; loss: mean square of the outputs
  against random targets), with the estimator used: ``hooks`` where it runs, else
  ``reference`` (torch.func), else ``microbatch`` (micro-batches of 2: BatchNorm in training
  mode);
* ``solve s``: one ``solve_equilibrium`` (η = 0.1, S = batch, γ = 1e-3, continuous time);
* ``Δ eval / Δ train``: relative change of the outputs (float64) after teleporting a float64
  copy to its solved equilibrium, scale invariances kept within the eps tolerance 1e-6
  (``solve_within_eps``: clipped, the others re-solved with the clipped ones held), in eval
  and train mode;
* ``flows after/before``: ‖all flows‖ at the teleported point over ‖all flows‖ before (same
  batch, estimator and hyper-parameters; float64). Clipped scale invariances and directions
  at infinity keep part of their flow;
* ``free flows``: the same ratio over the generators that are neither clipped nor at
  infinity (a rotation or dense symmetry counts whole), which the teleport should zero.

``--large-gpt2`` also times ``find_symmetries`` once on ``GPT2Model(GPT2Config())`` (12
layers, width 768, 12 heads, random init) on 2 × 16 tokens.
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

from noetherflow import collect_stats, find_symmetries, noether_flow
from noetherflow.equilibrium import solve_equilibrium
from noetherflow.symmetry._fx.capture import flat_outputs
from noetherflow.symmetry.coverage import covered_mask
from noetherflow.symmetry.set import SymmetrySet
from noetherflow.teleportation.apply import teleport
from noetherflow.teleportation.eps import solve_within_eps

BN_MODELS = ("resnet", "relu6_block")
ESTIMATORS = ("hooks", "reference", "microbatch")
HYPER = {"lr": 0.1, "weight_decay": 1e-3}


def _to64(x: Any) -> Any:
    if isinstance(x, tuple):
        return tuple(_to64(t) for t in x)
    return x.to(torch.float64) if x.is_floating_point() else x


def _args(x: Any) -> tuple[Any, ...]:
    return x if isinstance(x, tuple) else (x,)


def _out(model: nn.Module, x: Any, train: bool) -> Tensor:
    m = copy.deepcopy(model).train(train)  # train-mode BatchNorm moves its running statistics
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return flat_outputs(m(*_args(x)))


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


class _Problem:
    """A model, its batch and random targets; the loss is the mean square of the outputs."""

    def __init__(self, model: nn.Module, x: Any) -> None:
        self.model, self.x = model, x
        out = flat_outputs(model(*_args(x)))
        self.n = int(_args(x)[0].shape[0])
        gen = torch.Generator().manual_seed(0)
        self.y = torch.randn(self.n, out.numel() // self.n, generator=gen, dtype=out.dtype)

    def loss(self, out: Any, t: Tensor) -> Tensor:
        return (flat_outputs(out).reshape(t.shape) - t).square().mean()

    def stats(self, syms: SymmetrySet, estimator: str) -> Any:
        mb = 2 if estimator == "microbatch" else 1
        return collect_stats(
            self.model, syms, self.loss, self.x, self.y, estimator=estimator, micro_batch_size=mb
        )

    def estimator(self, syms: SymmetrySet) -> str:
        errors = []
        for est in ESTIMATORS:
            try:
                self.stats(syms, est)
                return est
            except Exception as exc:  # the next estimator; the table names the one used
                errors.append(f"{est}: {type(exc).__name__}")
        raise RuntimeError("; ".join(errors))

    def plain(self) -> None:
        self.model.zero_grad()
        self.loss(self.model(*_args(self.x)), self.y).backward()


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _stats_ratio(prob: _Problem, syms: SymmetrySet, est: str, reps: int) -> float:
    plain, stats = [], []
    for _ in range(reps + 1):  # interleaved; the first repetition warms up and is dropped
        plain.append(_timed(prob.plain))
        stats.append(_timed(lambda: prob.stats(syms, est)))
    return statistics.median(stats[1:]) / statistics.median(plain[1:])


def _flow_norms(
    syms: SymmetrySet, stats: Any, n: int, held: dict[str, Tensor | None]
) -> tuple[float, float]:
    """‖all flows‖ and ‖flows of the generators not held‖ (:func:`_held`)."""
    fl = noether_flow(syms, stats, batch_size=n, **HYPER)
    every = torch.cat([v.reshape(-1) for v in fl.values()])
    free = []
    for k, v in fl.items():
        if k not in held:
            free.append(v.reshape(-1))
        elif (mask := held[k]) is not None:  # None: the whole symmetry is held
            free.append(v.reshape(-1)[~mask])
    return float(every.norm()), float(torch.cat(free).norm())


def _held(sol: Any, report: Any) -> dict[str, Tensor | None]:
    """Diagonal generators clipped or at infinity (a mask; None: the whole symmetry)."""
    held: dict[str, Tensor | None] = {}
    sizes = {n: getattr(s, "num_generators", None) for n, s in sol.syms.items()}
    for c in report.clipped:
        held[c.name] = torch.zeros(sizes[c.name], dtype=torch.bool)
        held[c.name][c.generators] = True
    for r in sol.at_infinity:
        d = torch.as_tensor(r.direction).reshape(-1).cpu()
        if sizes[r.name] is None or d.numel() != sizes[r.name]:
            held[r.name] = None
        else:
            held[r.name] = held.get(r.name, torch.zeros(d.numel(), dtype=torch.bool)) | (d != 0)
    return held


def _teleport64(model: nn.Module, x: Any, train: bool, est: str) -> dict[str, float]:
    """Solve and teleport a float64 copy; output changes and the flow ratios."""
    m64 = copy.deepcopy(model).to(torch.float64).train(train)
    x64 = _to64(x)
    syms = find_symmetries(m64, x64)
    prob = _Problem(m64, x64)
    before_stats = prob.stats(syms, est)
    sol, report = solve_within_eps(
        m64, syms, before_stats, x64, tolerance=1e-6, batch_size=prob.n, **HYPER
    )
    held = _held(sol, report)
    outs = {t: _out(m64, x64, t) for t in (False, True)}
    all_before, free_before = _flow_norms(syms, before_stats, prob.n, held)
    teleport(m64, sol)
    res = {
        f"d_{'train' if t else 'eval'}": float((_out(m64, x64, t) - o).norm() / o.norm())
        for t, o in outs.items()
    }
    all_after, free_after = _flow_norms(syms, prob.stats(syms, est), prob.n, held)
    res["flows"], res["free_flows"] = all_after / all_before, free_after / free_before
    return res


def run(reps: int, only: list[str] | None = None) -> list[dict[str, Any]]:
    rows = []
    for name, factory in RM.MODELS.items():
        if only and name not in only:
            continue
        for train in (False, True) if name in BN_MODELS else (False,):
            torch.manual_seed(0)
            model, x = factory()
            model.train(train)
            times, syms = [], SymmetrySet()
            for _ in range(reps):
                t0 = time.perf_counter()
                syms = find_symmetries(model, x)
                times.append(time.perf_counter() - t0)
            row: dict[str, Any] = {
                "model": f"{name} ({'train' if train else 'eval'})",
                "params": sum(p.numel() for p in model.parameters() if p.requires_grad),
                **{f: sum(s.family.value == f for s in syms) for f in ("rescaling", "scale")},
                "rotation": sum(s.family.value == "rotation" for s in syms),
                "covered": _covered(model, syms),
                "detect_s": statistics.median(times),
            }
            prob = _Problem(model, x)
            try:
                est = prob.estimator(syms)
                row["stats"] = f"{_stats_ratio(prob, syms, est, reps):.1f} ({est})"
                stats = prob.stats(syms, est)
                t0 = time.perf_counter()
                sol = solve_equilibrium(syms, stats, batch_size=prob.n, **HYPER)
                row["solve"] = f"{time.perf_counter() - t0:.3f}" + ("" if sol.converged else "*")
                row.update(_teleport64(model, x, train, est))
            except Exception as exc:  # report, do not hide: the table says why
                row["stats"] = f"n/a ({type(exc).__name__}: {str(exc)[:60]})"
            rows.append(row)
            print(_line(row), flush=True)
    return rows


def _line(r: dict[str, Any]) -> str:
    def g(k: str, fmt: str) -> str:
        v = r.get(k)
        return "n/a" if v is None else format(v, fmt)

    return (
        f"| {r['model']} | {r['params']:,} | {r['rescaling']} | {r['scale']} | {r['rotation']} | "
        f"{r['covered']:.0%} | {r['detect_s']:.3f} | {r['stats']} | {r.get('solve', 'n/a')} | "
        f"{g('d_eval', '.1e')} | {g('d_train', '.1e')} | {g('flows', '.1e')} | "
        f"{g('free_flows', '.1e')} |"
    )


HEAD = (
    "| model | params | rescaling | scale | rotation | covered | detect s | stats × plain "
    "(estimator) | solve s | Δ eval | Δ train | flows after/before | free flows |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def large_gpt2() -> tuple[float, int, int]:
    """Seconds of one ``find_symmetries`` on GPT-2 small (random init), symmetries, params."""
    import transformers as T

    torch.manual_seed(0)
    model = T.GPT2Model(T.GPT2Config()).eval()
    ids = torch.randint(0, 50257, (2, 16))
    t0 = time.perf_counter()
    syms = find_symmetries(model, ids)
    return time.perf_counter() - t0, len(syms), sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="timing repetitions (median)")
    ap.add_argument("--only", nargs="*", help="model names of tests/real_models.py")
    ap.add_argument("--large-gpt2", action="store_true", help="also time detection on GPT-2 small")
    args = ap.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    print(HEAD)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run(args.reps, args.only)
        if args.large_gpt2:
            secs, k, n = large_gpt2()
            print(
                f"GPT-2 12 layers, width 768, 12 heads ({n:,} params): {k} symmetries, "
                f"find_symmetries {secs:.1f} s"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The solver's large products on PyTorch's BLAS and on NumPy's, side by side (issue 28).

```
python benchmarks/bench_blas.py [--reps 21] [--solve-layers 1] [--solve-rounds 9]
```

Part 1, one thread, float64: each product shape a coupled GPT-2 124M block computes in its
sweeps (the head-slice Grams and moves of ``c_attn``, the samples' factor products, the
rotation step's batched 64 × 64 algebra), timed through ``torch`` and through
``noetherflow._blas.matmul`` (NumPy's BLAS), medians of ``--reps``; ratio below 1: NumPy
faster. Which library is faster depends on the CPU and the BLAS builds: this is the check to
run on another machine. Part 2 (``--solve-layers`` > 0): ``solve_equilibrium`` on a GPT-2 of
that many full-width blocks (4 × 128 tokens), one thread, switching
``sweep_options(numpy_blas=...)`` between solves (order alternating, one warm-up solve
each), medians of ``--solve-rounds``, and how far the two solutions' distances lie apart.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from noetherflow import _blas


def _median_ms(fn: Callable[[], Any], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def _shapes() -> dict[str, tuple[Tensor, Tensor]]:
    g = torch.Generator().manual_seed(0)

    def r(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    heads = r(768, 2304).view(768, 36, 64).transpose(0, 1)  # c_attn's head slices
    rows = r(512, 2304).view(512, 36, 64).transpose(0, 1)  # the samples' output factor
    tri = torch.linalg.qr(r(4, 768, 128), mode="r")[1]  # R factors (column-major)
    return {
        "slice Grams [36, 64, 768]·[36, 768, 64]": (heads.mT, heads),
        "slice moves [36, 768, 64]·[36, 64, 64]": (heads, r(36, 64, 64)),
        "factor product [4, 128, 128]·[4, 128, 2304]": (tri, r(4, 128, 2304)),
        "sample Grams [36, 64, 512]·[36, 512, 64]": (rows.mT, rows),
        "T × T Grams [4, 128, 2304]·[4, 2304, 128]": (r(4, 128, 2304), r(4, 2304, 128)),
        "d × d algebra [24, 64, 64]·[24, 64, 64]": (r(24, 64, 64), r(24, 64, 64)),
    }


def shapes(reps: int) -> list[dict[str, Any]]:
    rows = []
    with _blas.one_thread():
        for name, (a, b) in _shapes().items():
            t = _median_ms(lambda a=a, b=b: torch.matmul(a, b), reps)
            n = _median_ms(lambda a=a, b=b: _blas.matmul(a, b), reps)
            rows.append({"product": name, "torch_ms": t, "numpy_ms": n, "ratio": n / t})
            print(f"{name:46s} torch {t:7.2f} ms  numpy {n:7.2f} ms  ratio {n / t:.2f}")
    return rows


def solve(layers: int, rounds: int) -> dict[str, Any]:
    from gpt2_124m import BATCH, GAMMA, LR, build, loss_fn

    import noetherflow as nf
    from noetherflow._sweep_plan import sweep_options

    model, x, y = build(False, layers=layers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        syms = nf.find_symmetries(model, x[:2, :16])
    st = nf.collect_stats(model, syms, loss_fn, x, y, level="solve")

    def run(on: bool) -> Any:
        with sweep_options(numpy_blas=on):
            return nf.solve_equilibrium(syms, st, lr=LR, batch_size=BATCH, weight_decay=GAMMA)

    sol = {on: run(on) for on in (False, True)}  # warm-up, and the two solutions
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(rounds):
        for on in (False, True) if i % 2 else (True, False):
            t0 = time.perf_counter()
            run(on)
            times[on].append(time.perf_counter() - t0)
    a, b = sol[False], sol[True]
    gap = max(float((a.distance[k] - b.distance[k]).abs().max()) for k in a.distance)
    res = {
        "torch_s": statistics.median(times[False]),
        "numpy_s": statistics.median(times[True]),
        "sweeps": (a.iterations, b.iterations),
        "relative_gap": gap / max(a.max_distance(), 1e-300),
    }
    print(
        f"solve, {layers} layer(s), 1 thread: torch {res['torch_s']:.3f} s, numpy "
        f"{res['numpy_s']:.3f} s (medians of {rounds}), ratio "
        f"{res['numpy_s'] / res['torch_s']:.2f}; sweeps {a.iterations} / {b.iterations}; "
        f"distances within {res['relative_gap']:.1e} (relative)"
    )
    return res


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--solve-layers", type=int, default=1, help="0: the shapes only")
    ap.add_argument("--solve-rounds", type=int, default=9)
    args = ap.parse_args(argv)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, one thread")
        out: dict[str, Any] = {"shapes": shapes(args.reps)}
        if args.solve_layers > 0:
            out["solve"] = solve(args.solve_layers, args.solve_rounds)
        return out
    finally:
        torch.set_num_threads(before)


if __name__ == "__main__":
    main()

"""Benchmark: cost of gradient statistics (hooks vs torch.func reference) against plain fwd+bwd.

Four workloads, timed side by side in one run with interleaved repetitions (median seconds;
the ratio of the fastest repetitions is shown too, since a shared VM adds noise that only
slows runs down):

(a) MLP 784-1024-1024-10, ReLU, batch 256, cross-entropy; the two per-neuron Rescalings.
(b) two-layer linear net d_x = d_y = 100, hidden d = 2000, batch 100, MSE; one DoubleRotation.
(c) token model [B=32, T=128, 256]: Linear → ReLU → Linear → Linear, MSE; a Rescaling and a
    DoubleRotation (they share the middle weight, so the set is coupled and the hooks also
    keep per-sample gradients).
(d) the MLP of (a) with its last pair linear (784-1024 ReLU 1024-10, no ReLU between the last
    two maps), batch 256, cross-entropy; one DoubleRotation of width 1024: full d×d
    statistics on the MLP.

For each: plain forward+backward, ``collect_stats`` with ``estimator="hooks"`` at the levels
``"neuron"`` (per-neuron sums: flows), ``"solve"`` (what the solver needs) and ``"diag"``
(per-coordinate E[g²] of every parameter; the default), and ``estimator="reference"``
(torch.func vmap(grad)). Peak memory is the
increase of the process's peak resident set size (``ru_maxrss``) caused by ONE call of the
method, measured in a fresh subprocess per (workload, method) after the model and batch are
built and torch.func is imported. It includes allocator caching and one-time buffers; it is
CPU RSS, not GPU memory.

Usage::

    python benchmarks/bench_stats.py                 # full sizes
    python benchmarks/bench_stats.py --quick         # small sizes, few repetitions
    python benchmarks/bench_stats.py --reps 9 --threads 2 --no-memory
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.func  # imported before the memory baseline
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from torch import Tensor, nn

import noetherflow as nf

METHODS = ("plain", "hooks-neuron", "hooks-solve", "hooks", "reference")


@dataclass
class Workload:
    key: str
    title: str
    model: nn.Module
    syms: nf.SymmetrySet
    loss_fn: Callable[[Tensor, Tensor], Tensor]
    x: Tensor
    y: Tensor
    ref_reps: int | None  # cap on reference repetitions (None: same as the others)


def _sizes(quick: bool, tiny: bool) -> dict[str, Any]:
    if tiny:
        return {"mlp": (32, 16, 16, 8), "lin": (6, 12, 6, 8), "tok": (4, 6, 8)}
    if quick:
        return {"mlp": (784, 128, 128, 64), "lin": (100, 400, 100, 50), "tok": (8, 32, 64)}
    return {"mlp": (784, 1024, 1024, 256), "lin": (100, 2000, 100, 100), "tok": (32, 128, 256)}


def build_workloads(quick: bool = False, tiny: bool = False, seed: int = 0) -> list[Workload]:
    torch.manual_seed(seed)
    sz = _sizes(quick, tiny)
    out: list[Workload] = []

    d_in, h, h2, mlp_bs = sz["mlp"]
    mlp = nn.Sequential(
        nn.Linear(d_in, h), nn.ReLU(), nn.Linear(h, h2), nn.ReLU(), nn.Linear(h2, 10)
    )
    syms = nf.SymmetrySet([nf.Rescaling(mlp[0], mlp[2]), nf.Rescaling(mlp[2], mlp[4])])
    out.append(
        Workload(
            "mlp",
            f"(a) MLP {d_in}-{h}-{h2}-10 ReLU, batch {mlp_bs}, CE, 2× Rescaling",
            mlp,
            syms,
            nn.functional.cross_entropy,
            torch.randn(mlp_bs, d_in),
            torch.randint(0, 10, (mlp_bs,)),
            ref_reps=2,
        )
    )

    dx, d, dy, bs = sz["lin"]
    lin = nn.Sequential(nn.Linear(dx, d, bias=False), nn.Linear(d, dy, bias=False))
    out.append(
        Workload(
            "linear",
            f"(b) linear {dx}-{d}-{dy}, batch {bs}, MSE, DoubleRotation",
            lin,
            nf.SymmetrySet([nf.DoubleRotation(lin[0], lin[1])]),
            nn.functional.mse_loss,
            torch.randn(bs, dx),
            torch.randn(bs, dy),
            ref_reps=5,
        )
    )

    b, t, w = sz["tok"]
    tok = nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.Linear(w, w))
    out.append(
        Workload(
            "token",
            f"(c) tokens B={b} T={t} width {w}, MSE, Rescaling + DoubleRotation",
            tok,
            nf.SymmetrySet([nf.Rescaling(tok[0], tok[2]), nf.DoubleRotation(tok[2], tok[3])]),
            nn.functional.mse_loss,
            torch.randn(b, t, w),
            torch.randn(b, t, w),
            ref_reps=5,
        )
    )

    lin_mlp = nn.Sequential(nn.Linear(d_in, h), nn.ReLU(), nn.Linear(h, h2), nn.Linear(h2, 10))
    out.append(
        Workload(
            "mlp_full",
            f"(d) MLP {d_in}-{h} ReLU {h2}-10 (last pair linear), batch {mlp_bs}, CE, "
            f"DoubleRotation d={h2}",
            lin_mlp,
            nf.SymmetrySet([nf.DoubleRotation(lin_mlp[2], lin_mlp[3])]),
            nn.functional.cross_entropy,
            torch.randn(mlp_bs, d_in),
            torch.randint(0, 10, (mlp_bs,)),
            ref_reps=2,
        )
    )
    return out


def run_method(wl: Workload, method: str, n: int | None = None) -> Any:
    """One call of ``method`` on the workload (optionally on the first ``n`` samples)."""
    x, y = (wl.x, wl.y) if n is None else (wl.x[:n], wl.y[:n])
    if method == "plain":
        wl.model.zero_grad(set_to_none=True)
        wl.loss_fn(wl.model(x), y).backward()
        wl.model.zero_grad(set_to_none=True)
        return None
    if method.startswith("hooks-"):  # "neuron": flows only; "solve": what the solver needs
        level = method.split("-", 1)[1]
        return nf.collect_stats(wl.model, wl.syms, wl.loss_fn, x, y, level=level)
    return nf.collect_stats(wl.model, wl.syms, wl.loss_fn, x, y, estimator=method)


def describe_levels(st: nf.GradStats) -> str:
    """What a GradStats holds: per-coordinate diagonals, d×d side matrices, per-sample grads."""
    parts = []
    if st.sq:
        n = sum(t.numel() for t in st.sq.values())
        parts.append(f"diag E[g²]: {n:,} coords")
    if st.sq_axis:
        n = sum(t.numel() for t in st.sq_axis.values())
        parts.append(f"per-neuron E[g²] sums: {n:,}")
    for w, u in st.side.values():
        parts.append(f"M_W {tuple(w.shape)} + M_U {tuple(u.shape)}")
    if st.samples:
        n = sum(t.numel() for t in st.samples.values())
        parts.append(f"per-sample grads: {n:,} floats")
    return "; ".join(parts)


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def time_all(workloads: list[Workload], reps: int) -> dict[str, dict[str, list[float]]]:
    """Interleaved repetitions: each rep runs every (workload, method), order rotated per rep."""
    times: dict[str, dict[str, list[float]]] = {w.key: {m: [] for m in METHODS} for w in workloads}
    for wl in workloads:  # warm-up on a small sub-batch (lazy init, vmap tracing machinery)
        for m in METHODS:
            run_method(wl, m, n=min(8, wl.x.shape[0]))
    for r in range(reps):
        for wl in workloads:
            k = r % len(METHODS)
            order = METHODS[k:] + METHODS[:k]
            for m in order:
                if m == "reference" and wl.ref_reps is not None and r >= wl.ref_reps:
                    continue
                times[wl.key][m].append(_timed(lambda wl=wl, m=m: run_method(wl, m)))
    return times


def _maxrss_mb() -> float:
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024.0 if sys.platform != "darwin" else kb / 2**20


def _proc_status_mb(field: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    """Linux: writing 5 to clear_refs resets VmHWM (the peak RSS) to the current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def memory_cell(key: str, method: str, quick: bool, tiny: bool, threads: int | None) -> float:
    """Run in a fresh process: peak-RSS increase (MiB) of one call of ``method``.

    The peak is reset after the workloads are built (Linux ``VmHWM``), so building the
    models does not mask the call's own peak; elsewhere ``ru_maxrss`` is the fallback.
    """
    if threads:
        torch.set_num_threads(threads)
    wl = next(w for w in build_workloads(quick, tiny) if w.key == key)
    if _reset_peak_rss():
        base = _proc_status_mb("VmRSS")
        run_method(wl, method)
        peak = _proc_status_mb("VmHWM")
        if base is not None and peak is not None:
            return peak - base
    base = _maxrss_mb()
    run_method(wl, method)
    return _maxrss_mb() - base


def measure_memory(key: str, method: str, quick: bool, tiny: bool, threads: int | None) -> float:
    cmd = [sys.executable, __file__, "--_mem-cell", f"{key}:{method}"]
    cmd += ["--quick"] * quick + ["--tiny"] * tiny
    if threads:
        cmd += ["--threads", str(threads)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=900)
    return float(json.loads(res.stdout.strip().splitlines()[-1])["delta_mb"])


def _fmt(v: float | None, spec: str) -> str:
    return "—" if v is None or not math.isfinite(v) else format(v, spec)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller sizes, 3 repetitions")
    p.add_argument("--tiny", action="store_true", help="toy sizes (smoke tests)")
    p.add_argument("--reps", type=int, default=None, help="repetitions (default 25, quick 3)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    p.add_argument("--_mem-cell", dest="mem_cell", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    quick = args.quick or args.tiny

    if args.mem_cell:
        key, method = args.mem_cell.split(":")
        delta = memory_cell(key, method, args.quick, args.tiny, args.threads)
        print(json.dumps({"delta_mb": delta}))
        return {"delta_mb": delta}

    if args.threads:
        torch.set_num_threads(args.threads)
    reps = args.reps or (3 if quick else 25)
    workloads = build_workloads(args.quick, args.tiny)
    levels = {
        (w.key, m): describe_levels(run_method(w, m, n=min(8, w.x.shape[0])))
        for w in workloads
        for m in METHODS
        if m.startswith("hooks")
    }
    times = time_all(workloads, reps)
    mem: dict[str, dict[str, float | None]] = {w.key: dict.fromkeys(METHODS) for w in workloads}
    if not args.no_memory:
        for w in workloads:
            for m in METHODS:
                mem[w.key][m] = measure_memory(w.key, m, args.quick, args.tiny, args.threads)

    results: dict[str, Any] = {"reps": reps, "threads": torch.get_num_threads(), "workloads": {}}
    table = Table(
        title=f"collect_stats cost (median of interleaved reps; torch threads "
        f"{torch.get_num_threads()})"
    )
    for col in (
        "workload",
        "method",
        "reps",
        "median s",
        "× plain",
        "× plain (min)",
        "ref / hooks",
        "peak ΔRSS MiB",
    ):
        table.add_column(col, justify="left" if col in ("workload", "method") else "right")
    for w in workloads:
        med = {m: statistics.median(times[w.key][m]) for m in METHODS}
        ratio = {m: med[m] / med["plain"] for m in METHODS}
        low = {m: min(times[w.key][m]) for m in METHODS}
        ratio_min = {m: low[m] / low["plain"] for m in METHODS}
        ref_over_hooks = med["reference"] / med["hooks"]
        results["workloads"][w.key] = {
            "title": w.title,
            "median_s": med,
            "ratio_to_plain": ratio,
            "ratio_to_plain_min": ratio_min,
            "ref_over_hooks": ref_over_hooks,
            "reps": {m: len(times[w.key][m]) for m in METHODS},
            "peak_rss_delta_mib": mem[w.key],
            "hooks_levels": levels[(w.key, "hooks")],
        }
        for i, m in enumerate(METHODS):
            table.add_row(
                w.title if i == 0 else "",
                escape(f"{m} [{levels[(w.key, m)]}]") if m.startswith("hooks") else m,
                str(len(times[w.key][m])),
                _fmt(med[m], ".4f"),
                _fmt(ratio[m], ".2f"),
                _fmt(ratio_min[m], ".2f"),
                _fmt(ref_over_hooks, ".1f") if m == "reference" else "",
                _fmt(mem[w.key][m], ".1f"),
                end_section=i == len(METHODS) - 1,
            )
    console = Console(width=160)
    console.print(table)

    mlp, full = results["workloads"]["mlp"], results["workloads"]["mlp_full"]

    def both(w: dict[str, Any], m: str) -> tuple[float, float]:
        return w["ratio_to_plain"][m], w["ratio_to_plain_min"][m]

    ref_full = full["ref_over_hooks"]
    targets = [
        ("(a) rescaling flows (level='neuron') ≤ 1.15× plain", *both(mlp, "hooks-neuron"), 1.15),
        (
            "(a) per-coordinate E[g²], every weight (level='diag') ≤ 1.35×",
            *both(mlp, "hooks"),
            1.35,
        ),
        ("(a) solver statistics (level='solve') ≤ 1.35× plain", *both(mlp, "hooks-solve"), 1.35),
        ("(d) full d×d matrices on the MLP ≤ 5× plain", *both(full, "hooks"), 5.0),
    ]
    tt = Table(title="Targets (met: by the median ratio)")
    tt.add_column("target")
    tt.add_column("median ratio", justify="right")
    tt.add_column("min ratio", justify="right")
    tt.add_column("met")
    results["targets"] = {}
    for name, val, val_min, bound in targets:
        ok = val <= bound
        tt.add_row(escape(name), _fmt(val, ".2f"), _fmt(val_min, ".2f"), "yes" if ok else "NO")
        results["targets"][name] = {"value": val, "value_min": val_min, "met": ok}
    name = "(d) reference / hooks for full statistics on the MLP ≥ 100×"
    tt.add_row(escape(name), _fmt(ref_full, ".1f"), "", "yes" if ref_full >= 100 else "NO")
    results["targets"][name] = {"value": ref_full, "met": ref_full >= 100}
    console.print(tt)
    return results


if __name__ == "__main__":
    main()

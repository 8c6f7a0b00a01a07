"""GPT-2 124M at the size people train (issue 28): detection, statistics, solve and monitor.

```
python benchmarks/gpt2_124m.py [--quick] [--threads 2] [--steps 30] [--reps 3] [--solve-reps 1]
                               [--phases detect,stats,solve,monitor] [--detect-batch 4x128]
                               [--optimizers sgdm,adamw] [--interleave block|step]
                               [--layers 12]
```

Hugging Face ``GPT2LMHeadModel(GPT2Config())`` (12 layers, width 768, 12 heads, vocabulary
50,257, 124,439,808 parameters, random init, dropout off), a batch of 4 × 128 random tokens,
cross-entropy on random next-token targets. ``--quick``: 2 layers, width 64, 2 heads,
vocabulary 512, 4 × 16 tokens (a smoke run in seconds); ``--layers N``: N blocks of the full
width (the same work per block, e.g. the solver's per-block cost in a shorter run). Phases,
in one process:

* ``detect``: one ``find_symmetries`` on the ``--detect-batch`` slice of the batch (default
  the whole batch): seconds and peak memory above the model (Linux ``VmHWM``, reset before
  the call; CPU RSS including the allocator's cache).
* ``stats``: a plain forward+backward and ``collect_stats(..., estimator="hooks")`` at
  ``level="solve"`` and ``"neuron"``, interleaved (``--reps`` rounds, order rotated), ratio of
  medians.
* ``solve``: one ``solve_equilibrium`` (η = 0.01, S = 4, γ = 0.01) on the ``"solve"`` statistics
  (the target's measure), then the same solve with ``SolveOptions(tol=1e-8)`` (labelled: what
  a looser tolerance saves, and how far its distances land from the default's).
* ``monitor``: for SGD with momentum and for AdamW, a plain training loop and the same loop with
  a default ``NoetherMonitor`` (``every=10``), each from the same initial weights and after one
  unmonitored warm-up step each (the first step's allocations are no cost of the monitor), run
  side by side in blocks of ``every`` steps (plain block, monitored block, …) for ``--steps``
  steps. The monitored run *includes its first record*; the ratio is the monitored time over
  the plain time, with the first record's own cost printed.

On a shared machine absolute times move with the load; the ratios are taken side by side in
one run, so load hits both alike (block to block, not exactly). ``main`` returns the
results as a dict (the smoke test reads it).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

import noetherflow as nf
from noetherflow.monitor import NoetherMonitor

LR, BATCH, GAMMA = 0.01, 4, 0.01
LOOSE_TOL = 1e-8  # the solve phase's second, labelled solve


class LM(nn.Module):
    """The GPT-2 language model returning its logits (the benchmark's loss reads them)."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x).logits


def build(
    quick: bool, seed: int = 0, layers: int | None = None
) -> tuple[nn.Module, Tensor, Tensor]:
    """The model (default GPT-2 config, or the quick one) and a batch (ids, next-token targets).

    ``layers``: that many blocks of the full width instead of 12 (a shorter run of the same
    per-block work).
    """
    import transformers as T

    torch.manual_seed(seed)
    size: dict[str, Any] = (
        {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 512, "n_positions": 32}
        if quick
        else {}
    )
    if layers is not None:
        size["n_layer"] = layers
    ids = {"bos_token_id": 0, "eos_token_id": 0} if quick else {}
    cfg = T.GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **size, **ids)
    model = LM(T.GPT2LMHeadModel(cfg))
    tokens = 16 if quick else 128
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randint(0, cfg.vocab_size, (BATCH, tokens), generator=g)
    y = torch.randint(0, cfg.vocab_size, (BATCH, tokens), generator=g)
    return model, x, y


def loss_fn(out: Tensor, y: Tensor) -> Tensor:
    return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def _status_mb(key: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def peak_mb(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """(fn(), seconds, peak RSS increase in MiB over the call; NaN without Linux's VmHWM)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        base = _status_mb("VmRSS")
    except OSError:
        base = None
    t0 = time.perf_counter()
    out = fn()
    secs = time.perf_counter() - t0
    peak = _status_mb("VmHWM")
    return out, secs, (peak - base) if base is not None and peak is not None else float("nan")


def phase_detect(model: nn.Module, x: Tensor, batch: str) -> tuple[nf.SymmetrySet, dict[str, Any]]:
    b, t = (int(v) for v in batch.split("x")) if batch else x.shape
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        syms, secs, mb = peak_mb(lambda: nf.find_symmetries(model, x[:b, :t]))
    kinds: dict[str, int] = {}
    for s in syms:
        kinds[s.family.value] = kinds.get(s.family.value, 0) + 1
    model_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    res = {
        "seconds": secs,
        "peak_mb": mb,
        "model_mb": model_mb,
        "symmetries": len(syms),
        "families": kinds,
        "inputs": f"{b}x{t}",
    }
    print(
        f"detect   {secs:8.2f} s  peak +{mb:.0f} MiB (model {model_mb:.0f} MiB)  "
        f"{len(syms)} symmetries {kinds} on {b}x{t} tokens"
    )
    return syms, res


def phase_stats(
    model: nn.Module, syms: nf.SymmetrySet, x: Tensor, y: Tensor, reps: int
) -> dict[str, Any]:
    def plain() -> None:
        model.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()

    runs: dict[str, Callable[[], Any]] = {"plain": plain}
    for lv in ("solve", "neuron"):
        runs[lv] = lambda lv=lv: nf.collect_stats(model, syms, loss_fn, x, y, level=lv)
    for fn in runs.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {k: [] for k in runs}
    order = list(runs)
    for r in range(reps):
        for k in order[r % len(order) :] + order[: r % len(order)]:
            t0 = time.perf_counter()
            runs[k]()
            times[k].append(time.perf_counter() - t0)
    base = statistics.median(times["plain"])
    _, _, mb = peak_mb(runs["solve"])
    res = {"plain_s": base, "peak_mb_solve": mb}
    line = f"stats    plain {base:.3f} s"
    for lv in ("solve", "neuron"):
        res[f"ratio_{lv}"] = statistics.median(times[lv]) / base
        line += f"  level={lv} {res[f'ratio_{lv}']:.2f}x"
    print(line + f"  (median of {reps}; level=solve peak +{mb:.0f} MiB)")
    return res


def _cpu_and_faults() -> tuple[float, int]:
    """User CPU seconds and minor page faults of this process so far (0, 0 without getrusage)."""
    try:
        import resource
    except ImportError:  # not on Windows
        return 0.0, 0
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_minflt


def phase_solve(
    model: nn.Module, syms: nf.SymmetrySet, x: Tensor, y: Tensor, repeats: int = 1
) -> dict[str, Any]:
    st = nf.collect_stats(model, syms, loss_fn, x, y, level="solve")
    sol, secs, mb = peak_mb(
        lambda: nf.solve_equilibrium(syms, st, lr=LR, batch_size=BATCH, weight_decay=GAMMA)
    )
    print(
        f"solve    {secs:8.2f} s  peak +{mb:.0f} MiB  {len(syms)} symmetries, "
        f"converged={sol.converged}, {sol.iterations} iterations"
    )
    # the same solve again in this process (--solve-reps): a first solve pays for its
    # buffers and page faults, later ones reuse the allocator's memory
    again = []
    for i in range(1, repeats):
        cpu0, flt0 = _cpu_and_faults()
        t0 = time.perf_counter()
        nf.solve_equilibrium(syms, st, lr=LR, batch_size=BATCH, weight_decay=GAMMA)
        s = time.perf_counter() - t0
        cpu1, flt1 = _cpu_and_faults()
        again.append({"seconds": s, "user_cpu": cpu1 - cpu0, "minor_faults": flt1 - flt0})
        print(
            f"         again ({i + 1} of {repeats}): {s:.2f} s, user CPU {cpu1 - cpu0:.2f} s, "
            f"{flt1 - flt0} minor page faults"
        )
    # the same solve to a looser relative flow: what the tolerance costs (not the target's
    # measure, which is the default's: 1e-12, floored at 1e-10)
    opts = nf.SolveOptions(tol=LOOSE_TOL)
    t0 = time.perf_counter()
    loose = nf.solve_equilibrium(
        syms, st, lr=LR, batch_size=BATCH, weight_decay=GAMMA, options=opts
    )
    loose_s = time.perf_counter() - t0
    gap = max(float((loose.distance[k] - sol.distance[k]).abs().max()) for k in sol.distance) / max(
        sol.max_distance(), 1e-300
    )
    print(
        f"         tol={LOOSE_TOL:g} (not the default): {loose_s:.2f} s, {loose.iterations} "
        f"iterations, distances within {gap:.1e} (relative) of the default's"
    )
    return {
        "seconds": secs,
        "peak_mb": mb,
        "converged": sol.converged,
        "iterations": sol.iterations,
        "loose_tol": {"tol": LOOSE_TOL, "seconds": loose_s, "iterations": loose.iterations},
        "again": again,
    }


def _optimizer(kind: str, params: Any) -> torch.optim.Optimizer:
    if kind == "sgdm":
        return torch.optim.SGD(params, lr=LR, momentum=0.9, weight_decay=GAMMA)
    return torch.optim.AdamW(params, lr=1e-4, weight_decay=GAMMA)


def phase_monitor(
    model: nn.Module,
    syms: nf.SymmetrySet,
    x: Tensor,
    y: Tensor,
    steps: int,
    kind: str,
    interleave: str = "block",
) -> dict[str, Any]:
    """Plain and monitored loops from the same weights, side by side in blocks of 10 steps
    (``interleave="step"``: one plain step, one monitored step, …)."""
    every = 10
    plain_m = copy.deepcopy(model)
    mon_m = copy.deepcopy(model)
    mapping = dict(zip(model.parameters(), mon_m.parameters(), strict=True))
    from noetherflow.symmetry.set import rebind_symmetry

    mon_syms = nf.SymmetrySet()
    for name, s in syms.items():
        s2 = rebind_symmetry(s, {id(a): b for a, b in mapping.items()})
        s2.label = name
        mon_syms.add(s2)
    opt_p = _optimizer(kind, plain_m.parameters())
    opt_m = _optimizer(kind, mon_m.parameters())
    # One unmonitored warm-up step for each loop: the first step's allocations (AdamW's
    # moments, the momentum buffers, the allocator's pages: ~4 s on AdamW) are the same for
    # both loops and no cost of the monitor. The monitored loop still starts with a record.
    for m, o in ((plain_m, opt_p), (mon_m, opt_m)):
        loss_fn(m(x), y).backward()
        o.step()
        o.zero_grad(set_to_none=True)
    mon = NoetherMonitor(
        mon_m,
        mon_syms,
        every=every,
        optimizer=opt_m,
        batch_size=BATCH,
        logging=nf.LogOptions(progress=False, tensorboard=False, formats=()),
    )

    def plain_block(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            loss_fn(plain_m(x), y).backward()
            opt_p.step()
            opt_p.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    def mon_block(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            with mon.track():
                loss = loss_fn(mon_m(x), y)
                loss.backward()
            mon.step(loss)
            opt_m.step()
            opt_m.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    tp: list[float] = []
    tm: list[float] = []
    done = 0
    while done < steps:
        n = min(every, steps - done)
        if interleave == "step":  # load that changes within a block hits both loops alike
            pairs = [(plain_block(1), mon_block(1)) for _ in range(n)]
            tp.append(sum(p for p, _ in pairs))
            tm.append(sum(m for _, m in pairs))
        else:
            tp.append(plain_block(n))
            tm.append(mon_block(n))
        done += n
    hist = mon.history
    first = float(hist["monitor_time"][0])
    ratio = sum(tm) / sum(tp)
    conv = hist.get("distance_converged")
    converged = None if conv is None or conv[0] != conv[0] else bool(conv[0])
    print(
        f"monitor  {kind:5s} {steps} steps ({interleave}s interleaved): plain {sum(tp):.2f} s, "
        f"monitored {sum(tm):.2f} s, "
        f"ratio {ratio:.3f} (first record {first:.2f} s = {first / (sum(tp) / steps):.1f} "
        f"plain steps; its distance converged: {converged})"
    )
    rec = ", ".join(f"{t:.2f}" for t in hist["monitor_time"])
    print(
        f"         blocks plain {[round(t, 2) for t in tp]} s, monitored "
        f"{[round(t, 2) for t in tm]} s; records' monitor_time {rec} s"
    )
    return {
        "ratio": ratio,
        "plain_s": sum(tp),
        "monitored_s": sum(tm),
        "first_record_s": first,
        "records_s": [float(t) for t in hist["monitor_time"]],
        "first_distance_converged": converged,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a small config: a smoke run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=None, help="blocks (default: the config's)")
    ap.add_argument("--steps", type=int, default=30, help="training steps per monitor loop")
    ap.add_argument("--reps", type=int, default=3, help="interleaved rounds of the stats phase")
    ap.add_argument(
        "--solve-reps", type=int, default=1, help="default solves in a row in the solve phase"
    )
    ap.add_argument("--phases", default="detect,stats,solve,monitor")
    ap.add_argument("--optimizers", default="sgdm,adamw", help="the monitor phase's optimizers")
    ap.add_argument("--detect-batch", default="", help="BxT slice for detection (default: all)")
    ap.add_argument(
        "--interleave",
        choices=("block", "step"),
        default="block",
        help="monitor phase: alternate the loops every 10 steps (block) or every step (step: "
        "fairer on a machine whose load changes within a block)",
    )
    args = ap.parse_args(argv)
    if args.solve_reps < 1:
        ap.error(f"--solve-reps {args.solve_reps}: expected at least 1 (1 = one solve)")
    torch.set_num_threads(args.threads)
    phases = [p for p in args.phases.split(",") if p]
    model, x, y = build(args.quick, layers=args.layers)
    n = sum(p.numel() for p in model.parameters())
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average "
        f"{load:.1f}; GPT-2 {n:,} parameters, batch {tuple(x.shape)}"
    )
    out: dict[str, Any] = {"params": n, "load": load}
    syms, out["detect"] = phase_detect(model, x, args.detect_batch)
    if "stats" in phases:
        out["stats"] = phase_stats(model, syms, x, y, args.reps)
    if "solve" in phases:
        out["solve"] = phase_solve(model, syms, x, y, args.solve_reps)
    if "monitor" in phases:
        out["monitor"] = {
            k: phase_monitor(model, syms, x, y, args.steps, k, args.interleave)
            for k in args.optimizers.split(",")
        }
    return out


if __name__ == "__main__":
    main()

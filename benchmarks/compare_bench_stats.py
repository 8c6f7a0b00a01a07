"""Side-by-side timing of ``bench_stats.py``'s workloads for two checkouts of the library.

Each checkout (a directory holding ``src/noetherflow`` and ``benchmarks/bench_stats.py``) gets
one long-lived worker process that imports *its own* library and benchmark script, builds the
workloads with the same seed (so the models and batches are identical) and warms them up. The
driver then asks the workers in turn to time one call of each (workload, method): within a
repetition the two versions run back to back, their order alternating, and the method order
rotates per repetition as in ``bench_stats.py``. Only one worker computes at a time (the other
waits on its pipe), so the two versions see the same machine load, and a drift in the load
over the run affects both alike. That makes the after/before ratio trustworthy on a shared
machine where absolute times are not.

Reported per (workload, method): the median time of each version, the ratio of the medians
(after / before), the median of the per-repetition paired ratios, and the ratio of the
fastest repetitions (noise only slows runs down). The load average before and after the run
is printed too.

Usage::

    python benchmarks/compare_bench_stats.py BEFORE_DIR AFTER_DIR --reps 9
    python benchmarks/compare_bench_stats.py BEFORE AFTER --reps 15 --ref-reps 3 --json r.json
    python benchmarks/compare_bench_stats.py BEFORE AFTER --quick --reps 3   # small sizes
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO

METHODS = ("plain", "hooks-neuron", "hooks-solve", "hooks", "reference")


def _worker(
    checkout: Path, quick: bool, tiny: bool, threads: int, inp: TextIO, out: TextIO
) -> None:
    """Worker loop: build and warm the workloads, then time one call per request line.

    Requests are ``"<workload> <method>"``; each answer is one JSON line ``{"s": seconds}``.
    The first line written is ``{"ready": ..., "noetherflow": <file of the imported package>}``.
    """
    spec = importlib.util.spec_from_file_location(
        "bench_stats", checkout / "benchmarks" / "bench_stats.py"
    )
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"no benchmarks/bench_stats.py in {checkout}")
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench_stats"] = bench  # dataclasses look their module up there
    spec.loader.exec_module(bench)
    import torch

    import noetherflow

    torch.set_num_threads(threads)
    workloads = {w.key: w for w in bench.build_workloads(quick, tiny, seed=0)}
    for w in workloads.values():  # warm-up on a sub-batch, as bench_stats.time_all does
        for m in METHODS:
            bench.run_method(w, m, n=min(8, w.x.shape[0]))
    print(json.dumps({"ready": sorted(workloads), "noetherflow": noetherflow.__file__}), file=out)
    out.flush()
    for line in inp:
        key, method = line.split()
        t0 = time.perf_counter()
        bench.run_method(workloads[key], method)
        print(json.dumps({"s": time.perf_counter() - t0}), file=out)
        out.flush()


class Worker:
    """A worker subprocess for one checkout (its ``src`` first on ``PYTHONPATH``)."""

    def __init__(self, checkout: Path, quick: bool, tiny: bool, threads: int) -> None:
        env = dict(os.environ, PYTHONPATH=str(checkout / "src"), OMP_NUM_THREADS=str(threads))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--_worker", str(checkout)]
        cmd += ["--threads", str(threads)]
        cmd += ["--quick"] * quick + ["--tiny"] * tiny
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        hello = json.loads(self._readline())
        self.package: str = hello["noetherflow"]
        self.workloads: list[str] = hello["ready"]

    def _readline(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker exited with status {self.proc.wait()}")
        return line

    def time(self, key: str, method: str) -> float:
        """Seconds of one call of ``method`` on workload ``key``."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{key} {method}\n")
        self.proc.stdin.flush()
        return float(json.loads(self._readline())["s"])

    def close(self) -> None:
        """End the worker (closing its input ends its loop)."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def interleaved(
    workers: dict[str, Worker],
    reps: int,
    ref_reps: int,
    methods: tuple[str, ...],
    only: tuple[str, ...] = (),
) -> dict[str, dict[str, dict[str, list[float]]]]:
    """``times[version][workload][method]``: per-repetition seconds, versions back to back.

    ``only`` restricts the workloads (default: all that the workers built).
    """
    names = list(workers)
    keys = [k for k in workers[names[0]].workloads if not only or k in only]
    times: dict[str, dict[str, dict[str, list[float]]]] = {
        v: {k: {m: [] for m in methods} for k in keys} for v in names
    }
    for r in range(reps):
        for j, key in enumerate(keys):
            k = r % len(methods)
            for i, m in enumerate(methods[k:] + methods[:k]):
                if m == "reference" and r >= ref_reps:
                    continue
                order = names if (r + i + j) % 2 == 0 else names[::-1]
                for v in order:
                    times[v][key][m].append(workers[v].time(key, m))
    return times


def ratios(before: list[float], after: list[float]) -> dict[str, float]:
    """Medians, ratio of medians, median of paired ratios, ratio of minima (after / before)."""
    mb, ma = statistics.median(before), statistics.median(after)
    paired = [a / b for a, b in zip(after, before, strict=True)]
    return {
        "median_before_s": mb,
        "median_after_s": ma,
        "ratio_median": ma / mb,
        "ratio_paired": statistics.median(paired),
        "ratio_min": min(after) / min(before),
        "reps": len(before),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start both workers, time interleaved, return the table's data."""
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    workers = {
        "before": Worker(args.before, args.quick, args.tiny, args.threads),
        "after": Worker(args.after, args.quick, args.tiny, args.threads),
    }
    try:
        if workers["before"].package == workers["after"].package:
            raise RuntimeError(f"both workers imported {workers['before'].package}")
        times = interleaved(
            workers, args.reps, args.ref_reps, tuple(args.methods), tuple(args.workloads or ())
        )
    finally:
        for w in workers.values():
            w.close()
    out: dict[str, Any] = {
        "packages": {v: w.package for v, w in workers.items()},
        "threads": args.threads,
        "loadavg_start": load0,
        "loadavg_end": os.getloadavg(),
        "wall_s": time.perf_counter() - t0,
        "workloads": {},
    }
    for key in times["before"]:
        out["workloads"][key] = {
            m: ratios(times["before"][key][m], times["after"][key][m])
            for m in args.methods
            if times["before"][key][m]
        }
    return out


def table(res: dict[str, Any]) -> str:
    """The result as a Markdown table, one row per (workload, method)."""
    lines = [
        "| workload | method | reps | before median s | after median s | after/before "
        "(medians) | paired median | fastest |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, per in res["workloads"].items():
        for m, r in per.items():
            lines.append(
                f"| {key} | {m} | {r['reps']} | {r['median_before_s']:.4f} | "
                f"{r['median_after_s']:.4f} | {r['ratio_median']:.3f} | "
                f"{r['ratio_paired']:.3f} | {r['ratio_min']:.3f} |"
            )
    la, lb = res["loadavg_start"], res["loadavg_end"]
    lines.append("")
    lines.append(
        f"Load average (1/5/15 min) at start {la[0]:.2f}/{la[1]:.2f}/{la[2]:.2f}, at end "
        f"{lb[0]:.2f}/{lb[1]:.2f}/{lb[2]:.2f}; torch threads {res['threads']} per worker; wall "
        f"{res['wall_s']:.0f} s."
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Command line entry point (also the worker's, with the hidden ``--_worker``)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("before", type=Path, nargs="?", help="checkout of the earlier version")
    p.add_argument("after", type=Path, nargs="?", help="checkout of the later version")
    p.add_argument("--reps", type=int, default=9, help="repetitions (default 9)")
    p.add_argument("--ref-reps", type=int, default=3, help="repetitions of 'reference' (3)")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker (1)")
    p.add_argument(
        "--workloads", nargs="+", default=None, choices=("mlp", "linear", "token", "mlp_full")
    )
    p.add_argument("--quick", action="store_true", help="bench_stats.py's --quick sizes")
    p.add_argument("--tiny", action="store_true", help="toy sizes (smoke tests)")
    p.add_argument("--json", type=Path, default=None, help="also write the result here")
    p.add_argument("--_worker", dest="worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker is not None:
        _worker(args.worker, args.quick, args.tiny, args.threads, sys.stdin, sys.stdout)
        return 0
    if args.before is None or args.after is None:
        p.error("give two checkouts: BEFORE_DIR AFTER_DIR (each with src/noetherflow)")
    for d in (args.before, args.after):
        if not (d / "src" / "noetherflow").is_dir() or not (d / "benchmarks").is_dir():
            p.error(f"{d} has no src/noetherflow or benchmarks/; pass a checkout's root")
    if args.reps < 1 or args.ref_reps < 0 or args.threads < 1:
        p.error(
            f"--reps and --threads must be ≥ 1 and --ref-reps ≥ 0 (got {args.reps}, "
            f"{args.threads}, {args.ref_reps})"
        )
    res = run(args)
    sys.stdout.write(f"before: {res['packages']['before']}\nafter:  {res['packages']['after']}\n")
    sys.stdout.write(table(res))
    if args.json is not None:
        args.json.write_text(json.dumps(res, indent=1), encoding="utf-8")
    return 0 if all(math.isfinite(r["ratio_median"]) for r in _rows(res)) else 1


def _rows(res: dict[str, Any]) -> list[dict[str, float]]:
    return [r for per in res["workloads"].values() for r in per.values()]


if __name__ == "__main__":
    sys.exit(main())

"""The harness shared by teleport-mlp and teleport-cnn: R runs of one architecture trained at
once (:class:`Stacked`), every method × learning rate × seed (:func:`run_comparison`), the
summary at η* (the largest rate at which warmup trains every seed), the claims and the curves.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from noetherflow._divergence import diverged_mask
from noetherflow.experiments._base import Claim, Op, derive_seed, parallel_map, save_figure

CHANCE = 0.1  # test accuracy credited to a diverged run (ten classes)


LABELS = {
    "none": "no warmup",
    "warmup": "linear warmup",
    "teleport_start": "teleport at start",
    "teleport_every": "teleport every k",
    "gradnorm_start": "grad-norm teleport at start (Zhao+22)",
    "gradnorm_every": "grad-norm teleport every k (Zhao+22)",
}


def digits_split(seed: int, n_test: int) -> tuple[Any, Any, Any, Any]:
    """Digits as float64 tensors: x_train, y_train, x_test, y_test (fixed per seed)."""
    import torch

    from noetherflow.experiments._data import load_digits_data

    data = load_digits_data()
    rng = np.random.default_rng(derive_seed(seed, "digits-split"))
    perm = rng.permutation(data.n)
    te, tr = perm[:n_test], perm[n_test:]
    x = torch.as_tensor(data.x, dtype=torch.float64)
    y = torch.as_tensor(data.labels, dtype=torch.long)
    return x[tr], y[tr], x[te], y[te]


class Stacked:
    """R copies of one architecture trained at once (leading run axis on every parameter).

    ``template()`` is an ``nn.Module`` of the same architecture whose parameters, in
    ``parameters()`` order, correspond one to one to :attr:`params`; :meth:`load` and
    :meth:`store` copy one run in and out of it (the teleports act on the module).
    """

    params: list[Any]

    def forward(self, x: Any) -> Any:  # pragma: no cover - interface
        """``x`` has shape ``[R, B, ...]``; returns logits ``[R, B, classes]``."""
        raise NotImplementedError

    def template(self) -> Any:  # pragma: no cover - interface
        raise NotImplementedError

    def load(self, r: int, module: Any) -> None:
        import torch

        with torch.no_grad():
            for p, q in zip(self.params, module.parameters(), strict=True):
                q.copy_(p[r])

    def store(self, r: int, module: Any) -> None:
        import torch

        with torch.no_grad():
            for p, q in zip(self.params, module.parameters(), strict=True):
                p[r].copy_(q)


def train_stacked(
    method: str,
    lrs: Sequence[float],
    seeds: Sequence[int],
    *,
    cfg: Any,
    stacked: Stacked,
    shape: Sequence[int] | None = None,
    estimator: str = "hooks",
    micro_batch_size: int = 1,
    gradnorm_steps: int = 10,
    gradnorm_step_size: float = 0.05,
) -> list[dict[str, Any]]:
    """Train every (lr, seed) run of ``method`` at once; one result dict per run.

    Runs of the same seed share the initialisation (``derive_seed(seed, "init")``), the
    train/test split and the batch stream, whatever the method and learning rate. SGD
    without momentum with coupled weight decay ``cfg.weight_decay`` (γ = weight_decay/2 in
    the paper's convention, which is what the teleports are given). The teleports act on
    ``stacked.template()`` one run at a time.
    """
    import time

    import torch
    import torch.nn.functional as F

    import noetherflow as nf
    from noetherflow.baselines.zhao2022 import gradient_norm_teleport
    from noetherflow.teleportation.tool import EquilibriumTeleport

    runs = [(lr, s) for lr in lrs for s in seeds]
    n_runs = len(runs)
    module = stacked.template()
    module.train()
    data = {s: digits_split(s, cfg.n_test) for s in seeds}
    view = (lambda t: t.reshape(-1, *shape)) if shape is not None else (lambda t: t)
    for r, (_, s) in enumerate(runs):
        torch.manual_seed(derive_seed(s, "init"))
        init = stacked.template()
        init_scale = getattr(cfg, "init_scale", 1.0)
        if init_scale != 1.0:
            with torch.no_grad():
                for name, p in init.named_parameters():
                    if name.endswith("weight"):
                        p.mul_(init_scale)
        stacked.store(r, init)
    n_train = {s: len(data[s][0]) for s in seeds}
    batches = {
        s: torch.randint(
            0,
            n_train[s],
            (cfg.n_steps, cfg.batch_size),
            generator=torch.Generator().manual_seed(derive_seed(s, "batches")),
        )
        for s in seeds
    }
    tgen = {s: torch.Generator().manual_seed(derive_seed(s, "teleport-batches")) for s in seeds}
    syms = nf.find_symmetries(module, view(data[seeds[0]][0][:16]))
    gamma = cfg.weight_decay / 2.0
    lr_vec = torch.tensor([lr for lr, _ in runs], dtype=torch.float64)
    teleporters: list[EquilibriumTeleport] = []
    if method.startswith("teleport"):
        teleporters = [
            EquilibriumTeleport(
                module,
                syms,
                F.cross_entropy,
                lr=lr,
                batch_size=cfg.batch_size,
                weight_decay=gamma,
                at_start=True,
                every=cfg.teleport_every if method == "teleport_every" else None,
                estimator=estimator,
                micro_batch_size=micro_batch_size,
            )
            for lr, _ in runs
        ]
    gn_ratio: list[list[float]] = [[] for _ in runs]
    tele_seconds = np.zeros(n_runs)

    x_test = torch.stack([view(data[s][2]) for _, s in runs])
    y_test = torch.stack([data[s][3] for _, s in runs])
    x_train = torch.stack([view(data[s][0]) for _, s in runs])
    y_train = torch.stack([data[s][1] for _, s in runs])

    def full(x: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad():
            out = stacked.forward(x)
            loss = F.cross_entropy(out.flatten(0, 1), y.flatten(), reduction="none")
            loss = loss.reshape(y.shape).mean(1)
            acc = (out.argmax(-1) == y).double().mean(1)
        return loss.numpy(), acc.numpy()

    init_train, _ = full(x_train, y_train)
    alive = np.ones(n_runs, dtype=bool)
    diverged_at: list[int | None] = [None] * n_runs
    eval_steps: list[int] = []
    test_loss: list[np.ndarray] = []
    test_acc: list[np.ndarray] = []
    t0 = time.perf_counter()
    nb_tp = cfg.teleport_batch
    for k in range(cfg.n_steps):
        if k % cfg.eval_every == 0:
            tl, ta = full(x_test, y_test)
            eval_steps.append(k)
            test_loss.append(np.where(alive, tl, np.nan))
            test_acc.append(np.where(alive, ta, np.nan))
        due_tp = bool(teleporters) and teleporters[0].due()
        due_gn = method.startswith("gradnorm") and (
            k == 0 or (method == "gradnorm_every" and k % cfg.teleport_every == 0)
        )
        if due_tp or due_gn:
            for r, (_, s) in enumerate(runs):
                if not alive[r]:
                    continue
                nb = cfg.teleport_batch if due_tp else getattr(cfg, "gradnorm_batch", nb_tp)
                idx = torch.randint(0, n_train[s], (nb,), generator=tgen[s])
                xb, yb = view(data[s][0][idx]), data[s][1][idx]
                stacked.load(r, module)
                if due_tp:
                    with warnings.catch_warnings():  # no eps tolerance (teleport-cnn NOTES)
                        warnings.simplefilter("ignore", nf.EpsWarning)
                        teleporters[r].teleport(xb, yb)
                else:
                    res = gradient_norm_teleport(
                        module,
                        syms,
                        F.cross_entropy,
                        xb,
                        yb,
                        steps=gradnorm_steps,
                        step_size=gradnorm_step_size,
                    )
                    tele_seconds[r] += res.seconds
                    gn_ratio[r].append(
                        res.grad_norm_sq_after / max(res.grad_norm_sq_before, 1e-300)
                    )
                stacked.store(r, module)
        for tp in teleporters:
            tp.steps_seen += 1
        factor = min(1.0, (k + 1) / cfg.warmup_steps) if method == "warmup" else 1.0
        xb = torch.stack([x_train[r][batches[s][k]] for r, (_, s) in enumerate(runs)])
        yb = torch.stack([y_train[r][batches[s][k]] for r, (_, s) in enumerate(runs)])
        out = stacked.forward(xb)
        per_run = F.cross_entropy(out.flatten(0, 1), yb.flatten(), reduction="none")
        per_run = per_run.reshape(yb.shape).mean(1)
        lv = per_run.detach().numpy()
        bad = alive & diverged_mask(lv, cfg.diverge_factor * init_train)
        for ri in np.nonzero(bad)[0]:
            diverged_at[int(ri)] = k
        alive &= ~bad
        mask = torch.as_tensor(alive)
        total = torch.where(mask, per_run, torch.zeros_like(per_run)).sum()
        grads = torch.autograd.grad(total, stacked.params)
        step = lr_vec * factor * mask.double()
        with torch.no_grad():
            for p, g in zip(stacked.params, grads, strict=True):
                upd = g + cfg.weight_decay * p if cfg.weight_decay else g
                upd = torch.nan_to_num(upd)
                p -= step.view(-1, *([1] * (p.dim() - 1))) * upd
        if not alive.any():
            break
    seconds = time.perf_counter() - t0
    tl, ta = full(x_test, y_test)
    final_train, _ = full(x_train, y_train)
    eval_steps.append(cfg.n_steps)
    test_loss.append(np.where(alive, tl, np.nan))
    test_acc.append(np.where(alive, ta, np.nan))
    n_eval = len(range(0, cfg.n_steps, cfg.eval_every)) + 1
    tl_arr = np.full((n_runs, n_eval), np.nan)
    ta_arr = np.full((n_runs, n_eval), np.nan)
    tl_arr[:, : len(test_loss) - 1] = np.stack(test_loss[:-1], 1)
    ta_arr[:, : len(test_acc) - 1] = np.stack(test_acc[:-1], 1)
    tl_arr[:, -1], ta_arr[:, -1] = test_loss[-1], test_acc[-1]
    results = []
    for r, (lr, s) in enumerate(runs):
        ok = bool(alive[r])
        ftr = float(final_train[r]) if ok else math.nan
        if teleporters:
            tele_seconds[r] += teleporters[r].overhead_s
        results.append(
            {
                "method": method,
                "lr": lr,
                "seed": s,
                "diverged_at": diverged_at[r],
                "trains": ok and math.isfinite(ftr) and ftr < cfg.train_frac * init_train[r],
                "init_train_loss": float(init_train[r]),
                "final_train_loss": ftr,
                "final_test_loss": float(tl_arr[r, -1]),
                "final_test_acc": float(ta_arr[r, -1]),
                "test_loss": tl_arr[r],
                "test_acc": ta_arr[r],
                "seconds_all_runs": seconds,
                "teleport_seconds": float(tele_seconds[r]),
                "teleport_distance": (
                    [h.max_distance for h in teleporters[r].history] if teleporters else []
                ),
                "gradnorm_ratio": gn_ratio[r],
                "symmetries": [sym.family.value for sym in syms],
            }
        )
    return results


def summarise(
    runs: list[dict[str, Any]], methods: Sequence[str], lrs: Sequence[float], cfg: Any
) -> dict[str, Any]:
    """Largest stable lr per method, η*, and the curves at η* (mean ± std over seeds)."""
    by: dict[tuple[str, float], list[dict[str, Any]]] = {(r["method"], r["lr"]): [] for r in runs}
    for r in runs:
        by[(r["method"], r["lr"])].append(r)
    stable: dict[str, float] = {}
    trains_table: dict[str, list[int]] = {}
    for m in methods:
        ok = [lr for lr in lrs if all(r["trains"] for r in by[(m, lr)])]
        stable[m] = max(ok) if ok else math.nan
        trains_table[m] = [sum(r["trains"] for r in by[(m, lr)]) for lr in lrs]
    lr_star = stable["warmup"] if math.isfinite(stable["warmup"]) else min(lrs)
    at_star: dict[str, Any] = {}
    series: dict[str, Any] = {"lrs": list(lrs)}
    for m in methods:
        rs = by[(m, lr_star)]
        acc = np.stack([np.asarray(r["test_acc"], dtype=float) for r in rs])
        loss = np.stack([np.asarray(r["test_loss"], dtype=float) for r in rs])
        series["step"] = np.asarray([*range(0, cfg.n_steps, cfg.eval_every), cfg.n_steps])
        for key, arr in (("test_acc", acc), ("test_loss", loss)):
            with warnings.catch_warnings():  # all-NaN columns once every seed has diverged
                warnings.simplefilter("ignore", RuntimeWarning)
                series[f"{key}_{m}_mean"] = np.nanmean(arr, 0)
                series[f"{key}_{m}_std"] = np.nanstd(arr, 0)
            series[f"{key}_{m}_per_seed"] = arr
        fa_raw = np.asarray([r["final_test_acc"] for r in rs], dtype=float)
        fa = np.where(np.isfinite(fa_raw), fa_raw, CHANCE)  # a diverged run scores chance
        fl = np.asarray([r["final_test_loss"] for r in rs], dtype=float)
        surv = np.isfinite(fa_raw)
        at_star[m] = {
            "n_trains": int(sum(r["trains"] for r in rs)),
            "n_diverged": int(sum(r["diverged_at"] is not None for r in rs)),
            "final_test_acc_mean": float(np.mean(fa)),
            "final_test_acc_std": float(np.std(fa)),
            "final_test_acc_survivors_mean": float(np.mean(fa_raw[surv])) if surv.any() else None,
            "final_test_loss_mean": float(np.mean(fl)),
            "final_test_loss_std": float(np.std(fl)),
            "seconds_all_runs_of_method": float(rs[0]["seconds_all_runs"]),
            "teleport_seconds_mean": float(np.mean([r["teleport_seconds"] for r in rs])),
        }
    series["trains_count"] = trains_table
    return {
        "largest_stable_lr": stable,
        "lr_star": lr_star,
        "at_lr_star": at_star,
        "series": series,
    }


def teleport_claims(results: dict[str, Any], cfg: Any, teleports: Sequence[str]) -> list[Claim]:
    """At η*: trains, final test accuracy ≥ warmup's, largest stable lr ≥ warmup's."""
    star, stable = results["at_lr_star"], results["largest_stable_lr"]
    w = star["warmup"]
    out: list[Claim] = []
    for m in teleports:
        s = star[m]
        out.append(
            Claim(
                id=f"{m}_trains_at_warmup_lr",
                statement=f"{LABELS[m]} at η* = {results['lr_star']} (the largest lr at which "
                f"warmup trains): seeds that fail to train (of {cfg.n_seeds})",
                value=cfg.n_seeds - s["n_trains"],
                op=Op.EQ,
                threshold=0,
                note=f"diverged {s['n_diverged']}/{cfg.n_seeds}; no warmup at η*: "
                f"{star['none']['n_trains']}/{cfg.n_seeds} train",
                why=f"{cfg.n_seeds - s['n_trains']} of {cfg.n_seeds} seeds do not train after "
                f"{LABELS[m]} at η* = {results['lr_star']} ({s['n_diverged']} of them "
                "diverged): the equilibrium it moves to does not make η* trainable for them "
                f"(without warmup {star['none']['n_trains']}/{cfg.n_seeds} train)",
            )
        )
        out.append(
            Claim(
                id=f"{m}_acc_vs_warmup",
                statement=f"{LABELS[m]} replaces warmup at η*: final test accuracy minus "
                "warmup's (means over seeds)",
                value=s["final_test_acc_mean"] - w["final_test_acc_mean"],
                op=Op.GE,
                threshold=0.0,
                note=f"{LABELS[m]} {s['final_test_acc_mean']:.4f} ± {s['final_test_acc_std']:.4f}"
                f" ({s['n_diverged']} diverged, scored 0.1)"
                f", warmup {w['final_test_acc_mean']:.4f} ± {w['final_test_acc_std']:.4f}, "
                f"no warmup {star['none']['final_test_acc_mean']:.4f} ± "
                f"{star['none']['final_test_acc_std']:.4f}; test loss {m} "
                f"{s['final_test_loss_mean']:.4f} vs warmup {w['final_test_loss_mean']:.4f}",
                why=f"{LABELS[m]} ends at test accuracy {s['final_test_acc_mean']:.3f} against "
                f"warmup's {w['final_test_acc_mean']:.3f}, with {s['n_diverged']} of "
                f"{cfg.n_seeds} seeds diverged (scored 0.1)",
            )
        )
        out.append(
            Claim(
                id=f"{m}_max_lr_vs_warmup",
                statement=f"largest stable lr of {LABELS[m]} (value) at least warmup's "
                "(threshold), on the grid",
                value=stable[m],
                op=Op.GE,
                threshold=stable["warmup"],
                note="largest stable lr per method: "
                + ", ".join(f"{k} {v}" for k, v in stable.items()),
                why=f"{LABELS[m]} trains every seed only up to η = {stable[m]} of the grid, "
                f"warmup up to {stable['warmup']}",
            )
        )
    return out


def plot_curves(
    results: dict[str, Any], cfg: Any, out_path: Path, methods: Sequence[str], title: str
) -> Path:
    from matplotlib.figure import Figure

    s = results["series"]
    steps = np.asarray(s["step"], dtype=float)
    fig = Figure(figsize=(14, 4.5))
    ax1, ax2, ax3 = fig.subplots(1, 3)
    for i, m in enumerate(methods):
        c = f"C{i}"
        for ax, key in ((ax1, "test_acc"), (ax2, "test_loss")):
            mean = np.asarray(s[f"{key}_{m}_mean"], dtype=float)
            std = np.asarray(s[f"{key}_{m}_std"], dtype=float)
            ax.plot(steps, mean, color=c, label=LABELS[m])
            ax.fill_between(steps, mean - std, mean + std, color=c, alpha=0.2)
        counts = s["trains_count"][m]
        ax3.plot(s["lrs"], counts, "o-", color=c, label=LABELS[m])
    ax1.set_title(f"test accuracy at η* = {results['lr_star']} (mean ± std, {cfg.n_seeds} seeds)")
    ax2.set_title("test loss at η*")
    ax2.set_yscale("log")
    ax3.set_xscale("log")
    ax3.set_title("seeds that train, per learning rate")
    ax3.set_xlabel("η")
    for ax in (ax1, ax2):
        ax.set_xlabel("step")
    ax1.legend(fontsize=7)
    ax3.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, out_path)


_KEEP = (
    "method",
    "lr",
    "seed",
    "diverged_at",
    "trains",
    "final_test_acc",
    "final_test_loss",
    "final_train_loss",
    "teleport_seconds",
    "teleport_distance",
    "gradnorm_ratio",
)


def run_comparison(
    exp_id: str,
    run_method: Callable[..., list[dict[str, Any]]],
    methods: Sequence[str],
    cfg: Any,
    seed: int,
) -> dict[str, Any]:
    """All methods × learning rates × seeds (runs of a method batched); summary at η*.

    Shared by teleport-mlp and teleport-cnn; ``run_method(method, cfg=, seeds=)`` trains one
    method's runs.
    """
    seeds = [derive_seed(seed, exp_id, i) % 2**31 for i in range(cfg.n_seeds)]
    per_method = parallel_map(functools.partial(run_method, cfg=cfg, seeds=seeds), methods)
    runs = [r for rs in per_method for r in rs]
    out = summarise(runs, methods, cfg.lrs, cfg)
    out["runs"] = [{k: r[k] for k in _KEEP} for r in runs]
    out["symmetries"] = runs[0]["symmetries"]
    return out


def grid_claims(results: dict[str, Any], cfg: Any, teleports: Sequence[str]) -> list[Claim]:
    """The comparison on the warmup-sensitive grid: first that it can fail (no warmup fails
    at warmup's best rate η*), then :func:`teleport_claims` with ids prefixed ``grid_``."""
    star = results["at_lr_star"]
    n_none = star["none"]["n_trains"]
    out = [
        Claim(
            id="grid_none_fails_at_warmup_lr",
            statement=f"The comparison can fail: at η* = {results['lr_star']} (largest grid rate "
            "at which warmup trains every seed) some seeds fail to train without warmup; seeds "
            f"that train without warmup (of {cfg.n_seeds})",
            value=n_none,
            op=Op.LT,
            threshold=cfg.n_seeds,
            note=f"no warmup at η*: {star['none']['n_diverged']} diverged; largest stable lr "
            "per method: " + ", ".join(f"{k} {v}" for k, v in results["largest_stable_lr"].items()),
        )
    ]
    for c in teleport_claims(results, cfg, teleports):
        out.append(
            Claim(
                "grid_" + c.id,
                "[warmup-sensitive grid] " + c.statement,
                c.value,
                c.op,
                c.threshold,
                note=c.note,
                kind=c.kind,
                why=c.why,
            )
        )
    return out

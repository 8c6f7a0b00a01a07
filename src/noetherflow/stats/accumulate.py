"""Gradient accumulation: the statistics of k micro-batches merged into those of one step.

A step that accumulates k micro-batches j = 1..k (n_j samples, B = Σ_j n_j) before one
``optimizer.step()`` minimises L = Σ_j L_j, where L_j is the loss the loop backpropagated for
micro-batch j (``loss_j / k`` in the usual recipe, ``sum_j / num_items`` in the Hugging Face
Trainer). Each sample i contributes a part ℓ̃_i of L (its share of L_j), and its per-sample
gradient is defined as

    g_i = B · ∇ℓ̃_i,        so that        (1/B) Σ_i g_i = ∇L = the accumulated ``.grad``.

With equal micro-batches and ``loss_j / k`` this is the per-sample gradient of the full batch
of B samples (the same data in one batch gives the same statistics, exactly). The hooks of
micro-batch j see c_i = n_j·∇ℓ̃_i (a batch-mean loss over its own n_j samples), so
g_i = s_j·c_i with s_j = B/n_j, and every statistic (an average over samples, linear or
quadratic in g) merges as

    ḡ = Σ_j (n_j/B)·s_j·ḡ_j = Σ_j ḡ_j,        M = Σ_j (n_j/B)·s_j²·M_j = Σ_j s_j·M_j

for the second moments M of every kernel's block (:class:`~noetherflow.stats.core.
StatsBlock`: all of its entries are second moments of g), and the per-sample gradients (kept
for coupled sets) are concatenated, each scaled by s_j. For a sum-reduced loss
(``reduction="sum"``: L = Σ_i ℓ_i, g_i = ∇ℓ_i) the hooks see g_i itself (s_j = 1) and the
statistics merge as those of DDP ranks, Σ_j (n_j/B)·stat_j.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from noetherflow.stats.core import GradStats, Reduction, check_batch

__all__ = ["merge_accumulated", "rescaled"]


def merge_accumulated(
    parts: Sequence[GradStats], reduction: Reduction = Reduction.MEAN
) -> GradStats:
    """The statistics of one accumulated step from those of its micro-batches (module docs).

    ``parts`` are the hooks' statistics of each micro-batch (same symmetry set and level),
    captured with ``reduction``. One part is returned unchanged. Raises ``StatisticsError``
    when the merged step has fewer than 2 samples.
    """
    if len(parts) == 1:
        check_batch(parts[0].n)
        return parts[0]
    total = sum(p.n for p in parts)
    check_batch(total)
    mean = reduction is Reduction.MEAN
    # (weight of part j in the average over samples, scale of its per-sample gradients)
    ws = [(p.n / total, total / p.n if mean else 1.0) for p in parts]
    first = parts[0]
    out = GradStats(n=total, estimator=first.estimator)
    for param in first.mean:
        out.mean[param] = _sum(p.mean[param] * (w * s) for p, (w, s) in zip(parts, ws, strict=True))
    for key, block in first.blocks.items():
        merged = type(block)()
        for entry in block.entries():
            acc = _sum(
                p.blocks[key].get_entry(entry) * (w * s * s)
                for p, (w, s) in zip(parts, ws, strict=True)
            )
            _set_new(merged, entry, acc)
        out.blocks[key] = merged
    for param in first.samples:
        out.samples[param] = torch.cat(
            [p.samples[param] * s for p, (_, s) in zip(parts, ws, strict=True)]
        )
    return out


def _sum(ts: Iterable[torch.Tensor]) -> torch.Tensor:
    it = iter(ts)
    acc = next(it).clone()
    for t in it:
        acc += t
    return acc


def _set_new(block: object, entry: tuple[str, object, int], value: torch.Tensor) -> None:
    """Put ``value`` at ``entry`` of a fresh block (tuples are built slot by slot)."""
    name, key, slot = entry
    d = getattr(block, name)
    if slot < 0:
        d[key] = value
    else:
        d[key] = (*d.get(key, ()), value)


def rescaled(stats: GradStats, c: float) -> GradStats:
    """The statistics of the per-sample gradients c·g_i (in place; returns ``stats``).

    ḡ and the per-sample gradients scale by c, every block's second moments by c². For a
    loss scaled by a ``torch.amp.GradScaler`` (fp16): c = 1/scale.
    """
    if c == 1.0:
        return stats
    for p in stats.mean:
        stats.mean[p] = stats.mean[p] * c
    for block in stats.blocks.values():
        for entry in block.entries():
            block.set_entry(entry, block.get_entry(entry) * (c * c))
    for p in stats.samples:
        stats.samples[p] = stats.samples[p] * c
    return stats

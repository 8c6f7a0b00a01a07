"""The numerical check behind :func:`noetherflow.find_symmetries`, made hard to pass vacuously.

A candidate symmetry is applied with a random group element to a float64 copy of the model.
The *signal* compared before and after is not only the model output (or loss) but also the
output of every known layer (Linear, Conv, Conv1D, normalisations, attention) that the
symmetry does not act on from its output side: an exact symmetry leaves all of them
unchanged, and they stay informative when the model output does not (a zero-initialised
head, a layer scale of 1e-6, a constant output). The relative change is the largest over
the signal's parts, each part relative to its own norm.

A check is *degenerate* when a generic perturbation of the same parameters (each entry
multiplied by e^u, u uniform in [−scale, scale]) hardly changes the signal either (less than
``DEGENERATE`` × tolerance): the check could not tell a symmetry from a non-symmetry. Then
the check is repeated at a randomly perturbed parameter point (every parameter of the
symmetry, and every all-zero parameter of the model, gets Gaussian noise of standard
deviation max(its RMS, 0.1)), where an exact
symmetry still holds and a broken one shows. If it is still degenerate there, the candidate
is not claimed. :attr:`Check.how` says which signal and which point were used.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from noetherflow._inputs import ModelInputs
from noetherflow.symmetry._fx.capture import flat_outputs
from noetherflow.symmetry._fx.layers import layer_spec, norm_spec
from noetherflow.symmetry.base import DiagonalSymmetry, Symmetry
from noetherflow.symmetry.rotation import DoubleRotation
from noetherflow.symmetry.set import _rebind, _to64, copy_mapping

__all__ = ["DEGENERATE", "Check", "Checker"]

# A generic perturbation must change the signal by more than DEGENERATE × tolerance.
DEGENERATE = 100.0


@dataclass(frozen=True)
class Check:
    """Outcome of one numerical check: relative change, the control, and how it was done."""

    rel: float
    control: float
    degenerate: bool
    how: str


def _probed(m: nn.Module) -> bool:
    return (
        layer_spec(m) is not None
        or norm_spec(m) is not None
        or isinstance(m, nn.MultiheadAttention)
    )


def _acted(sym: Symmetry) -> list[tuple[nn.Parameter, int | None]]:
    """(parameter, axis) pairs the symmetry acts along; axis None: unknown (any)."""
    if isinstance(sym, DiagonalSymmetry):
        return [(t.param, t.axis) for t in sym.terms()]
    if isinstance(sym, DoubleRotation):
        return [(b.param, b.axis) for b in [*sym.w_blocks, *sym.u_blocks]]
    return [(p, None) for p in sym.params]


def producers(sym: Symmetry, model: nn.Module) -> set[str]:
    """Names of the probed modules whose *output* the symmetry changes (it acts on rows)."""
    acted: dict[int, set[int | None]] = {}
    for p, axis in _acted(sym):
        acted.setdefault(id(p), set()).add(axis)
    out: set[str] = set()
    for name, m in model.named_modules():
        if not _probed(m):
            continue
        spec = layer_spec(m)
        for pname, p in m.named_parameters(recurse=False):
            axes = acted.get(id(p))
            if axes is None:
                continue
            w_out = spec.w_out if spec is not None else 0
            if spec is None or pname != "weight" or None in axes or w_out in axes:
                if not isinstance(m, nn.MultiheadAttention):
                    out.add(name)
    return out


@contextmanager
def _functional_eps(zero: bool) -> Iterator[None]:
    """With ``zero``, ``F.layer_norm``/``group_norm``/``rms_norm`` run with eps → 0 (tiny)."""
    if not zero:
        yield
        return
    tiny = torch.finfo(torch.float64).tiny
    saved = {n: getattr(F, n) for n in ("layer_norm", "group_norm", "rms_norm")}

    def patched(orig: Callable[..., Tensor], pos: int) -> Callable[..., Tensor]:
        def call(*args: Any, **kwargs: Any) -> Tensor:
            if len(args) > pos:
                args = (*args[:pos], tiny, *args[pos + 1 :])
            else:
                kwargs["eps"] = tiny
            return orig(*args, **kwargs)

        return call

    # eps is positional argument 4 of layer_norm and group_norm, 3 of rms_norm
    for n, pos in (("layer_norm", 4), ("group_norm", 4), ("rms_norm", 3)):
        setattr(F, n, patched(saved[n], pos))
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(F, n, f)


class _Copy:
    """A float64 copy of the model with hooks recording every probed module's output."""

    def __init__(self, model: nn.Module, zero_eps: bool) -> None:
        self.zero_eps = zero_eps
        self.model = copy.deepcopy(model).to(torch.float64)
        if zero_eps:
            for m in self.model.modules():
                spec = norm_spec(m)
                if spec is not None:
                    # BatchNorm refuses eps = 0 in training; the smallest positive float64
                    # is exactly 0 next to any non-degenerate variance.
                    setattr(m, spec.eps_attr, torch.finfo(torch.float64).tiny)
        self.mapping = copy_mapping(model, self.model)
        self.outputs: dict[str, list[Tensor]] = {}
        for name, m in self.model.named_modules():
            if _probed(m):
                m.register_forward_hook(self._hook(name))

    def _hook(self, name: str) -> Callable[..., None]:
        def hook(_m: nn.Module, _inp: Any, out: Any) -> None:
            t = out[0] if isinstance(out, tuple) else out
            if isinstance(t, Tensor) and t.is_floating_point():
                self.outputs.setdefault(name, []).append(t.detach().reshape(-1))

        return hook


class Checker:
    """Relative change of the signal under a group element, with a degeneracy control."""

    def __init__(
        self,
        model: nn.Module,
        inp: ModelInputs,
        loss_fn: Callable[[Any, Any], Tensor] | None,
        targets: Any,
        seed: int,
        isolated: Callable[[nn.Module, int], Any],
    ) -> None:
        self.copies = [_Copy(model, zero_eps=False), _Copy(model, zero_eps=True)]
        self.inp = inp.map(_to64)
        self.targets = _to64(targets)
        self.loss_fn = loss_fn
        self.seed = seed
        self.isolated = isolated
        self._base: dict[int, dict[str, Tensor]] = {}

    def _signal(self, c: _Copy) -> dict[str, Tensor]:
        c.outputs = {}
        with self.isolated(c.model, self.seed), _functional_eps(c.zero_eps):
            out = self.inp(c.model)
            main = (
                self.loss_fn(out, self.targets).reshape(1)
                if self.loss_fn is not None
                else flat_outputs(out)
            )
        parts = {"": main.detach()}
        parts.update({k: torch.cat(v) for k, v in c.outputs.items()})
        return parts

    @staticmethod
    def _rel(after: dict[str, Tensor], base: dict[str, Tensor], skip: set[str]) -> float:
        worst = 0.0
        for k, b in base.items():
            if k in skip or k not in after or after[k].shape != b.shape:
                continue
            d = float((after[k] - b).norm() / b.norm().clamp_min(1e-300))
            if not d <= worst:  # NaN counts as the worst change
                worst = d if d == d else float("inf")
        return worst

    def _measure(
        self,
        c: _Copy,
        s64: Symmetry,
        element: Any,
        control_gen: torch.Generator | None,
        scale: float,
        base: dict[str, Tensor],
    ) -> tuple[float, float, int]:
        skip = producers(s64, c.model)
        params = s64.params
        saved = [(p, p.detach().clone()) for p in params]
        control = math.nan
        try:
            s64.apply_(element)
            rel = self._rel(self._signal(c), base, skip)
            if control_gen is not None:
                with torch.no_grad():
                    for p, v in saved:
                        u = torch.rand(v.shape, generator=control_gen, dtype=v.dtype) * 2 - 1
                        p.copy_(v * torch.exp(scale * u))
                control = self._rel(self._signal(c), base, skip)
        finally:
            with torch.no_grad():
                for p, v in saved:
                    p.copy_(v)
        n_parts = sum(1 for k in base if k not in skip)
        return rel, control, n_parts

    def check(
        self,
        sym: Symmetry,
        element: Any,
        zero_eps: bool,
        tolerance: float,
        scale: float,
        control: bool = True,
    ) -> Check:
        """Check ``sym`` under ``element`` on the copy with the model's eps or eps → 0.

        ``control=False`` skips the degeneracy control (only the relative change is wanted).
        """
        c = self.copies[int(zero_eps)]
        if int(zero_eps) not in self._base:  # parameters are restored bit for bit after
            self._base[int(zero_eps)] = self._signal(c)  # every check: one base per copy
        base = self._base[int(zero_eps)]
        s64 = _rebind(sym, c.mapping)
        gen = torch.Generator().manual_seed(self.seed + 1) if control else None
        rel, ctrl, n = self._measure(c, s64, element, gen, scale, base)
        where = "at the current parameters"
        if not control:
            return Check(rel, ctrl, False, where)
        if ctrl <= DEGENERATE * tolerance:
            saved = self._perturb(c, s64, gen)  # type: ignore[arg-type]
            try:
                rel, ctrl, n = self._measure(c, s64, element, gen, scale, self._signal(c))
            finally:
                with torch.no_grad():
                    for p, v in saved:
                        p.copy_(v)
            where = (
                "at a random parameter point (at the current one the signal hardly "
                "depends on these parameters)"
            )
        degenerate = not ctrl > DEGENERATE * tolerance
        how = (
            f"the output and {n - 1} layer outputs (float64, "
            f"{'eps → 0' if zero_eps else 'model eps'}) {where}: change {rel:.2g}, "
            f"vs {ctrl:.2g} under a generic perturbation"
        )
        return Check(rel, ctrl, degenerate, how)

    @staticmethod
    def _perturb(
        c: _Copy, s64: Symmetry, gen: torch.Generator
    ) -> list[tuple[nn.Parameter, Tensor]]:
        ids = {id(p) for p in s64.params}
        saved = []
        with torch.no_grad():
            for p in c.model.parameters():
                if id(p) in ids or not bool(p.detach().any()):
                    saved.append((p, p.detach().clone()))
                    rms = float(p.detach().pow(2).mean().sqrt()) if p.numel() else 0.0
                    std = max(rms, 0.1)  # tiny parameters (a 1e-6 layer scale) become generic
                    p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * std)
        return saved

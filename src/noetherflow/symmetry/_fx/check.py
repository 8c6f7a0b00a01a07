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

A check can be confined to a *scope*, a submodule holding every use of the symmetry's
parameters (:mod:`noetherflow.symmetry._fx.scope`): the submodule is rerun alone on the
inputs it received in the model's forward, and the signal is its output and the outputs of
the known layers inside it. :meth:`Checker.check` climbs from the deepest scope to the whole
model while the check fails or is degenerate; :meth:`Checker.check_composed` is the final
whole-model check of all the symmetries verified on scopes at once. Two results are shared
because they are the same computation: the control's random factors (they depend only on the
shapes drawn from a freshly seeded generator) and the control itself (same parameters, same
perturbation, same signal).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from noetherflow._inputs import ModelInputs
from noetherflow.symmetry._fx.capture import flat_outputs
from noetherflow.symmetry._fx.layers import layer_spec, norm_spec
from noetherflow.symmetry._fx.scope import ScopeRecorder
from noetherflow.symmetry.base import Symmetry
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
    scope: str = ""  # the submodule checked on its recorded inputs ("": the whole model)


def _probed(m: nn.Module) -> bool:
    return (
        layer_spec(m) is not None
        or norm_spec(m) is not None
        or isinstance(m, nn.MultiheadAttention)
    )


def _acted(sym: Symmetry) -> list[tuple[nn.Parameter, int | None]]:
    """(parameter, axis) pairs the symmetry acts along; axis None: unknown (any)."""
    return sym.acted_axes()


# id(parameter) → (probed module name, parameter name, the weight's output axis or None for
# a normalisation, is nn.MultiheadAttention) for every probed module owning it.
ProbedIndex = dict[int, list[tuple[str, str, int | None, bool]]]


def probed_index(model: nn.Module) -> ProbedIndex:
    """Which probed modules own which parameters (see :func:`producers`)."""
    index: ProbedIndex = {}
    for name, m in model.named_modules():
        if not _probed(m):
            continue
        spec = layer_spec(m)
        w_out = spec.w_out if spec is not None else None
        for pname, p in m.named_parameters(recurse=False):
            index.setdefault(id(p), []).append(
                (name, pname, w_out, isinstance(m, nn.MultiheadAttention))
            )
    return index


def producers(sym: Symmetry, model: nn.Module, index: ProbedIndex | None = None) -> set[str]:
    """Names of the probed modules whose *output* the symmetry changes (it acts on rows)."""
    acted: dict[int, set[int | None]] = {}
    for p, axis in _acted(sym):
        acted.setdefault(id(p), set()).add(axis)
    index = probed_index(model) if index is None else index
    out: set[str] = set()
    for pid, axes in acted.items():
        for name, pname, w_out, mha in index.get(pid, []):
            if w_out is None or pname != "weight" or None in axes or w_out in axes:
                if not mha:
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


@contextmanager
def _replaying(m: nn.Module) -> Iterator[None]:
    """Rerun ``m`` without side effects: its buffers and the RNG state are restored after.

    The replay sets the RNG state ``m`` saw in the forward, so no seeding is needed here.
    """
    buffers = [(b, b.detach().clone()) for b in m.buffers()]
    rng = torch.get_rng_state()
    try:
        with torch.no_grad():
            yield
    finally:
        torch.set_rng_state(rng)
        with torch.no_grad():
            for b, v in buffers:
                b.copy_(v)


def _pairs(model: nn.Module, clone: nn.Module) -> tuple[list[Tensor], list[Tensor]]:
    return [*model.parameters(), *model.buffers()], [*clone.parameters(), *clone.buffers()]


def _copy64(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` with floating-point parameters and buffers in float64.

    Each tensor is converted straight into its copy (``copy.deepcopy`` first and ``.to``
    after held a second float32 model: 0.5 GB for GPT-2 124M); ties stay ties.
    """
    memo: dict[int, Any] = {}
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) not in memo:
            d = t.detach()
            c = d.to(torch.float64, copy=True) if d.is_floating_point() else d.clone()
            memo[id(t)] = nn.Parameter(c, t.requires_grad) if isinstance(t, nn.Parameter) else c
    return copy.deepcopy(model, memo).to(torch.float64)


class _Copy:
    """A float64 copy of the model with hooks recording every probed module's output."""

    def __init__(self, model: nn.Module, zero_eps: bool) -> None:
        self.zero_eps = zero_eps
        self.model = _copy64(model)
        if zero_eps:
            for m in self.model.modules():
                spec = norm_spec(m)
                if spec is not None:
                    # BatchNorm refuses eps = 0 in training; the smallest positive float64
                    # is exactly 0 next to any non-degenerate variance.
                    setattr(m, spec.eps_attr, torch.finfo(torch.float64).tiny)
        self.mapping = copy_mapping(model, self.model)
        # id(copy's tensor) → the model's: while ``pristine`` (no perturbed point) the copy
        # equals the model converted exactly to float64, so a check restores from the model
        # instead of cloning what it moves (the composed check moves every block: 0.7 GB).
        self.source = {id(c): t for t, c in zip(*_pairs(model, self.model), strict=True)}
        self.pristine = True
        self.outputs: dict[str, list[Tensor]] = {}
        # Set by Checker._streamed: each output is compared with this base as it is produced
        # and only ‖after − base‖ of each call and the length seen so far are kept, per part.
        self.against: dict[str, Tensor] | None = None
        self.diffs: dict[str, tuple[list[float], int]] = {}
        for name, m in self.model.named_modules():
            if _probed(m):
                m.register_forward_hook(self._hook(name))

    def _hook(self, name: str) -> Callable[..., None]:
        def hook(_m: nn.Module, _inp: Any, out: Any) -> None:
            t = out[0] if isinstance(out, tuple) else out
            if not (isinstance(t, Tensor) and t.is_floating_point()):
                return
            flat = t.detach().reshape(-1)
            if self.against is None:
                self.outputs.setdefault(name, []).append(flat)
                return
            base = self.against.get(name)
            if base is None:
                return
            norms, seen = self.diffs.get(name, ([], 0))
            n = flat.numel()
            if seen + n <= base.numel():  # a longer part is a shape mismatch: skipped later
                norms.append(float((flat - base[seen : seen + n]).norm()))
            self.diffs[name] = (norms, seen + n)

        return hook


def _flat(out: Any, model: nn.Module) -> Tensor:
    """:func:`flat_outputs`, without its copy when ``out`` is one fresh tensor.

    A model's logits are the largest tensor of a signal (0.2 GB in float64 for GPT-2 at
    4 × 128 tokens) and are also the last layer's probed output: a flat view shares them. An
    output that shares memory with a parameter or buffer (a model returning a weight) is
    copied, since a check moves the parameters in place after taking the base signal.
    """
    if isinstance(out, Tensor) and out.is_floating_point() and out.is_contiguous():
        ptr = out.untyped_storage().data_ptr()
        owned = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
        if ptr not in owned:
            return out.detach().reshape(-1)
    return flat_outputs(out)


class Checker:
    """Relative change of the signal under a group element, with a degeneracy control.

    ``scopes`` names the submodules that checks may be confined to (see
    :mod:`noetherflow.symmetry._fx.scope`): the first forward of each float64 copy records
    how each of them was called, and a check at scope ``M`` reruns ``M`` alone on those
    inputs, its signal being ``M``'s output and the outputs of the known layers inside it.
    """

    def __init__(
        self,
        model: nn.Module,
        inp: ModelInputs,
        loss_fn: Callable[[Any, Any], Tensor] | None,
        targets: Any,
        seed: int,
        isolated: Callable[[nn.Module, int], Any],
        scopes: Sequence[str] = (),
    ) -> None:
        self.model = model
        self._copies: dict[bool, _Copy] = {}  # made on first use: the model's size each
        self.inp = inp.map(_to64)
        self.targets = _to64(targets)
        self.loss_fn = loss_fn
        self.seed = seed
        self.isolated = isolated
        self.scopes = sorted(set(scopes))
        self._base: dict[tuple[int, str], dict[str, Tensor]] = {}
        self._recorders: dict[int, ScopeRecorder] = {}
        self._usable: dict[tuple[int, str], bool] = {}
        self._index: dict[bool, ProbedIndex] = {}
        # The control's factors e^{scale·u} depend only on the shapes drawn from a fresh
        # generator: one draw per shape sequence, with the generator state after it.
        self._factors: dict[Any, tuple[list[Tensor], Tensor]] = {}
        self._controls: dict[Any, float] = {}  # control at the current parameters, by key

    def on_inputs(self, inp: ModelInputs, targets: Any, scopes: Sequence[str] = ()) -> Checker:
        """A checker of the same model on other inputs, sharing the float64 copies.

        The copies do not depend on the inputs (their parameters are restored bit for bit
        after every check), so the whole example's checks after the sample's cost no second
        copy of the model. Signals, scope records and controls are per inputs: not shared.
        """
        other = Checker(self.model, inp, self.loss_fn, targets, self.seed, self.isolated, scopes)
        other._copies, other._index, other._factors = self._copies, self._index, self._factors
        return other

    def copy(self, zero_eps: bool) -> _Copy:
        """The float64 copy with the model's eps or with eps → 0."""
        if zero_eps not in self._copies:
            self._copies[zero_eps] = _Copy(self.model, zero_eps=zero_eps)
            self._index[zero_eps] = probed_index(self._copies[zero_eps].model)
        return self._copies[zero_eps]

    def _signal(self, c: _Copy, scope: str = "") -> dict[str, Tensor]:
        c.outputs = {}
        if scope:
            rec = self._recorders[int(c.zero_eps)]
            with _replaying(c.model.get_submodule(scope)), _functional_eps(c.zero_eps):
                main = _flat(rec.replay(scope), c.model)
        else:
            with self.isolated(c.model, self.seed), _functional_eps(c.zero_eps):
                out = self.inp(c.model)
                main = (
                    self.loss_fn(out, self.targets).reshape(1)
                    if self.loss_fn is not None
                    else _flat(out, c.model)
                )
        parts = {"": main.detach()}
        # a layer's output is a fresh tensor: one call needs no copy (a whole GPT-2 signal
        # at 4 × 128 tokens is 0.4 GB of float64)
        parts.update({k: v[0] if len(v) == 1 else torch.cat(v) for k, v in c.outputs.items()})
        c.outputs = {}
        return parts

    def _base_of(self, c: _Copy, scope: str) -> dict[str, Tensor]:
        """The signal at the current parameters: one per copy and scope.

        Parameters are restored bit for bit after every check, so the base stays valid; the
        first whole forward of a copy also records how the scopes were called.
        """
        z = int(c.zero_eps)
        if (z, "") not in self._base:
            rec = ScopeRecorder(c.model, self.scopes)
            try:
                self._base[(z, "")] = self._signal(c)
            finally:
                rec.remove()
            self._recorders[z] = rec
        if (z, scope) not in self._base:
            self._base[(z, scope)] = self._signal(c, scope)
        return self._base[(z, scope)]

    def release(self, scopes: Sequence[str]) -> None:
        """Forget the signals at ``scopes`` (both copies): no check will need them again.

        A signal holds every probed layer output of its scope in float64, and an enclosing
        scope holds them again, so keeping all of them costs several forwards' worth of
        memory. A released signal is recomputed if it is needed after all (the same numbers:
        the rerun is the same computation).
        """
        for scope in scopes:
            if scope:
                for z in (0, 1):
                    self._base.pop((z, scope), None)

    def _scope_ok(self, c: _Copy, scope: str, tolerance: float) -> bool:
        """``scope`` ran once, and rerunning it alone reproduces its output in the forward."""
        z = int(c.zero_eps)
        if (z, scope) not in self._usable:
            self._base_of(c, "")
            rec = self._recorders[z]
            ok = rec.replayable(scope)
            if ok:
                try:
                    recorded = rec.records[scope].output
                    assert recorded is not None
                    again = self._base_of(c, scope)[""]
                    ok = again.shape == recorded.shape and (
                        self._rel({"": again}, {"": recorded}, set()) <= tolerance
                    )
                except Exception:  # the module does not rerun alone: check the whole model
                    ok = False
                rec.records[scope].output = None  # compared once: the copy is not needed again
            self._usable[(z, scope)] = ok
        return self._usable[(z, scope)] and self._recorders[z].replayable(scope)

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

    @staticmethod
    def _state(syms: Sequence[Symmetry], c: _Copy | None = None) -> list[tuple[Tensor, Tensor]]:
        """What restores every tensor the symmetries' actions write (parameters, buffers).

        A clone, or, for a pristine copy ``c``, the model's own tensor it was converted from
        (float32 → float64 is exact, so restoring from it is bit for bit).
        """
        ts = {id(t): t for s in syms for t in [*s.params, *s.state_buffers()]}
        src = c.source if c is not None and c.pristine else {}
        out = []
        for t in ts.values():
            v = src.get(id(t))
            ok = v is not None and v.shape == t.shape and v.device == t.device
            out.append((t, v.detach() if ok else t.detach().clone()))  # type: ignore[union-attr]
        return out

    @staticmethod
    def _restore(saved: list[tuple[Tensor, Tensor]]) -> None:
        with torch.no_grad():
            for t, v in saved:
                t.copy_(v)

    def _control_factors(
        self, params: Sequence[Tensor], gen: torch.Generator, scale: float, fresh: bool
    ) -> list[Tensor]:
        """e^{scale·u}, u uniform in [−1, 1], per parameter, drawn from ``gen`` in order.

        ``fresh``: ``gen`` was just seeded, so the draw is cached by shapes (bit for bit the
        same numbers) and ``gen`` is left where the draw would have left it.
        """
        key = (scale, tuple((tuple(p.shape), p.dtype, p.device) for p in params))
        if fresh and key in self._factors:
            factors, state = self._factors[key]
            gen.set_state(state)
            return factors
        factors = []
        for p in params:
            u = torch.rand(p.shape, generator=gen, dtype=p.dtype) * 2 - 1
            factors.append(torch.exp(scale * u))
        if fresh:
            self._factors[key] = (factors, gen.get_state())
        return factors

    def _measure(
        self,
        c: _Copy,
        s64: Symmetry,
        element: Any,
        control_gen: torch.Generator | None,
        scale: float,
        base: dict[str, Tensor],
        scope: str,
        skip: set[str],
        fresh: bool = False,
    ) -> tuple[float, float, int]:
        saved = self._state([s64], c)
        params = {id(p) for p in s64.params}
        n_parts = sum(1 for k in base if k not in skip)
        control = math.nan
        try:
            s64.apply_(element)
            rel = self._rel(self._signal(c, scope), base, skip)
            if control_gen is not None:
                factors = self._control_factors(s64.params, control_gen, scale, fresh)
                # The same perturbation of the same parameters, seen by the same signal, gives
                # the same control (e.g. every head's rotation on one fused projection).
                key = (c.zero_eps, scope, tuple(map(id, s64.params)), frozenset(skip), scale)
                if fresh and key in self._controls:
                    return rel, self._controls[key], n_parts
                # every parameter is overwritten below: restore only the buffers it moved
                self._restore([(t, v) for t, v in saved if id(t) not in params])
                orig = {id(t): v for t, v in saved}
                with torch.no_grad():
                    for p, f in zip(s64.params, factors, strict=True):
                        torch.mul(orig[id(p)].to(p.dtype), f, out=p)
                control = self._rel(self._signal(c, scope), base, skip)
                if fresh:
                    self._controls[key] = control
        finally:
            self._restore(saved)
        return rel, control, n_parts

    def check(
        self,
        sym: Symmetry,
        element: Any,
        zero_eps: bool,
        tolerance: float,
        scale: float,
        control: bool = True,
        scopes: Sequence[str] = (),
        climb: bool = True,
    ) -> Check:
        """Check ``sym`` under ``element`` on the copy with the model's eps or eps → 0.

        ``scopes`` (deepest first) are the submodules holding every use of the symmetry's
        parameters: the check runs on the first one that reran faithfully and whose output
        the symmetry does not act on, and, with ``climb``, moves to the next one (the whole
        model last) while it fails or is degenerate. At the whole model it is the check
        of the full signal. ``control=False`` skips the degeneracy control (only the relative
        change is wanted).
        """
        c = self.copy(zero_eps)
        s64 = _rebind(sym, c.mapping)
        skip = producers(s64, c.model, self._index[zero_eps])
        for scope in [*scopes, ""]:
            # a scope is tried (its rerun compared with the forward) only when reached: the
            # enclosing ones of a GPT-2 attention are the whole model again
            if scope and (scope in skip or not self._scope_ok(c, scope, tolerance)):
                continue
            chk = self._check_at(c, s64, element, zero_eps, tolerance, scale, control, scope, skip)
            if not climb or not scope or (not chk.degenerate and chk.rel <= tolerance):
                return chk
        raise AssertionError("unreachable: the whole model is the last scope")

    def _check_at(
        self,
        c: _Copy,
        s64: Symmetry,
        element: Any,
        zero_eps: bool,
        tolerance: float,
        scale: float,
        control: bool,
        scope: str,
        skip: set[str],
    ) -> Check:
        base = self._base_of(c, scope)
        gen = torch.Generator().manual_seed(self.seed + 1) if control else None
        rel, ctrl, n = self._measure(c, s64, element, gen, scale, base, scope, skip, True)
        where = "at the current parameters"
        if not control:
            return Check(rel, ctrl, False, where, scope)
        if ctrl <= DEGENERATE * tolerance:
            saved = self._perturb(c, s64, gen)  # type: ignore[arg-type]
            c.pristine = False  # the model's tensors no longer restore this point
            try:
                here = self._signal(c, scope)
                rel, ctrl, n = self._measure(c, s64, element, gen, scale, here, scope, skip)
            finally:
                self._restore(saved)
                c.pristine = True
            where = (
                "at a random parameter point (at the current one the signal hardly "
                "depends on these parameters)"
            )
        degenerate = not ctrl > DEGENERATE * tolerance
        what = "the output"
        if scope:
            mod = c.model.get_submodule(scope)
            what = (
                f"the output of {type(mod).__name__} {scope} (rerun alone on the inputs it "
                "received in the model's forward)"
            )
        how = (
            f"{what} and {n - 1} layer outputs (float64, "
            f"{'eps → 0' if zero_eps else 'model eps'}) {where}: change {rel:.2g}, "
            f"vs {ctrl:.2g} under a generic perturbation"
        )
        return Check(rel, ctrl, degenerate, how, scope)

    def check_composed(self, items: Sequence[tuple[Symmetry, Any]], zero_eps: bool) -> float:
        """Relative change of the whole model's signal under all ``(symmetry, element)`` at once.

        The elements are applied one after the other; the signal skips the layers any of
        them acts on from the output side. Parameters and buffers are restored afterwards.
        """
        c = self.copy(zero_eps)
        base = self._base_of(c, "")
        s64s = [_rebind(s, c.mapping) for s, _ in items]
        index = self._index[zero_eps]
        skip: set[str] = set().union(*(producers(s, c.model, index) for s in s64s))
        saved = self._state(s64s, c)
        try:
            for s64, (_, element) in zip(s64s, items, strict=True):
                s64.apply_(element)
            return self._streamed(c, base, skip)
        finally:
            self._restore(saved)

    def _streamed(self, c: _Copy, base: dict[str, Tensor], skip: set[str]) -> float:
        """:meth:`_rel` of a whole-model signal, each layer output compared as it is produced.

        The same relative changes (a part of one call: the same norm of the same difference;
        of several calls: the root of their squared norms), without holding a second copy
        of every layer output of the model.
        """
        c.against, c.diffs = base, {}
        try:
            main = self._signal(c)[""]
        finally:
            c.against = None
        worst = self._rel({"": main}, base, skip)
        for k, (norms, seen) in c.diffs.items():
            b = base[k]
            if k in skip or seen != b.numel():
                continue
            diff = norms[0] if len(norms) == 1 else math.sqrt(sum(x * x for x in norms))
            d = diff / float(b.norm().clamp_min(1e-300))
            if not d <= worst:  # NaN counts as the worst change
                worst = d if d == d else float("inf")
        return worst

    @staticmethod
    def _perturb(c: _Copy, s64: Symmetry, gen: torch.Generator) -> list[tuple[Tensor, Tensor]]:
        ids = {id(p) for p in s64.params}
        saved: list[tuple[Tensor, Tensor]] = []
        with torch.no_grad():
            for p in c.model.parameters():
                if id(p) in ids or not bool(p.detach().any()):
                    saved.append((p, p.detach().clone()))
                    rms = float(p.detach().pow(2).mean().sqrt()) if p.numel() else 0.0
                    std = max(rms, 0.1)  # tiny parameters (a 1e-6 layer scale) become generic
                    p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * std)
        return saved

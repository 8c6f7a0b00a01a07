"""An ordered collection of symmetries of one model, with numerical verification."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from noetherflow._checks import (
    check_bool,
    check_finite_model,
    check_instance,
    check_positive,
    check_seed,
)
from noetherflow._errors import SymmetryDefinitionError, SymmetryNotPresentError
from noetherflow._inputs import ModelInputs
from noetherflow._shard import refuse_sharded
from noetherflow.symmetry.base import DiagonalSymmetry, Symmetry, unique_params

if TYPE_CHECKING:
    from noetherflow.symmetry.coverage import CoverageReport, DetectionReport

__all__ = ["SymmetrySet", "VerifyResult"]


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of the numerical check of one symmetry."""

    name: str
    rel_change: float
    tolerance: float
    verified: bool


def _as_outputs(out: Any) -> Tensor:
    from noetherflow.symmetry._fx.capture import flat_outputs

    # tensors inside tuples, lists and dicts; other objects (a key/value cache) are skipped
    return flat_outputs(out)


_TOL = "the largest accepted relative change of the outputs"
_HINTS = {
    "rescaling": "a non-homogeneous activation (tanh, GELU, ReLU6, SiLU) or another reader of "
    "the neurons (a residual connection) between the layers",
    "scale": "the normalisation's eps (compare with eps → 0), BatchNorm in eval mode, or "
    "another reader of the scaled features",
    "rotation": "something element-wise between the two maps (an activation, dropout in "
    "training mode, a rotary position embedding), or weight tying",
    "dense": "the generator does not leave the loss unchanged",
}


class SymmetrySet:
    """Symmetries of one model, each with a unique name.

    Args:
        symmetries: the symmetries. Names come from each symmetry's ``label`` or are
            ``"<family><index>"``.
    """

    def __init__(self, symmetries: Iterable[Symmetry] = ()) -> None:
        self._syms: list[Symmetry] = []
        self._names: list[str] = []
        self._params: list[nn.Parameter] | None = None
        self._keys: dict[tuple[Any, ...], str] | None = None
        self._cover: dict[tuple[int, ...], list[list[Symmetry]]] = {}
        self.verification: dict[str, VerifyResult] = {}
        # Filled by nf.find_symmetries: what detection learnt, and parameter names so that
        # to_dict()/table() name parameters without being given the model.
        self.detection: DetectionReport | None = None
        self.param_names: dict[int, str] = {}
        # Filled by nf.find_symmetries: the example inputs and (weakly) the model, which
        # nf.teleport runs to check that a teleport leaves the outputs unchanged.
        self.probe: Any = None
        self.model_ref: Any = None
        for s in symmetries:
            self.add(s)

    def __getstate__(self) -> dict[str, Any]:
        # the weak reference to the model does not pickle; a loaded set has no probe model
        state = dict(self.__dict__)
        state["model_ref"] = None
        state["_keys"] = None  # keyed by parameter ids: those of the copy differ
        state["_cover"] = {}  # the same
        return state

    def add(self, sym: Symmetry) -> None:
        """Append a symmetry; its name must be unique in the set."""
        if not isinstance(sym, Symmetry):
            raise SymmetryDefinitionError(
                f"SymmetrySet takes Symmetry objects, got {type(sym).__name__}; build one with "
                "nf.Rescaling, nf.ScaleInvariance, nf.DoubleRotation or nf.DenseSymmetry."
            )
        name = sym.label or f"{sym.family.value}{len(self._syms)}"
        key = sym.generator_key()
        self._refuse_repeat(sym, name, key)
        if name in self._names:
            raise SymmetryDefinitionError(
                f"SymmetrySet: duplicate name {name!r}; give unique labels."
            )
        self._syms.append(sym)
        self._names.append(name)
        self._params = None
        self._cover = {}  # a new dict: a subset's additions never reach its parent's memo
        if key is not None:
            self._generator_keys()[key] = name

    def _generator_keys(self) -> dict[tuple[Any, ...], str]:
        """Generator key → name of the symmetries in the set (built again after a copy)."""
        keys: dict[tuple[Any, ...], str] | None = getattr(self, "_keys", None)
        if keys is None:
            keys = {}
            for n, s in zip(self._names, self._syms, strict=True):
                k = s.generator_key()
                if k is not None:
                    keys.setdefault(k, n)
            self._keys = keys
        return keys

    def _refuse_repeat(self, sym: Symmetry, name: str, key: tuple[Any, ...] | None) -> None:
        """A symmetry already in the set (the object, or its generator on the same parameters).

        A repeat counts its charge, flow and teleport twice and makes the joint solve
        degenerate (one generator twice), so it is refused rather than kept. ``key``: its
        :meth:`~noetherflow.symmetry.base.Symmetry.generator_key`.
        """
        same = next((n for n, s in zip(self._names, self._syms, strict=True) if s is sym), None)
        how = "is the same object as"
        if same is None:
            same = None if key is None else self._generator_keys().get(key)
            how = "acts on the same parameters with the same generator as"
        if same is not None:
            what = repr(name) if sym.label else f"{name!r}, {sym.describe()}"
            raise SymmetryDefinitionError(
                f"SymmetrySet: symmetry {len(self._syms)} ({what}) {how} "
                f"{same!r}; a set holds each symmetry once (a repeat would count its charge "
                "and flow twice and give the solver one direction twice). Drop the repeat, e.g. "
                "build the set from a list without duplicates."
            )

    def __iter__(self) -> Iterator[Symmetry]:
        return iter(self._syms)

    def __len__(self) -> int:
        return len(self._syms)

    def __getitem__(self, key: int | str) -> Symmetry:
        if isinstance(key, str):
            return self._syms[self._names.index(key)]
        return self._syms[key]

    @property
    def names(self) -> list[str]:
        """The symmetry names, in order."""
        return list(self._names)

    def items(self) -> list[tuple[str, Symmetry]]:
        """``(name, symmetry)`` pairs, in order."""
        return list(zip(self._names, self._syms, strict=True))

    def subset(self, indices: Iterable[int]) -> SymmetrySet:
        """The symmetries at ``indices`` (in that order) under their names in this set.

        Raises:
            ValueError: an index given twice (a set holds each symmetry once).
        """
        out = SymmetrySet()
        seen: set[int] = set()
        for i in indices:
            j = range(len(self._syms))[i]  # negative indices count from the end, as in a list
            if j in seen:
                raise ValueError(
                    f"subset: index {i} names symmetry {j} ({self._names[j]!r}) again; a set "
                    "holds each symmetry once. Pass each index once, e.g. "
                    "sorted(set(indices))."
                )
            seen.add(j)
            out._syms.append(self._syms[i])
            out._names.append(self._names[i])
        out._cover = self._cover_memo()  # the same symmetries: the same cover classes
        return out

    def _cover_memo(self) -> dict[tuple[int, ...], list[list[Symmetry]]]:
        """Which of its symmetries cover a coordinate of a parameter together, found so far.

        Keyed by the ids of the parameter and the symmetries, which this set keeps alive;
        shared with its subsets (:func:`noetherflow.kernels.base.overlaps_by_param`), and
        renewed by :meth:`add`. The classes depend only on what each symmetry acts on.
        """
        memo: dict[tuple[int, ...], list[list[Symmetry]]] | None = getattr(self, "_cover", None)
        if memo is None:  # a set pickled before the memo existed
            memo = self._cover = {}
        return memo

    def params(self) -> list[nn.Parameter]:
        """Every parameter acted on by some symmetry, once each (a new list each call)."""
        if self._params is None:
            self._params = unique_params(self._syms)
        return list(self._params)

    def diagonal(self) -> list[tuple[int, DiagonalSymmetry]]:
        """``(index, symmetry)`` of the diagonal symmetries (rescaling, scale, …), in order."""
        return [(i, s) for i, s in enumerate(self._syms) if s.commuting]  # type: ignore[misc]

    def coupled_groups(self) -> list[list[int]]:
        """Indices of symmetries whose statistics must be solved together, by sweeps.

        Symmetries sharing a parameter are linked; a connected component that holds a
        rotation or dense symmetry sharing a parameter with another symmetry (a chain) needs
        sweeps with transported per-sample gradients. Returns those components (index lists,
        in set order). The components are independent: no symmetry outside one shares a
        parameter with it, so each is solved on its own. Diagonal symmetries linked only to
        one another commute and are solved jointly without sweeps; they are not listed.
        """
        n = len(self._syms)
        parent = list(range(n))

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        owner: dict[int, int] = {}
        for i, s in enumerate(self._syms):
            for p in s.params:
                parent[find(i)] = find(owner.setdefault(id(p), i))
        groups: dict[int, list[int]] = {}
        for i in range(n):
            groups.setdefault(find(i), []).append(i)
        return [
            g for g in groups.values() if len(g) > 1 and not all(self._syms[i].commuting for i in g)
        ]

    # -- verification -----------------------------------------------------------------------
    def verify(
        self,
        model: nn.Module,
        inputs: Any,
        *,
        loss_fn: Callable[[Any, Any], Tensor] | None = None,
        targets: Any = None,
        scale: float = 0.5,
        tolerance: float | None = None,
        seed: int = 0,
        strict: bool = True,
    ) -> list[VerifyResult]:
        """Check numerically that each symmetry leaves the model unchanged.

        Each symmetry is applied alone with a random group element of size ``scale`` to a
        float64 copy of the model; the relative change of the outputs (or of the loss, when
        ``loss_fn`` is given) must stay below ``tolerance`` (default 1e-9). ``inputs`` is a
        tensor, a tuple of positional inputs or a dict of keyword inputs, as in
        :func:`noetherflow.find_symmetries`.

        Raises:
            SymmetryNotPresentError: when ``strict`` and a symmetry changes the outputs.
            ValueError: a NaN/Inf parameter or input (named), or ``scale``/``tolerance`` not
                a finite number > 0 (0 would pass vacuously, < 0 would fail every symmetry).
        """
        from noetherflow.symmetry._fx.layers import norm_spec

        refuse_sharded(
            model,
            "SymmetrySet.verify",
            "verification runs float64 copies of the model with whole parameters: verify "
            "before sharding (find_symmetries verifies what it finds).",
        )
        check_instance(model, nn.Module, "verify: model", "the nn.Module the symmetries act on")
        check_seed(seed)
        check_bool(strict, "strict")
        tol = 1e-9 if tolerance is None else check_positive(tolerance, "tolerance", _TOL)
        check_positive(scale, "scale", "the size of the random group element")
        inp = ModelInputs.of(inputs, "verify")
        check_finite_model(model, "verify")
        inp.check_nonempty("verify")
        inp.check_finite("verify")
        x64 = inp.map(_to64)
        y64 = _to64(targets)

        def make_copy(zero_eps: bool) -> tuple[nn.Module, dict[int, Any]]:
            m64 = copy.deepcopy(model).to(torch.float64)
            for m in m64.modules() if zero_eps else ():
                spec = norm_spec(m)
                if spec is not None:  # scale invariance is exact at eps → 0 only
                    setattr(m, spec.eps_attr, torch.finfo(torch.float64).tiny)
            return m64, copy_mapping(model, m64)

        copies = [make_copy(False), make_copy(True)]
        states = [{k: v.clone() for k, v in m.state_dict().items()} for m, _ in copies]

        def evaluate(which: int) -> Tensor:
            m64 = copies[which][0]
            m64.load_state_dict(state_buffers_only(m64, states[which]), strict=False)
            # the same RNG state in every pass: train-mode dropout draws the same masks
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                out = x64(m64)
                return loss_fn(out, y64).reshape(1) if loss_fn is not None else _as_outputs(out)

        gen = torch.Generator().manual_seed(seed)
        try:
            bases = [evaluate(0), evaluate(1)]
        except (RuntimeError, TypeError, AttributeError, IndexError) as e:
            why = inp.forward_error(e, "verify")
            if loss_fn is not None:
                why += f" (or loss_fn(outputs, targets) with targets a {type(targets).__name__})"
            raise ValueError(why) from e
        if not bool(torch.isfinite(bases[0]).all()):
            bad_in = any(
                isinstance(t, Tensor) and t.is_floating_point() and not bool(t.isfinite().all())
                for t in x64.tensors()
            )
            raise ValueError(
                "verify: the inputs contain NaN or Inf; expected finite inputs. Pass a finite "
                "batch."
                if bad_in
                else "verify: the model's outputs on these inputs are not finite (NaN or Inf) "
                "before any symmetry is applied; expected finite outputs. Check the model and "
                "the inputs."
            )
        results = []
        for name, sym in self.items():
            which = int(sym.needs_zero_eps)
            sym64 = _rebind(sym, copies[which][1])
            saved = {p: p.detach().clone() for p in sym64.params}
            sym64.apply_(sym64.random_element(scale, gen))
            after = evaluate(which)
            with torch.no_grad():
                for p, v in saved.items():
                    p.copy_(v)
            base = bases[which]
            rel = float((after - base).norm() / base.norm().clamp_min(1e-300))
            res = VerifyResult(name, rel, tol, rel <= tol)
            self.verification[name] = res
            results.append(res)
        bad = [r for r in results if not r.verified]
        if strict and bad:
            lines = "; ".join(
                f"{r.name} (relative change {r.rel_change:.3g}; for a {self[r.name].family.value} "
                f"symmetry look for {_HINTS.get(self[r.name].family.value, 'what breaks it')})"
                for r in bad
            )
            raise SymmetryNotPresentError(
                f"The model does not have these declared symmetries: {lines}. Expected a "
                f"relative change of the outputs ≤ {tol:g} under a random group element (scale "
                "invariances checked with normalisation eps → 0). Remove them from the set."
            )
        return results

    # -- presentation -----------------------------------------------------------------------
    def to_dict(self, model: nn.Module | None = None) -> list[dict[str, Any]]:
        """One entry per symmetry: family, modules (parameter names), size, verified, tolerance."""
        names = _param_names(model) if model is not None else self.param_names
        out = []
        for name, s in self.items():
            v = self.verification.get(name)
            out.append(
                {
                    "name": name,
                    "family": s.family.value,
                    "modules": [names.get(id(p), f"param{i}") for i, p in enumerate(s.params)],
                    "size": s.size,
                    "verified": bool(v.verified) if v else False,
                    "tolerance": float(v.tolerance) if v else float("nan"),
                }
            )
        return out

    def table(self, model: nn.Module | None = None) -> Any:
        """A rich Table of the symmetries."""
        from rich.table import Table

        t = Table(title=f"{len(self)} symmetries")
        for col in ("name", "family", "acts on", "size", "verified"):
            t.add_column(col)
        for row in self.to_dict(model):
            ok = "—" if row["name"] not in self.verification else ("✓" if row["verified"] else "✗")
            t.add_row(row["name"], row["family"], ", ".join(row["modules"]), str(row["size"]), ok)
        return t

    def coverage(self, model: nn.Module) -> CoverageReport:
        """Every parameter of ``model``: which symmetries act on it, or none and why.

        For a set returned by :func:`noetherflow.find_symmetries` the reasons come from the
        detection (residual connections, non-homogeneous activations with the measured error
        of the approximate symmetry, weight tying, BatchNorm in eval mode, unsupported
        modules); for a hand-built set, parameters without a symmetry are listed as such.
        """
        from noetherflow.symmetry.coverage import build_coverage

        if not isinstance(model, nn.Module):
            raise TypeError(
                f"coverage(model): got a {type(model).__name__}, expected the nn.Module the "
                "symmetries were built from."
            )
        return build_coverage(self, model, self.detection)

    def __str__(self) -> str:
        from noetherflow.symmetry.coverage import _render

        return _render(self.table())

    def __repr__(self) -> str:
        lines = [f"SymmetrySet({len(self)} symmetries)"]
        for name, s in self.items():
            lines.append(f"  {name}: {s.describe()}")
        return "\n".join(lines)


def _param_names(model: nn.Module | None) -> dict[int, str]:
    if model is None:
        return {}
    return {id(p): n for n, p in model.named_parameters()}


def state_buffers_only(model: nn.Module, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The buffer entries of a saved state (running statistics), so evaluations do not drift."""
    bufs = {n for n, _ in model.named_buffers()}
    return {k: v for k, v in state.items() if k in bufs}


def _to64(x: Any) -> Any:
    if isinstance(x, Tensor):
        return x.to(torch.float64) if x.is_floating_point() else x
    if isinstance(x, tuple | list):
        return type(x)(_to64(v) for v in x)
    if isinstance(x, dict):
        return {k: _to64(v) for k, v in x.items()}
    return x


def rebind_symmetry(sym: Symmetry, mapping: dict[int, Any]) -> Symmetry:
    """A copy of ``sym`` acting on the mapped parameters (``id(old) → new``: a model copy)."""
    memo: dict[int, Any] = {}
    for p in sym.params:
        if id(p) not in mapping:
            raise SymmetryDefinitionError(
                f"A symmetry acts on a parameter of shape {tuple(p.shape)} that is not in the "
                "model; build symmetries from the model's own modules."
            )
        memo[id(p)] = mapping[id(p)]
    # Modules referenced by the symmetry are copied shallowly; parameters map to the copy.
    for value in vars(sym).values():
        if isinstance(value, nn.Module):
            memo[id(value)] = _module_view(value, mapping)
    return copy.deepcopy(sym, memo)


_rebind = rebind_symmetry


def copy_mapping(original: nn.Module, clone: nn.Module) -> dict[int, Any]:
    """``id(tensor of original) → tensor of clone`` for parameters and buffers (a deep copy).

    Buffers are included so a rebound symmetry that moves running statistics (ScaleInvariance
    before a BatchNorm) moves the clone's, never the original's.
    """
    pairs = [
        *zip(original.parameters(), clone.parameters(), strict=True),
        *zip(original.buffers(), clone.buffers(), strict=True),
    ]
    return {id(a): b for a, b in pairs}


def _module_view(mod: nn.Module, mapping: dict[int, Any]) -> nn.Module:
    view = copy.copy(mod)
    view._parameters = {
        k: (mapping.get(id(v), v) if v is not None else None) for k, v in mod._parameters.items()
    }
    view._buffers = {
        k: (mapping.get(id(v), v) if v is not None else None) for k, v in mod._buffers.items()
    }
    return view

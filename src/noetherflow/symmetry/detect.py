"""Automatic detection of exponential symmetries: :func:`find_symmetries`.

1. Capture the model's graph (:mod:`noetherflow.symmetry._fx.capture`): torch.fx
   symbolically, else traced on the example inputs with concrete values (Hugging Face
   models, ``nn.Transformer``), else submodule by submodule; record every node's value.
2. Follow the features of every layer and normalisation through the graph and run one small
   matcher per pattern on where they arrive (:mod:`noetherflow.symmetry._fx`).
3. Drop candidates on parameters used more than once (shared modules, weight tying) or
   frozen, and check every remaining one numerically (:mod:`noetherflow.symmetry._fx.check`):
   a float64 copy of the model, a random group element of size ``scale``, the relative change
   of the outputs (or of the loss) and of the intermediate layer outputs must stay below
   ``tolerance``, with a control that the check is not degenerate. Each candidate is checked
   on the smallest submodule holding every use of its parameters, rerun alone on the inputs
   it received (:mod:`noetherflow.symmetry._fx.scope`), and the composed action of all of
   them once on the whole model: the cost grows linearly with depth. A large example is
   captured and checked on a bounded sample of it (:mod:`noetherflow.symmetry._fx.sample`:
   at most 8 rows, 32 tokens), so the cost does not grow with the example either.
4. Record, for every parameter, why no symmetry acts on it (:meth:`SymmetrySet.coverage`),
   including "not analysed" and why when part of the model could not be captured (a warning
   says so, and the coverage is marked incomplete).

Normalisation layers have ``eps > 0``, so the invariances they create (scale invariance of
the weights feeding BatchNorm/LayerNorm/GroupNorm/RMSNorm) hold only up to eps: scaling by
e^λ changes the output by O(eps/var). These symmetries are verified on a float64 copy whose
norm layers have eps = 0 (where they are exact) and the coverage report states the relative
change measured with the model's own eps; :func:`noetherflow.clip_to_eps` keeps a teleport
inside the region where eps does not matter. Functional normalisations (``F.layer_norm``
called outside a normalisation module) are not matched.
"""

from __future__ import annotations

import math
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from noetherflow._checks import check_finite_model, check_positive, check_seed
from noetherflow._errors import BranchWarning
from noetherflow._inputs import ModelInputs, Probe
from noetherflow._shard import refuse_sharded
from noetherflow.symmetry._fx import engine as pat
from noetherflow.symmetry._fx.branch_check import check_branches, describe_uncovered
from noetherflow.symmetry._fx.branches import Branch
from noetherflow.symmetry._fx.capture import capture
from noetherflow.symmetry._fx.check import Check, Checker
from noetherflow.symmetry._fx.layers import LAYERS
from noetherflow.symmetry._fx.matchers import run_patterns
from noetherflow.symmetry._fx.sample import Sample, sample_of
from noetherflow.symmetry._fx.scope import enclosing_scopes, param_scopes
from noetherflow.symmetry.base import Symmetry
from noetherflow.symmetry.coverage import DetectionReport
from noetherflow.symmetry.set import SymmetrySet, VerifyResult

__all__ = ["DetectionError", "find_symmetries", "symmetry_signature"]


class DetectionError(ValueError):
    """The model cannot be run on the example inputs (wrong shape, wrong type, …)."""


class _Isolated:
    """Run the model without side effects: RNG state and buffers are restored afterwards."""

    def __init__(self, model: nn.Module, seed: int) -> None:
        self.model = model
        self.seed = seed

    def __enter__(self) -> None:
        self._buffers = [(b, b.detach().clone()) for b in self.model.buffers()]
        self._rng = torch.random.fork_rng(devices=[])
        self._rng.__enter__()
        torch.manual_seed(self.seed)
        self._nograd = torch.no_grad()
        self._nograd.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._nograd.__exit__(*exc)
        self._rng.__exit__(*exc)
        with torch.no_grad():
            for b, v in self._buffers:
                b.copy_(v)


def _compiled_module(model: nn.Module) -> nn.Module:
    """The module ``torch.compile`` wrapped (same parameters): the wrapper does not trace."""
    inner = getattr(model, "_orig_mod", None)
    return _compiled_module(inner) if isinstance(inner, nn.Module) else model


def _run_failed(model: nn.Module, inp: ModelInputs, exc: Exception) -> DetectionError:
    first_line = (str(exc).strip().splitlines() or [""])[0]
    dtype = inp.dtype_hint(exc)
    if dtype is not None:
        hint = f" Here {dtype}"
    elif isinstance(exc, IndexError):
        hint = _index_hint(model, inp)
    else:
        hint = _first_layer_hint(model)
    return DetectionError(
        f"find_symmetries: running {type(model).__name__} on example inputs of shape "
        f"{inp.describe()} failed with {type(exc).__name__}: {first_line}. Expected inputs the "
        f"model accepts, e.g. a small batch.{hint} Pass example_inputs with the model's input "
        "shape (a tuple for several positional inputs, a dict for keyword inputs)."
    )


def _index_hint(model: nn.Module, inp: ModelInputs) -> str:
    """An index out of range: the integer inputs' largest id against the embedding tables."""
    ids = [
        (k, int(v.max()))
        for k, v in inp.named_leaves()
        if isinstance(v, Tensor) and v.numel() and not v.is_floating_point()
    ]
    tables = [
        f"{name} ({m.num_embeddings} tokens)"
        for name, m in model.named_modules()
        if isinstance(m, nn.Embedding)
    ]
    if not ids or not tables:
        return ""
    held = ", ".join(f"{k} holds ids up to {mx}" for k, mx in ids)
    return (
        f" Here {held}, and the model's nn.Embedding tables are {', '.join(tables)}: an id "
        "must be below the num_embeddings of the table it indexes."
    )


def _first_layer_hint(model: nn.Module) -> str:
    """What the first registered linear layer expects, its layout from the layer registry.

    No numeric recognition here: the model has just failed to run.
    """
    for m in model.modules():
        fn = LAYERS.lookup(type(m))
        spec = None if fn is None else fn(m)
        w = getattr(m, "weight", None)
        if spec is None or not isinstance(w, Tensor) or w.dim() <= spec.w_in:
            continue
        n_in = int(w.shape[spec.w_in]) * spec.groups
        what = "input channels" if spec.conv else "input features"
        kind = "conv" if spec.conv else type(m).__name__
        return f" The first {kind} layer expects {n_in} {what}."
    return ""


@dataclass
class _Verified:
    """A candidate under verification: its group element, scopes and deciding check."""

    prop: pat.Proposal
    sym: Symmetry
    element: Any
    scopes: tuple[str, ...]  # submodules holding every use of its parameters, deepest first
    chk: Check | None = None  # the deciding check (None: not verified)
    rel_model: float = math.nan  # relative change with the model's own eps
    composed: tuple[int, float, str] | None = None  # (count, change, where) of its composed check


def _verify(
    v: _Verified,
    checker: Checker,
    tolerance: float,
    scale: float,
    detection: DetectionReport,
    ledger: pat.Ledger,
    whole: bool = False,
    deferred: list[_Verified] | None = None,
) -> bool:
    """Check one candidate (on its smallest faithful scope unless ``whole``); record why not.

    A degenerate check is appended to ``deferred`` (to be repeated on the whole example)
    instead of being recorded, when ``deferred`` is given.
    """
    prop, sym, element = v.prop, v.sym, v.element
    scopes = () if whole else v.scopes
    if prop.approximate:
        # measured, never claimed: on the smallest scope where it can be measured
        on_model = checker.check(sym, element, False, tolerance, scale, scopes=scopes, climb=False)
        where = f" (output of {on_model.scope}, rerun alone)" if on_model.scope else ""
        msg = (
            f"approximate {prop.family.value} {prop.label} {prop.note}: relative output change "
            f"{on_model.rel:.2g}{where} under a random element of size {scale:g} (a generic "
            f"perturbation: {on_model.control:.2g}); not claimed"
        )
        for p in prop.params:
            detection.approximate.setdefault(id(p), []).append(msg)
        return False
    chk = checker.check(sym, element, prop.uses_norm_eps, tolerance, scale, scopes=scopes)
    v.chk, v.rel_model = None, chk.rel
    if prop.uses_norm_eps:  # the change with the model's eps, on the scope that decided
        at = (chk.scope,) if chk.scope else ()
        v.rel_model = checker.check(
            sym, element, False, tolerance, scale, control=False, scopes=at, climb=False
        ).rel
    if chk.degenerate and deferred is not None:
        deferred.append(v)
        return False
    if chk.degenerate:
        why = (
            f"degenerate check: a generic perturbation of the same parameters changes the "
            f"signal by only {chk.control:.2g}, even at a perturbed parameter point"
        )
        detection.rejected.append((prop.label, why))
        ledger.note(list(prop.params), f"candidate {prop.label} not verified: {why}")
        return False
    if not chk.rel <= tolerance:
        detection.rejected.append(
            (prop.label, f"relative change {chk.rel:.3g} > tolerance {tolerance:g}")
        )
        ledger.note(
            list(prop.params),
            f"candidate {prop.label} failed the numerical check (relative change {chk.rel:.2g})",
        )
        return False
    v.chk = chk
    return True


def _confirm_on_whole_model(
    verified: list[_Verified],
    checker: Checker | None,
    tolerance: float,
    scale: float,
    detection: DetectionReport,
    ledger: pat.Ledger,
    where: str = "",
) -> None:
    """One whole-model check of the composed action of the candidates verified on submodules.

    Per copy (model eps, eps → 0), each of them gets ``v.composed = (count, relative change,
    where)``. Should it exceed ``tolerance`` (state a submodule changed besides its output),
    each of them is checked again on the whole model, as if no submodule had been used.
    """
    for zero in (False, True):
        group = [v for v in verified if v.chk and v.chk.scope and v.prop.uses_norm_eps == zero]
        if not group:
            continue
        assert checker is not None
        rel = checker.check_composed([(v.sym, v.element) for v in group], zero)
        for v in group:
            v.composed = (len(group), rel, where)
        if not rel <= tolerance:
            for v in group:
                _verify(v, checker, tolerance, scale, detection, ledger, whole=True)


def _on_branches(
    model: nn.Module,
    inp: ModelInputs,
    branches: list[Branch],
    verified: list[_Verified],
    loss_fn: Callable[[Any, Any], Tensor] | None,
    targets: Any,
    seed: int,
    detection: DetectionReport,
    ledger: pat.Ledger,
) -> dict[int, str]:
    """Check ``verified`` on inputs taking the other branches of control flow on the inputs.

    Rejects (``v.chk = None``) the candidates that fail there; returns ``id(v)`` → why for
    those kept but not verified on every branch (see :mod:`.branch_check`). Warns, naming the
    branches, unless every branch was seen both ways and every candidate held on each.
    """
    live = [v for v in verified if v.chk is not None]
    if not branches or not live:
        return {}
    tol = detection.tolerance
    checkers: dict[int, Checker] = {}

    def check_on(var: ModelInputs, i: int) -> float:
        if id(var) not in checkers:
            checkers.clear()  # one variant at a time: its float64 copies only
            checkers[id(var)] = Checker(model, var, loss_fn, targets, seed, _Isolated)
        v = live[i]
        chk = checkers[id(var)].check(
            v.sym, v.element, v.prop.uses_norm_eps, tol, detection.scale, control=False, climb=False
        )
        return chk.rel

    verdict = check_branches(
        model, inp, lambda: _Isolated(model, seed), seed, check_on, len(live), tol
    )
    for i, why in verdict.failed.items():
        live[i].chk = None
        detection.rejected.append((live[i].prop.label, why))
        ledger.note(list(live[i].prop.params), f"candidate {live[i].prop.label} {why}")
    what = verdict.describe()
    detection.notes.append(
        f"the forward converts input-dependent values to Python (control flow on the inputs): "
        f"{what}; the symmetries were checked on {verdict.others} variant(s) of the example "
        "inputs that take other branches"
    )
    unproven: dict[int, str] = {}
    if verdict.uncovered:
        why = (
            "the forward branches on input values at "
            f"{describe_uncovered(verdict.uncovered)}, and no variant of the example took "
            "every other branch"
        )
        unproven = {id(v): why for v in live if v.chk is not None}
    if verdict.failed or unproven:
        warnings.warn(
            f"find_symmetries: the forward branches on the values of its inputs ({what}): the "
            "traced graph holds for the example's branch only. "
            f"{len(verdict.failed)} symmetr(ies) failed on inputs taking another branch and "
            f"were dropped; {len(unproven)} are kept but not marked verified "
            "(syms.verification[name].verified is False). See syms.coverage(model).",
            BranchWarning,
            stacklevel=3,
        )
    return unproven


def _runs_on(model: nn.Module, sample: Sample, loss_fn: Any, seed: int) -> bool:
    """The model (and the loss) run on the sample: else the whole example is used."""
    with _Isolated(model, seed):
        try:
            out = sample.inp(model)
            if loss_fn is not None:
                loss_fn(out, sample.targets)
        except Exception:
            return False
    return True


def _on_whole_example(
    checker: Checker,
    inp: ModelInputs,
    targets: Any,
    degenerate: list[_Verified],
    detection: DetectionReport,
    ledger: pat.Ledger,
) -> list[_Verified]:
    """The candidates whose check was degenerate on the sample, checked on the whole example.

    With a checker of the whole example that shares the sample's float64 copies: each on its
    scopes, recorded as :func:`_verify` does, then the composed action of those verified on
    submodules on the whole model. Returns the verified ones.
    """
    scopes = sorted({s for v in degenerate for s in v.scopes})
    whole = checker.on_inputs(inp, targets, scopes)
    tol, scale = detection.tolerance, detection.scale
    again = [v for v in degenerate if _verify(v, whole, tol, scale, detection, ledger)]
    whole.release(scopes)
    _confirm_on_whole_model(again, whole, tol, scale, detection, ledger, "on the whole example ")
    return again


def _check_loss_runs(
    model: nn.Module, inp: ModelInputs, loss_fn: Any, targets: Any, seed: int
) -> None:
    """One ``loss_fn(model(inputs), targets)`` up front: a user's mismatch named, not torch's."""
    with _Isolated(model, seed), torch.no_grad():
        try:
            out = inp(model)
        except Exception as exc:
            raise _run_failed(model, inp, exc) from exc
    try:
        loss = loss_fn(out, targets)
    except Exception as exc:
        got = (
            f"a tensor of shape {tuple(targets.shape)}"
            if isinstance(targets, Tensor)
            else f"a {type(targets).__name__}"
        )
        raise ValueError(
            f"find_symmetries: loss_fn(model(example_inputs), targets) failed with "
            f"{type(exc).__name__}: {str(exc).strip()[:200]}; targets is {got}. Expected targets "
            "that loss_fn accepts with the model's outputs (e.g. a tensor of labels with the "
            "batch on dim 0), or loss_fn=None to compare the outputs."
        ) from exc
    if not isinstance(loss, Tensor) or not loss.is_floating_point():
        raise ValueError(
            f"find_symmetries: loss_fn returned a {type(loss).__name__}; expected a "
            "floating-point tensor (the loss)."
        )


def find_symmetries(
    model: nn.Module,
    example_inputs: Any,
    *,
    loss_fn: Callable[[Any, Any], Tensor] | None = None,
    targets: Any = None,
    tolerance: float = 1e-9,
    scale: float = 0.5,
    seed: int = 0,
) -> SymmetrySet:
    """Find the exponential symmetries of ``model`` and verify each one numerically.

    Verification: each candidate is applied with a random group element of size ``scale`` to
    a float64 copy, on the smallest submodule M that holds every use of its parameters and ran
    once in the forward, rerun alone on the inputs it received there. M's output and the
    outputs of the known layers inside it must change by at most ``tolerance``, while a
    generic perturbation of the same parameters must change them by more than 100 ×
    ``tolerance`` (else the check is repeated at a random parameter point). As no other part
    of the model reads M's parameters, M's unchanged output implies the whole model's on the
    example inputs. A candidate that fails or is degenerate on M is checked on the next
    enclosing submodule, up to the whole model. Finally the composed action of every
    candidate verified on a submodule is checked once on the whole model (outputs and layer
    outputs, with the same tolerance), which also covers state a submodule changes besides
    its output; should it fail, each of them is checked again on the whole model. The cost is
    a few whole-model forwards plus about one submodule forward per candidate: linear in
    depth (the docs page "Detection on real models" has the argument and the numbers).

    A large example is captured and checked on a sample of it: its first 8 rows and, for
    token ids ``[B, T]``, its first ⌊32 / rows⌋ tokens of each row (the targets cut alike),
    since a check needs a signal that depends on the parameters, not a large batch. A
    candidate whose check is degenerate on the sample is checked again on the whole example;
    a model that does not run on the sample is checked on the whole example.

    Args:
        model: any ``nn.Module``; its current mode matters (BatchNorm's scale invariance
            exists in training mode only, dropout breaks rotations in training mode).
        example_inputs: a small batch: a tensor, a tuple of positional inputs, or a dict of
            keyword inputs (``model(**example_inputs)``, e.g. a Hugging Face batch
            ``{"input_ids": ids, "attention_mask": mask}``; a model taking one dict as its
            only positional input gets ``(batch,)``).
        loss_fn: compare ``loss_fn(model(x), targets)`` instead of the outputs.
        targets: the targets of ``loss_fn``.
        tolerance: largest accepted relative change under a random group element (float64).
        scale: size of the random group element (λ in [−scale, scale] per generator for
            rescaling and scale invariance; ‖B‖₂ = scale for G = e^B of a rotation).
        seed: seeds the group elements and any dropout in the forward passes.

    Returns:
        A :class:`SymmetrySet` of verified symmetries in graph order, with
        ``syms.verification`` filled in and ``syms.coverage(model)`` available. A model with
        no symmetry gives an empty set.

    Raises:
        DetectionError: the model does not run on ``example_inputs``.
        TypeError: ``example_inputs`` is None or a dict with non-string keys.
        ValueError: a NaN/Inf parameter or input (named), or ``tolerance``/``scale`` not a
            finite number > 0.

    Example:
        >>> import torch, noetherflow as nf
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        >>> syms = nf.find_symmetries(net, torch.randn(5, 3))
        >>> [s.family.value for s in syms]
        ['rescaling']
    """
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"find_symmetries: model is a {type(model).__name__}, expected an nn.Module."
        )
    model = _compiled_module(model)
    check_positive(tolerance, "tolerance", "the largest accepted relative change")
    check_positive(scale, "scale", "the size of the random group element")
    check_seed(seed)
    refuse_sharded(model)
    inp = ModelInputs.of(example_inputs, "find_symmetries")
    check_finite_model(model, "find_symmetries")
    inp.check_nonempty("find_symmetries")
    inp.check_finite("find_symmetries")
    if loss_fn is not None:
        _check_loss_runs(model, inp, loss_fn, targets, seed)
    full_inp, full_targets = inp, targets
    sample = sample_of(inp, targets)
    if not sample.whole and not _runs_on(model, sample, loss_fn, seed):
        sample = Sample(inp, targets, (1, 1), None)  # the model needs the whole example
    inp, targets = sample.inp, sample.targets
    names = {id(p): n for n, p in model.named_parameters()}
    cap = capture(
        model, inp, lambda: _Isolated(model, seed), lambda exc: _run_failed(model, inp, exc)
    )
    infos, notes = cap.infos, cap.notes
    traced = cap.method != "per module"
    ledger = pat.Ledger(names)
    for qual, why in cap.not_analysed.items():
        mod = model.get_submodule(qual) if qual else model
        own = list(mod.parameters(recurse=not qual == ""))
        ledger.note(own, f"not analysed: {qual or '(root)'} {why}")
    for info in infos:
        pat.count_uses(info, ledger)
    proposals: list[pat.Proposal] = []
    for info in infos:
        proposals.extend(run_patterns(info, ledger))
    detection = DetectionReport(
        traced=traced,
        complete=traced,
        tolerance=tolerance,
        scale=scale,
        notes=notes,
        unsupported=dict(ledger.unsupported),
        matmul_reads=dict(ledger.matmul_reads),
    )
    uses = param_scopes(infos, model)
    scopes = {id(p): enclosing_scopes(p.params, uses) for p in proposals}
    every_scope = sorted({s for ss in scopes.values() for s in ss})
    checker = (
        Checker(model, inp, loss_fn, targets, seed, _Isolated, every_scope) if proposals else None
    )
    gen = torch.Generator().manual_seed(seed)
    verified: list[_Verified] = []
    degenerate: list[_Verified] | None = None if sample.whole else []
    seen: set[tuple[str, tuple[int, ...]]] = set()
    order = sorted(proposals, key=lambda q: (q.order, q.sub))
    # the last candidate that may check on each scope: its signal is dropped after that one
    last_use = {s: i for i, q in enumerate(order) for s in scopes[id(q)]}
    for i, prop in enumerate(order):
        if checker is not None:
            checker.release([s for s in scopes[id(order[i - 1])] if last_use[s] < i] if i else [])
        key = (prop.label, tuple(sorted(map(id, prop.params))))
        if key in seen:
            continue  # the same candidate at another use of a shared module
        seen.add(key)
        bad = [p for p in prop.params if not ledger.eligible(p)]
        if bad and ledger.shared_uses(prop.params) and not prop.approximate:
            bad = []  # a shared module called k times: checked numerically like any other
            prop.note = (prop.note + "; " if prop.note else "") + (
                f"its module is shared: used {ledger.shared_uses(prop.params)} times, "
                "the same transformation at every use"
            )
        if bad:
            for p in bad:
                why = (
                    "frozen (requires_grad=False)"
                    if not p.requires_grad
                    else f"used {ledger.uses.get(id(p), 0)} times in the graph (a shared module, "
                    "weight tying, or a parameter read twice)"
                )
                ledger.note(
                    list(prop.params), f"{prop.label} not claimed: {names.get(id(p), '?')} is {why}"
                )
            continue
        try:
            sym = prop.build()
        except ValueError as exc:
            detection.rejected.append((prop.label, str(exc)))
            continue
        assert checker is not None
        element = sym.random_element(scale, gen)
        v = _Verified(prop, sym, element, scopes[id(prop)])
        if _verify(v, checker, tolerance, scale, detection, ledger, deferred=degenerate):
            verified.append(v)
    if checker is not None:
        checker.release(every_scope)  # the composed check needs the whole model's signal only
    _confirm_on_whole_model(verified, checker, tolerance, scale, detection, ledger)
    if checker is not None and not sample.whole:
        again = _on_whole_example(
            checker, full_inp, full_targets, degenerate or [], detection, ledger
        )
        verified = sorted([*verified, *again], key=lambda v: (v.prop.order, v.prop.sub))
        detection.notes.append(
            f"the candidates were checked on a sample of the example ({sample.describe()}); "
            f"{len(degenerate or [])} whose check was degenerate there were checked again on "
            "the whole example"
        )
    unproven = _on_branches(
        model, inp, cap.branches, verified, loss_fn, targets, seed, detection, ledger
    )
    found: list[tuple[str, Symmetry, VerifyResult]] = []
    labels: set[str] = set()
    kept: dict[Any, str] = {}  # generator key → label: two matchers may propose one symmetry
    for v in verified:
        if v.chk is None:
            continue  # failed the whole-model check of the fallback
        twin: Any = v.sym.generator_key() or id(v.sym)
        if twin in kept:  # a set holds each symmetry once: the first proposal is kept
            detection.sym_notes[kept[twin]] += f"; also proposed as {v.prop.label}"
            continue
        label = v.prop.label
        k = 2
        while label in labels:
            label, k = f"{v.prop.label}#{k}", k + 1
        labels.add(label)
        v.sym.label = label
        note = f"{v.prop.note}; " if v.prop.note else ""
        rel = v.chk.rel
        if v.prop.uses_norm_eps:
            note += f"relative change {v.rel_model:.2g} with the model's eps (eps → 0: {rel:.2g}); "
        tail = ""
        if v.chk.scope and v.composed is not None:
            n, rel_all, where = v.composed
            tail = (
                f"; the whole model ({'eps → 0' if v.prop.uses_norm_eps else 'model eps'}) "
                f"{where}under the composed action of the {n} symmetries verified on "
                f"submodules: change {rel_all:.2g}"
            )
        detection.sym_notes[label] = f"{label}: {note}verified on {v.chk.how}{tail}"
        ok = id(v) not in unproven
        if not ok:
            detection.sym_notes[label] += f"; NOT verified for every input: {unproven[id(v)]}"
        found.append((label, v.sym, VerifyResult(label, rel, tolerance, ok)))
        kept[twin] = label
    detection.reasons = ledger.reasons
    syms = SymmetrySet(s for _, s, _ in found)
    for label, _, res in found:
        syms.verification[label] = res
    syms.detection = detection
    syms.param_names = names
    syms.probe, syms.model_ref = Probe(full_inp), weakref.ref(model)
    if not traced:
        warnings.warn(
            f"find_symmetries: {notes[0]}. See syms.coverage(model).", UserWarning, stacklevel=2
        )
    return syms


def symmetry_signature(sym: Symmetry, names: dict[int, str]) -> tuple[Any, ...]:
    """A hashable description of what ``sym`` acts on, for exact comparisons in tests.

    Delegates to :meth:`Symmetry.signature`:

    * rescaling: ``("rescaling", first_weight_name, second_weight_name, block)``
    * scale: ``("scale", (param names…), per_channel)``
    * channel rescaling: ``("rescaling", producer terms, consumer terms)`` with each term
      ``(param name, axis, block)``
    * rotation: ``("rotation", W-side blocks, U-side blocks)`` with each block
      ``(param name, axis, start, stop)``.
    """
    return sym.signature(names)

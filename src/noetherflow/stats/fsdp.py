"""FSDP2 (``torch.distributed.fsdp.fully_shard``): symmetries and statistics of a sharded model.

``fully_shard`` keeps the module objects (their class becomes a dynamic ``FSDP<Class>``
subclass) but replaces every parameter with a new ``nn.Parameter`` holding a ``DTensor``
sharded along dim 0. A symmetry set found before sharding (the supported order:
``find_symmetries`` then ``fully_shard``; detection itself needs whole parameters) therefore
holds the old parameters; :func:`bind_sharded` points it, in place, at the sharded ones of
the same modules, by parameter name (sets from ``find_symmetries``) or through FSDP's record
of the original parameter (hand-built sets). Every entry point that takes the model
(``collect_stats``, ``capture``, ``NoetherMonitor``, ``teleport(model, …)``) calls it.

The statistics then work as under DDP: FSDP all-gathers each layer's weight for its forward
and backward, so the hooks see whole activations of the local batch; each rank forms the
statistics of its batch and :func:`~noetherflow.stats.distributed.all_reduce_stats` combines
them. The parameters themselves stay sharded; the charges and the teleport work shard by
shard where the algebra allows (``noetherflow._shard``).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

from torch import nn

from noetherflow import _shard
from noetherflow._errors import StatisticsError, UnsupportedLayerError
from noetherflow.symmetry.base import Symmetry
from noetherflow.symmetry.set import SymmetrySet

__all__ = ["bind_sharded", "check_hooks_only", "is_sharded_model", "restored_grads"]


def is_sharded_model(model: nn.Module) -> bool:
    """Whether any parameter of ``model`` is a DTensor (the model went through ``fully_shard``)."""
    return any(_shard.is_sharded(p) for p in model.parameters())


def _original_uids(model: nn.Module) -> dict[int, nn.Parameter]:
    """FSDP's id of each original parameter → the sharded parameter that replaced it."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without distributed
        return {}
    out: dict[int, nn.Parameter] = {}
    for m in model.modules():
        if not isinstance(m, FSDPModule):
            continue
        # FSDP's private record (torch 2.4+); without it only sets with names can be bound
        state = getattr(m, "_get_fsdp_state", lambda: None)()
        group = getattr(state, "_fsdp_param_group", None)
        for fp in getattr(group, "fsdp_params", ()):
            uid, param = getattr(fp, "_orig_param_uid", None), getattr(fp, "sharded_param", None)
            if uid is not None and param is not None:
                out[int(uid)] = param
    return out


def _rebind_(sym: Symmetry, mapping: dict[int, nn.Parameter], model: nn.Module) -> None:
    """Point ``sym`` (the same object, the same modules) at ``mapping``'s parameters.

    A deep copy of the symmetry's state in which every module, parameter and buffer of
    ``model`` stands for itself and each old parameter for its sharded one, written back
    into the same object.
    """
    memo: dict[int, Any] = {id(m): m for m in model.modules()}
    memo.update({id(t): t for t in (*model.parameters(), *model.buffers())})
    memo.update(mapping)
    sym.__dict__.update(copy.deepcopy(sym, memo).__dict__)


def bind_sharded(model: nn.Module, syms: SymmetrySet) -> SymmetrySet:
    """Point ``syms`` at ``model``'s sharded parameters in place (a no-op if it already is).

    Returns ``syms``. Each symmetry object stays the same object, acting on the same modules;
    only its parameters are swapped for the ones ``fully_shard`` installed.

    Raises:
        StatisticsError: a parameter of ``syms`` is neither ``model``'s nor one that
            ``fully_shard`` replaced in it.
        UnsupportedLayerError: a sharded parameter has a layout other than FSDP2's.
    """
    own = {id(p): p for p in model.parameters()}
    for pname, p in model.named_parameters():
        _shard.check_layout(p, f"parameter {pname!r}")
    params = syms.params()
    stale = [p for p in params if id(p) not in own]
    if not stale or not is_sharded_model(model):
        return syms
    by_name = dict(model.named_parameters())
    by_uid = _original_uids(model)
    mapping: dict[int, nn.Parameter] = {}
    for p in stale:
        name = syms.param_names.get(id(p))
        q = by_name.get(name) if name is not None else None
        if q is None and hasattr(p, "_fsdp_orig_uid"):
            q = by_uid.get(int(p._fsdp_orig_uid))
        if q is None or tuple(q.shape) != tuple(p.shape):
            raise StatisticsError(
                f"a symmetry acts on a parameter of shape {tuple(p.shape)} (name {name!r}) that "
                "is neither a parameter of this FSDP model nor one that fully_shard replaced "
                "in it. Find the symmetries on this model before sharding it: "
                "syms = nf.find_symmetries(model, x); fully_shard(...); then use syms."
            )
        mapping[id(p)] = q
    for s in syms:
        if any(id(p) in mapping for p in s.params):
            _rebind_(s, mapping, model)
    syms._params = None
    names = {id(p): n for n, p in model.named_parameters()}
    syms.param_names = {
        (id(mapping[i]) if i in mapping else i): n for i, n in syms.param_names.items()
    }
    for q in mapping.values():
        syms.param_names.setdefault(id(q), names[id(q)])
    return syms


def check_hooks_only(model: nn.Module, estimator: str) -> None:
    """Refuse the per-sample estimators on a sharded model, saying why and what works.

    Raises:
        UnsupportedLayerError: ``estimator`` is not ``'hooks'`` and ``model`` is sharded.
    """
    if estimator != "hooks" and is_sharded_model(model):
        raise UnsupportedLayerError(
            f"estimator={estimator!r} on an FSDP (fully_shard) model: it differentiates every "
            "sample through torch.func / separate backward passes with the parameters as "
            "inputs, which FSDP holds as shards gathered only inside its own forward and "
            "backward. Use estimator='hooks' (exact per-sample statistics from the layers' "
            "whole activations), or collect on an unsharded copy of the model."
        )


@contextlib.contextmanager
def restored_grads(model: nn.Module) -> Iterator[None]:
    """Keep ``.grad`` of ``model``'s parameters as it was around a backward pass.

    FSDP2 reduces gradients into the sharded parameters' ``.grad`` during the backward pass
    itself, so ``collect_stats`` runs a plain ``loss.backward()`` (the hooks need FSDP's
    own backward, which all-gathers the weights) and puts the old ``.grad`` back afterwards.
    """
    saved = [(p, p.grad) for p in model.parameters()]
    try:
        yield
    finally:
        for p, g in saved:
            p.grad = g

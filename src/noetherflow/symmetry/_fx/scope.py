"""Where a candidate symmetry can be verified: the smallest submodule that holds all its uses.

A candidate acts on a few parameters, and every use of them in the traced graph happens
inside the forward of some submodules (``node.meta["nn_module_stack"]``, recorded by
torch.fx). If one submodule ``M`` holds every use of every parameter the candidate acts on,
and ``M`` runs exactly once in the model's forward, the whole model is

    output = G(x, M(x_M; θ_M); θ_rest)

where ``x_M``, the inputs ``M`` received, and ``G`` do not read θ_M (no use outside ``M``).
A group element that leaves ``M``'s output unchanged on ``x_M`` therefore leaves the model's
output unchanged on the example inputs, and so does every layer after ``M``: a check of ``M``
alone, rerun on the inputs it received (:class:`ScopeRecorder`), is a check of the whole
model at a fraction of the cost (a block instead of the whole depth).

What the equation does not cover, state that ``M`` changes besides its return value (a
key/value cache filled in place, an attribute read later), is covered by one final check of
the composed action of all locally verified candidates on the whole model (see
:func:`noetherflow.find_symmetries`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from noetherflow.symmetry._fx.capture import flat_outputs
from noetherflow.symmetry._fx.engine import GraphInfo

__all__ = ["Record", "ScopeRecorder", "enclosing_scopes", "param_scopes"]

# A module stack: the qualified names of the modules whose forward runs a node, outermost
# first ("" is the root and is left out).
Stack = tuple[str, ...]


def _node_stack(info: GraphInfo, meta: dict[str, Any], valid: set[str]) -> Stack | None:
    """The node's module stack in whole-model names, or None if it cannot be trusted."""
    head: list[str] = []
    if info.prefix:  # per-module capture: the traced module and its ancestors come first
        parts = info.prefix.split(".")
        head = [".".join(parts[: i + 1]) for i in range(len(parts))]
    stack = meta.get("nn_module_stack") or {}
    names = []
    for key, value in stack.items():
        if "@" in str(key):  # a second call of the same module: no single scope
            return None
        name = value[0] if isinstance(value, tuple) and value else key
        names.append(info.qual(str(name)))
    full = tuple(head + names)
    return full if all(n in valid for n in full) else None


def param_scopes(infos: Sequence[GraphInfo], model: nn.Module) -> dict[int, list[Stack | None]]:
    """``id(parameter) →`` the module stack of each of its uses in the graphs.

    A use is a ``call_module`` node of a leaf module owning the parameter or a ``get_attr``
    node reading it. A stack is None when torch.fx recorded none that names real submodules.
    """
    valid = {n for n, _ in model.named_modules() if n}
    out: dict[int, list[Stack | None]] = {}
    for info in infos:
        for node in info.gm.graph.nodes:
            if node.op == "call_module":
                params: Iterable[Tensor] = info.modules[str(node.target)].parameters()
            elif node.op == "get_attr" and isinstance(info.values.get(node), nn.Parameter):
                params = [info.values[node]]
            else:
                continue
            stack = _node_stack(info, node.meta, valid)
            for p in {id(p): p for p in params}.values():
                out.setdefault(id(p), []).append(stack)
    return out


def enclosing_scopes(params: Iterable[Tensor], scopes: dict[int, list[Stack | None]]) -> Stack:
    """The submodules holding every use of ``params``, deepest first (empty: only the root)."""
    common: Stack | None = None
    for p in params:
        for stack in scopes.get(id(p), [None]):
            if stack is None:
                return ()
            if common is None:
                common = stack
            else:
                n = 0
                while n < min(len(common), len(stack)) and common[n] == stack[n]:
                    n += 1
                common = common[:n]
    return tuple(reversed(common or ()))


@contextmanager
def _sharing_tensors(seen: list[Tensor]) -> Iterator[None]:
    """Within, ``copy.deepcopy`` copies containers and objects but shares plain tensors.

    A recorded input then costs its structure, not its data (a key/value cache holding every
    earlier layer would otherwise make the records quadratic in depth). Shared tensors are
    appended to ``seen`` so that their version counters can tell any in-place change.
    """
    dispatch = copy._deepcopy_dispatch  # type: ignore[attr-defined]
    before = dispatch.get(Tensor)

    def share(x: Tensor, memo: dict[int, Any]) -> Tensor:
        seen.append(x)
        return x

    dispatch[Tensor] = share
    try:
        yield
    finally:
        if before is None:
            del dispatch[Tensor]
        else:
            dispatch[Tensor] = before


@dataclass
class Record:
    """One submodule's call in the model's forward: its inputs, RNG state and output."""

    calls: int = 0
    inputs: Any = None  # (args, kwargs) with containers copied before the call, tensors shared
    versions: list[tuple[Tensor, int]] = field(default_factory=list)  # of the shared tensors
    rng: Tensor | None = None
    output: Tensor | None = None  # flat_outputs of the call, cloned
    usable: bool = True  # False if the inputs could not be copied or were changed in place

    def unchanged(self) -> bool:
        """No shared input tensor was modified in place since the call was recorded."""
        return all(t._version == v for t, v in self.versions)


class ScopeRecorder:
    """Hooks that record, during one forward of ``model``, how each named submodule was called.

    Parameters, buffers and modules are shared, not copied, in the recorded inputs: a replay
    reads the model's current parameters. So are the input tensors (:func:`_sharing_tensors`);
    a submodule whose inputs change in place, in the forward or in a replay, is not replayed.
    """

    def __init__(self, model: nn.Module, names: Iterable[str]) -> None:
        self.model = model
        self.records: dict[str, Record] = {}
        self._keep: dict[int, Any] = {id(t): t for t in [*model.parameters(), *model.buffers()]}
        self._keep.update({id(m): m for m in model.modules()})
        self._handles: list[RemovableHandle] = []
        for name in sorted(set(names)):
            mod = model.get_submodule(name)
            self.records[name] = rec = Record()
            self._handles.append(mod.register_forward_pre_hook(self._pre(rec), with_kwargs=True))
            self._handles.append(mod.register_forward_hook(self._post(rec)))

    def _copy(self, x: Any) -> tuple[Any, list[Tensor]]:
        seen: list[Tensor] = []
        with _sharing_tensors(seen):
            return copy.deepcopy(x, dict(self._keep)), seen

    def _pre(self, rec: Record) -> Any:
        def hook(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            rec.calls += 1
            if rec.calls == 1:
                try:
                    rec.inputs, seen = self._copy((args, kwargs))
                    rec.versions = [(t, t._version) for t in seen]
                except Exception:  # an input that cannot be copied: no replay of this one
                    rec.usable = False
                rec.rng = torch.get_rng_state()

        return hook

    def _post(self, rec: Record) -> Any:
        def hook(_m: nn.Module, _args: Any, out: Any) -> None:
            if rec.calls == 1 and rec.usable:
                try:
                    rec.output = flat_outputs(out).detach().clone()
                except TypeError:  # no floating-point output to compare
                    rec.usable = False

        return hook

    def remove(self) -> None:
        """Remove the hooks (the records stay)."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def replayable(self, name: str) -> bool:
        """The submodule ran exactly once, and its recorded inputs are intact."""
        rec = self.records.get(name)
        return rec is not None and rec.calls == 1 and rec.usable and rec.unchanged()

    def replay(self, name: str) -> Any:
        """Run the submodule again on its recorded inputs and RNG state.

        Raises:
            RuntimeError: the recorded inputs were changed in place since the forward.
        """
        rec = self.records[name]
        if not self.replayable(name):
            raise RuntimeError(f"{name}: its recorded inputs were changed in place")
        (args, kwargs), _ = self._copy(rec.inputs)
        assert rec.rng is not None
        torch.set_rng_state(rec.rng)
        try:
            return self.model.get_submodule(name)(*args, **kwargs)
        finally:
            if not rec.unchanged():  # this replay ran on intact inputs, later ones would not
                rec.usable = False

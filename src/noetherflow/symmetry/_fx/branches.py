"""Control flow on the values of the inputs, seen while a model is traced on its example.

The concrete tracer (:mod:`noetherflow.symmetry._fx.capture`) treats the example inputs as
constants: anything computed from the inputs alone is a plain tensor, so ``relu if x.mean() >
0 else tanh`` silently takes the branch of the example, and a symmetry verified on the
example may not hold for inputs that take the other branch. Branches on parameters are
refused by the proxies; this module finds the branches on inputs.

:class:`InputBranches` is a ``TorchFunctionMode`` that marks the input tensors and every
tensor computed from them (taint), and records each conversion of a marked tensor's *value*
into Python (``bool``, ``int``, ``float``, ``.item()``, ``.tolist()``, an index): the point
where control flow can depend on the data. Shapes are not values (``x.shape``, ``x.size()``
do not count). A :class:`Branch` names where it happened (file, line, code) and what it
evaluated to on the example.
"""

from __future__ import annotations

import linecache
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.utils._pytree as pytree
from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["Branch", "InputBranches"]

# Tensor → Python conversions: where a value can steer control flow.
_TO_PYTHON = frozenset(
    {"__bool__", "item", "tolist", "__int__", "__float__", "__index__", "__len__", "__iter__"}
)
_TO_PYTHON_SAFE = frozenset({"__len__", "__iter__"})  # length is a shape, not a value
_HERE = (
    str(Path(__file__).resolve().parents[2]),  # noetherflow itself
    str(Path(pytree.__file__).resolve().parents[1]),  # torch
)


@dataclass(frozen=True)
class Branch:
    """A conversion of an input-dependent tensor value to Python during the trace.

    ``where``: ``file:line`` of the model code that did it; ``code``: that line;
    ``op``: the conversion (``__bool__``, ``item``, …); ``value``: what it gave on the
    example (a short repr).
    """

    where: str
    code: str
    op: str
    value: str

    def describe(self) -> str:
        return f"{self.where} ({self.code!r}: {self.op} of an input-dependent value = {self.value})"


def _caller() -> tuple[str, str]:
    """``file:line`` and source of the innermost frame outside torch and noetherflow."""
    f = sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_HERE) and "<" not in fn[:1]:
            line = linecache.getline(fn, f.f_lineno).strip()
            return f"{Path(fn).name}:{f.f_lineno}", line
        f = f.f_back  # type: ignore[assignment]
    return "<unknown>", ""


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


class InputBranches(TorchFunctionMode):
    """Record Python conversions of values computed from ``inputs`` (see module docstring)."""

    def __init__(self, inputs: Iterable[Any]) -> None:
        super().__init__()
        self._taint: WeakIdKeyDictionary = WeakIdKeyDictionary()
        for t in pytree.tree_leaves(list(inputs)):
            if isinstance(t, Tensor):
                self._taint[t] = True
        self.branches: list[Branch] = []

    def tainted(self, t: Tensor) -> bool:
        """Whether ``t`` is an input or was computed from one."""
        return t in self._taint

    def _tainted(self, leaves: list[Any]) -> bool:
        return any(isinstance(a, Tensor) and a in self._taint for a in leaves)

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        leaves = pytree.tree_leaves((args, kwargs))
        tainted = self._tainted(leaves)
        out = func(*args, **kwargs)
        if not tainted:
            return out
        name = getattr(func, "__name__", "")
        if name == "__iter__":
            items = list(out)
            for o in items:
                if isinstance(o, Tensor):
                    self._taint[o] = True
            return iter(items)
        if name in _TO_PYTHON:
            if name not in _TO_PYTHON_SAFE:
                where, code = _caller()
                b = Branch(where, code, name, _short(out))
                if b not in self.branches:
                    self.branches.append(b)
            return out
        for o in pytree.tree_leaves(out):
            if isinstance(o, Tensor):
                self._taint[o] = True
        return out

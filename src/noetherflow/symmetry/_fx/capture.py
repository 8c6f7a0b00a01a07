"""Graph capture for :func:`noetherflow.find_symmetries`: three tracers, tried in order.

1. ``symbolic`` — :func:`torch.fx.symbolic_trace` of the whole model (inputs are
   placeholders): a graph valid for every input.
2. ``concrete`` — the whole model traced on the example inputs, every proxy carrying its
   concrete value (:class:`ConcreteTracer`). Control flow on shapes, ``len``, ``bool`` and
   iteration is resolved with the example inputs, so Hugging Face models (GPT-2, BERT,
   Llama, ViT, ResNet, ConvNeXt) and ``nn.Transformer`` trace. The graph is valid for
   inputs like the example; every symmetry is checked numerically on the example anyway.
3. ``per module`` — when the whole model still does not trace, its children are traced one
   by one on the inputs they received in a real forward, recursing into the children of any
   child that fails. Whatever is left is reported as *not analysed, and why*.

Leaf modules (kept as one ``call_module`` node): the layers and normalisations the matchers
understand (:func:`is_leaf`), including Hugging Face's ``Conv1D`` and ``*RMSNorm``; other
``torch.nn`` modules without children (activations, pooling, embeddings). Every other module
(``nn.TransformerEncoderLayer`` included) is traced through.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, fx, nn
from torch.fx._symbolic_trace import _orig_module_call, _orig_module_getattr
from torch.fx.proxy import Attribute

from noetherflow._inputs import ModelInputs
from noetherflow.symmetry._fx.branches import Branch, InputBranches
from noetherflow.symmetry._fx.engine import GraphInfo
from noetherflow.symmetry._fx.hub import out_of_tree_call
from noetherflow.symmetry._fx.layers import is_known_module
from noetherflow.symmetry._fx.sums import INPUT_FREE_KEY
from noetherflow.symmetry._fx.tables import names_of

__all__ = ["INPUT_FREE", "Capture", "ConcreteTracer", "capture", "flat_outputs", "is_leaf"]

#: ``GraphModule.meta`` key: names of the tensor constants the traced forward created without
#: reading the inputs (the same for every input of the example's shapes).
INPUT_FREE = INPUT_FREE_KEY

# Methods and attributes answered with the concrete value instead of a graph node.
_CONCRETE_METHODS = {
    "size",
    "dim",
    "numel",
    "nelement",
    "stride",
    "is_contiguous",
    "element_size",
    "get_device",
    "is_floating_point",
    "is_complex",
}
_CONCRETE_ATTRS = {
    "shape",
    "dtype",
    "device",
    "ndim",
    "is_cuda",
    "requires_grad",
    "is_sparse",
    "is_quantized",
    "is_nested",
    "layout",
    "is_meta",
}
# Every proxy depends on the parameters (the inputs are constants): branching on its value
# would fix the branch taken by the example, and a group element could change it.
_DATA_DEPENDENT = (
    "control flow on a value computed from the parameters (if/int/float of a tensor); the "
    "traced graph would only hold for the branch the example takes"
)


def leaf_functions() -> tuple[str, ...]:
    """Functions wrapped as one node (registered by name): the engine reads them as a whole."""
    return names_of("rotary")


class _Tracer(fx.Tracer):
    """fx's tracer with this module's leaves, tracing through modules outside the tree."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return is_leaf(m)

    def call_module(
        self,
        m: nn.Module,
        forward: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        try:
            self.path_of_module(m)
        except NameError:  # not a submodule of the root (hub-kernel wrappers): see hub.py
            return out_of_tree_call(self, m, forward, args, kwargs, frozenset(leaf_functions()))
        return super().call_module(m, forward, args, kwargs)


def is_leaf(m: nn.Module) -> bool:
    """Keep ``m`` as one node: known layers/norms, and ``torch.nn`` modules without children."""
    if is_known_module(m):
        return True
    if isinstance(m, nn.Sequential | nn.ModuleList | nn.ModuleDict):
        return False
    builtin = type(m).__module__.startswith(("torch.nn", "torch.ao.nn"))
    return builtin and not any(True for _ in m.children())


def _value(a: Any) -> Any:
    if isinstance(a, _ConcreteProxy):
        return a.value
    if isinstance(a, Attribute):
        return getattr(_value(a.root), a.attr)
    if isinstance(a, tuple | list):
        return type(a)(_value(x) for x in a)
    if isinstance(a, dict):
        return {k: _value(v) for k, v in a.items()}
    if isinstance(a, slice):
        return slice(_value(a.start), _value(a.stop), _value(a.step))
    return a


class _ConcreteProxy(fx.Proxy):
    """A proxy that also holds the concrete value of its node on the example inputs."""

    value: Any = None

    def __bool__(self) -> bool:
        raise fx.proxy.TraceError(_DATA_DEPENDENT)

    def __len__(self) -> int:
        return len(self.value)

    def __iter__(self) -> Any:
        return iter([self[i] for i in range(len(self.value))])  # type: ignore[index]

    def __index__(self) -> int:
        raise fx.proxy.TraceError(_DATA_DEPENDENT)

    def __int__(self) -> int:
        raise fx.proxy.TraceError(_DATA_DEPENDENT)

    def __float__(self) -> float:
        raise fx.proxy.TraceError(_DATA_DEPENDENT)

    def keys(self) -> Any:
        return self.value.keys()

    def __getattr__(self, k: str) -> Any:
        if k in _CONCRETE_ATTRS:
            return getattr(self.value, k)
        return super().__getattr__(k)

    def __setitem__(self, key: Any, val: Any) -> None:
        import operator

        self.tracer.create_proxy("call_function", operator.setitem, (self, key, val), {})


class ConcreteTracer(_Tracer):
    """Trace ``root`` called on fixed ``args``/``kwargs``, with concrete values on proxies."""

    def __init__(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], autowrap: tuple[Any, ...] = ()
    ) -> None:
        super().__init__(autowrap_functions=autowrap)
        self._cargs = args
        self._ckwargs = kwargs

    def create_args_for_root(
        self, root_fn: Callable[..., Any], is_module: bool, concrete_args: Any = None
    ) -> tuple[Any, list[Any]]:
        cargs, ckwargs = self._cargs, self._ckwargs

        def fn(root: nn.Module) -> Any:
            return tuple(_outputs(root_fn(root, *cargs, **ckwargs)))

        return fn, [self.root]

    def create_proxy(
        self,
        kind: str,
        target: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str | None = None,
        type_expr: Any = None,
        proxy_factory_fn: Any = None,
    ) -> Any:
        vargs, vkwargs = _value(args), _value(kwargs)
        with _unpatched():
            if kind == "call_method" and target in _CONCRETE_METHODS:
                return getattr(vargs[0], target)(*vargs[1:], **vkwargs)
            if kind == "call_function":
                value = target(*vargs, **vkwargs)
            elif kind == "call_method":
                value = getattr(vargs[0], target)(*vargs[1:], **vkwargs)
            elif kind == "call_module":
                value = self.root.get_submodule(target)(*vargs, **vkwargs)
            elif kind == "get_attr":
                value = self.root
                for atom in str(target).split("."):
                    value = getattr(value, atom)
            else:
                value = None
        proxy = super().create_proxy(
            kind,
            target,
            args,
            kwargs,
            name,
            type_expr,
            proxy_factory_fn=lambda node: _ConcreteProxy(node, self),
        )
        assert isinstance(proxy, _ConcreteProxy)
        proxy.value = value
        return proxy


@contextmanager
def _unpatched() -> Iterator[None]:
    """nn.Module's own ``__call__``/``__getattr__`` while fx has them patched (concrete values)."""
    call, getattr_ = nn.Module.__call__, nn.Module.__getattr__
    nn.Module.__call__ = _orig_module_call  # type: ignore[method-assign]
    nn.Module.__getattr__ = _orig_module_getattr  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.__call__ = call  # type: ignore[method-assign]
        nn.Module.__getattr__ = getattr_  # type: ignore[method-assign]


def _leaf_functions(model: nn.Module) -> tuple[Any, ...]:
    """The functions of :func:`leaf_functions` found in the modules defining ``model``'s parts."""
    found: dict[int, Any] = {}
    for m in model.modules():
        mod = sys.modules.get(type(m).__module__)
        for fname in leaf_functions():
            f = getattr(mod, fname, None)
            if callable(f) and hasattr(f, "__code__"):
                found[id(f)] = f
    return tuple(found.values())


def _symbolic(model: nn.Module) -> fx.GraphModule:
    tracer = _Tracer()
    tracer.proxy_buffer_attributes = True
    graph = tracer.trace(model)
    return fx.GraphModule(tracer.root, graph, type(model).__name__)


def _concrete(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[fx.GraphModule, list[Branch]]:
    """The graph traced on ``args``/``kwargs``, and the branches taken on their values."""
    tracer = ConcreteTracer(args, kwargs, _leaf_functions(model))
    before = set(model.__dict__)
    watch = InputBranches([args, kwargs])
    try:
        # enable_grad: no inference fast paths (nn.TransformerEncoderLayer)
        with torch.enable_grad(), watch:
            graph = tracer.trace(model)
        gm = fx.GraphModule(tracer.root, graph, type(model).__name__)
        # the tensors the forward made without the inputs (torch.zeros(...)), baked by fx
        gm.meta[INPUT_FREE] = frozenset(
            k
            for k in set(model.__dict__) - before
            if isinstance(model.__dict__[k], Tensor) and not watch.tainted(model.__dict__[k])
        )
        return gm, watch.branches
    finally:
        for k in set(model.__dict__) - before:  # fx stores constants on the root: remove them
            delattr(model, k)


def _record(gm: fx.GraphModule, args: tuple[Any, ...]) -> dict[fx.Node, Any]:
    interp = fx.Interpreter(gm, garbage_collect_values=False)
    interp.run(*args)
    return dict(interp.env)


def _why(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}"


@dataclass
class Capture:
    """The graphs of a model and what could not be analysed.

    ``method`` is "symbolic", "concrete" or "per module"; ``not_analysed`` maps a module's
    qualified name to the reason its parameters were not analysed; ``branches`` lists the
    control flow on input values the traced graphs fixed to the example's branch.
    """

    infos: list[GraphInfo]
    method: str
    notes: list[str] = field(default_factory=list)
    not_analysed: dict[str, str] = field(default_factory=dict)
    branches: list[Branch] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.not_analysed


def _positional(model: nn.Module, inp: ModelInputs) -> tuple[Any, ...] | None:
    """``inp`` as positional arguments of ``model.forward`` (defaults filled in), else None.

    The placeholders of a symbolically traced graph are the parameters of ``forward`` in
    order; keyword inputs are bound to them by name. None when that is not possible
    (keyword-only parameters, ``**kwargs``, an unknown name): the graph is then traced on the
    inputs instead.
    """
    if not inp.kwargs:
        return inp.args
    try:
        bound = inspect.signature(model.forward).bind(*inp.args, **inp.kwargs)
    except (TypeError, ValueError):
        return None
    bound.apply_defaults()
    return None if bound.kwargs else tuple(bound.args)


def capture(
    model: nn.Module,
    inp: ModelInputs,
    isolated: Callable[[], Any],
    run_failed: Callable[[Exception], Exception],
) -> Capture:
    """Graphs with recorded values for ``model(*inp.args, **inp.kwargs)``.

    ``isolated()`` returns a context manager that restores RNG state and buffers;
    ``run_failed(exc)`` builds the error raised when the model does not run on ``inp``.
    """
    sym_why = ""
    pos = _positional(model, inp)
    try:
        gm = _symbolic(model) if pos is not None else None
    except Exception as exc:
        gm, sym_why = None, _why(exc)
    if pos is None:
        sym_why = "keyword inputs that are not positional parameters of forward"
    if gm is not None and pos is not None:
        try:
            with isolated(), torch.no_grad():
                values = _record(gm, pos)
            return Capture([GraphInfo(gm, values)], "symbolic")
        except Exception as exc:
            try:
                with isolated():
                    inp(model)
            except Exception as exc2:
                raise run_failed(exc2) from exc2
            sym_why = _why(exc)
    try:
        with isolated():
            gm, branches = _concrete(model, inp.args, inp.kwargs)
        with isolated(), torch.no_grad():
            values = _record(gm, ())
        note = (
            f"torch.fx could not trace the model symbolically ({sym_why}); it was traced on the "
            "example inputs instead (shapes and control flow fixed to those of the example)"
        )
        return Capture([GraphInfo(gm, values)], "concrete", [note], branches=branches)
    except Exception as exc:
        concrete_why = _why(exc)
    return _per_module(model, inp, isolated, run_failed, sym_why, concrete_why)


def _per_module(
    model: nn.Module,
    inp: ModelInputs,
    isolated: Callable[[], Any],
    run_failed: Callable[[Exception], Exception],
    sym_why: str,
    concrete_why: str,
) -> Capture:
    calls: dict[str, list[tuple[tuple[Any, ...], dict[str, Any]]]] = {}
    names = {id(m): n for n, m in model.named_modules()}
    handles = []
    for name, m in model.named_modules():
        if name:

            def hook(
                mod: nn.Module, a: tuple[Any, ...], k: dict[str, Any], name: str = name
            ) -> None:
                calls.setdefault(name, []).append((a, dict(k)))

            handles.append(m.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with isolated(), torch.no_grad():
            inp(model)
    except Exception as exc:
        raise run_failed(exc) from exc
    finally:
        for h in handles:
            h.remove()
    del names
    cap = Capture(
        [],
        "per module",
        [
            f"torch.fx could not trace the whole model (symbolically: {sym_why}; on the example "
            f"inputs: {concrete_why}); its submodules were traced one by one on the inputs they "
            "received: symmetries spanning two submodules are missed and the result may be "
            "incomplete"
        ],
    )

    def visit(name: str, m: nn.Module, parent_why: str) -> None:
        own = any(True for _ in m.parameters(recurse=False))
        seen = calls.get(name, [])
        why = ""
        if is_leaf(m):
            why = f"its parent does not trace ({parent_why})"
        elif len(seen) == 1:
            a, k = seen[0]
            try:
                with isolated():
                    gm, branches = _concrete(m, a, k)
                with isolated(), torch.no_grad():
                    values = _record(gm, ())
                cap.infos.append(GraphInfo(gm, values, prefix=name))
                cap.branches.extend(b for b in branches if b not in cap.branches)
                return
            except Exception as exc:
                why = f"does not trace ({_why(exc)})"
        else:
            why = f"ran {len(seen)} times in one forward" if seen else "never ran"
        if own or is_leaf(m):
            if any(True for _ in m.parameters()):
                cap.not_analysed[name] = f"{type(m).__name__} {why}"
            return
        if not any(True for _ in m.parameters()):
            return
        for child_name, child in m.named_children():
            visit(f"{name}.{child_name}", child, why)

    for child_name, child in model.named_children():
        visit(child_name, child, concrete_why)
    if any(True for _ in model.parameters(recurse=False)):
        cap.not_analysed[""] = (
            f"{type(model).__name__} (root) owns parameters and does not trace ({concrete_why})"
        )
    return cap


def _outputs(x: Any) -> list[Any]:
    """The tensors (and tensor proxies) of a nested output, in order.

    Tuples, lists and dicts (Hugging Face ``ModelOutput`` included) are walked; other objects,
    such as a key/value cache, are not outputs of the function being analysed.
    """
    if isinstance(x, Tensor | fx.Proxy):
        return [x]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _outputs(v)]
    if isinstance(x, tuple | list):
        return [t for v in x for t in _outputs(v)]
    return []


def flat_outputs(x: Any) -> Tensor:
    """All output tensors of a model call, flattened and concatenated (see :func:`_outputs`)."""
    ts = [t for t in _outputs(x) if isinstance(t, Tensor) and t.is_floating_point()]
    if not ts:
        raise TypeError(
            f"the model returned a {type(x).__name__} without floating-point tensors; expected "
            "a tensor or a tuple/list/dict of tensors. Pass loss_fn to compare losses instead."
        )
    return torch.cat([t.reshape(-1) for t in ts])

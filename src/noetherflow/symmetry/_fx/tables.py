"""Op tables of the detection engine: how each module, function and method treats features.

Element-wise maps are linear, positively homogeneous, or not homogeneous (approximate);
"move" operations only rearrange features (view, transpose, split, pooling indices, …).

Modules are looked up in :data:`MODULE_OPS`, a :class:`noetherflow._registry.Registry` (a
subclass that overrides ``forward`` is not matched): ``register_module_op(cls, kind)``
teaches detection a new activation, dropout, pooling or reshaping module. Functions and
tensor methods are the registries :data:`FUNCTION_OPS` and :data:`METHOD_OPS` (by the
function object or name, by the method name): ``register_function_op(fn, kind)`` and
``register_method_op(name, kind)``. A second registration of one key is refused unless
``overwrite=True``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from noetherflow._registry import Registry

# -- op tables ------------------------------------------------------------------------------

LINEAR = 0
HOMOGENEOUS = 1
APPROXIMATE = 2


_HOM_MODULES = (nn.ReLU, nn.LeakyReLU, nn.PReLU)
_DROPOUT_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d)
_POOL_MODULES = (
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.MaxPool3d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d,
    nn.AdaptiveMaxPool3d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AvgPool3d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d,
)
_MOVE_MODULES = (nn.Flatten, nn.Unflatten)
_NONHOM_MODULES = (
    nn.Tanh,
    nn.GELU,
    nn.SiLU,
    nn.Sigmoid,
    nn.ELU,
    nn.SELU,
    nn.CELU,
    nn.Softplus,
    nn.Mish,
    nn.Hardtanh,
    nn.ReLU6,
    nn.Hardswish,
    nn.Hardsigmoid,
    nn.Softsign,
    nn.LogSigmoid,
    nn.Tanhshrink,
)

# Module class → how it treats the features that reach it (the engine's ``_flow``):
# "dropout" (homogeneous while active), "homogeneous" (positively, degree 1), "move" (only
# rearranges), "pool" (homogeneous, moves them), "approximate" (not homogeneous).
MODULE_KINDS = ("dropout", "homogeneous", "move", "pool", "approximate")
MODULE_OPS: Registry[str] = Registry(
    "feature rule",
    register_with="noetherflow.symmetry._fx.tables.register_module_op(cls, kind)",
    flag="overwrite",
)


def register_module_op(cls: type[nn.Module] | str, kind: str, *, overwrite: bool = False) -> None:
    """Teach detection how module ``cls`` treats features (``kind`` in :data:`MODULE_KINDS`).

    The module is then kept as one node of the traced graph. E.g. an ``Abs`` module is
    ``"homogeneous"`` (|e^λ x| = e^λ|x|), so the rescaling through it is found.

    Raises:
        ValueError: an unknown ``kind``, or ``cls`` registered already without ``overwrite``.
    """
    if kind not in MODULE_KINDS:
        raise ValueError(f"register_module_op: kind={kind!r}; expected one of {MODULE_KINDS}.")
    MODULE_OPS.register(cls, kind, replace=overwrite)


def module_op(m: nn.Module | None) -> str | None:
    """The registered kind of ``m`` (see :data:`MODULE_KINDS`), or None."""
    return None if m is None else MODULE_OPS.lookup(type(m))


for _kind, _classes in (
    ("dropout", _DROPOUT_MODULES),
    ("homogeneous", _HOM_MODULES),
    ("move", _MOVE_MODULES),
    ("pool", _POOL_MODULES),
    ("approximate", _NONHOM_MODULES),
):
    for _c in _classes:
        register_module_op(_c, _kind)

# -- functions and tensor methods ------------------------------------------------------------
# A function (or a tensor method, by name) → how it treats the features that reach it:
# "homogeneous", "dropout", "approximate", "pool", "move" as for modules; "scalar" (a product
# or quotient with a number: homogeneous of its degree), "matmul" (a contraction of two
# inputs, e.g. q @ kᵀ), "normalisation" (a functional norm over whole feature groups, no
# running statistics: scaling its input by one factor leaves it unchanged up to eps),
# "vector_norm" (‖x‖, for the x / ‖x‖ pattern) and, functions only, "rotary" (rotary position
# embeddings f(q, k, cos, sin, …) → (q', k'), kept as one node by the concrete tracer).
FUNCTION_KINDS = (
    "homogeneous",
    "dropout",
    "approximate",
    "pool",
    "move",
    "scalar",
    "matmul",
    "normalisation",
    "vector_norm",
    "rotary",
)
METHOD_KINDS = ("homogeneous", "approximate", "move", "scalar", "matmul", "vector_norm")
FUNCTION_OPS: Registry[str] = Registry(
    "function feature rule",
    register_with="noetherflow.symmetry._fx.tables.register_function_op(fn, kind)",
    flag="overwrite",
    any_key=True,
)
METHOD_OPS: Registry[str] = Registry(
    "method feature rule",
    register_with="noetherflow.symmetry._fx.tables.register_method_op(name, kind)",
    flag="overwrite",
    any_key=True,
)


def register_function_op(
    fn: Callable[..., Any] | str, kind: str, *, overwrite: bool = False
) -> None:
    """Teach detection how function ``fn`` treats features (``kind`` in :data:`FUNCTION_KINDS`).

    ``fn``: the function object (``torch.abs``), or its ``__name__`` for a function that each
    model defines afresh in its own module (Hugging Face's ``apply_rotary_pos_emb``).

    Raises:
        ValueError: an unknown ``kind``, or ``fn`` registered already without ``overwrite``.
    """
    if kind not in FUNCTION_KINDS:
        raise ValueError(f"register_function_op: kind={kind!r}; expected one of {FUNCTION_KINDS}.")
    FUNCTION_OPS.register(fn, kind, replace=overwrite)


def register_method_op(name: str, kind: str, *, overwrite: bool = False) -> None:
    """Teach detection how the tensor method ``name`` (``x.name(...)``) treats features.

    Raises:
        ValueError: an unknown ``kind`` (:data:`METHOD_KINDS`), or ``name`` registered
            already without ``overwrite``.
    """
    if kind not in METHOD_KINDS:
        raise ValueError(f"register_method_op: kind={kind!r}; expected one of {METHOD_KINDS}.")
    if not isinstance(name, str):
        raise TypeError(f"register_method_op: name={name!r}; expected a method name (a str).")
    METHOD_OPS.register(name, kind, replace=overwrite)


def function_op(fn: Any) -> str | None:
    """The registered kind of function ``fn`` (by the object, else by its name), or None."""
    kind = FUNCTION_OPS.get(fn)
    if kind is None and callable(fn):
        kind = FUNCTION_OPS.get(getattr(fn, "__name__", None))
    return kind


def method_op(name: Any) -> str | None:
    """The registered kind of the tensor method ``name``, or None."""
    return METHOD_OPS.get(str(name))


def names_of(kind: str) -> tuple[str, ...]:
    """The function names (not objects) registered as ``kind``, sorted (the tracer's leaves)."""
    return tuple(sorted(k for k, v in FUNCTION_OPS.items() if isinstance(k, str) and v == kind))


_FUNCTIONS: dict[str, tuple[Any, ...]] = {
    "homogeneous": (F.relu, torch.relu, F.leaky_relu, F.relu_),
    "normalisation": (F.layer_norm, F.group_norm, F.rms_norm),
    "dropout": (F.dropout, F.dropout1d, F.dropout2d, F.dropout3d),
    "pool": (
        F.max_pool1d,
        F.max_pool2d,
        F.max_pool3d,
        F.adaptive_max_pool1d,
        F.adaptive_max_pool2d,
        F.adaptive_max_pool3d,
        F.avg_pool1d,
        F.avg_pool2d,
        F.avg_pool3d,
        F.adaptive_avg_pool1d,
        F.adaptive_avg_pool2d,
        F.adaptive_avg_pool3d,
    ),
    "approximate": (
        F.gelu,
        F.silu,
        F.elu,
        F.softplus,
        F.mish,
        F.hardtanh,
        F.relu6,
        F.hardswish,
        torch.tanh,
        torch.sigmoid,
        F.tanh,
        F.sigmoid,
    ),
    "move": (
        torch.flatten,
        torch.reshape,
        torch.transpose,
        torch.permute,
        torch.squeeze,
        torch.unsqueeze,
        torch.split,
        torch.tensor_split,
        torch.chunk,
        torch.t,
        torch.swapaxes,
        torch.movedim,
        torch.unbind,
        operator.getitem,
    ),
    "scalar": (operator.mul, operator.truediv, torch.mul, torch.div),
    "matmul": (operator.matmul, torch.matmul, torch.bmm),
    "vector_norm": (torch.norm, torch.linalg.norm, torch.linalg.vector_norm),
    "rotary": ("apply_rotary_pos_emb",),
}
_METHODS: dict[str, tuple[str, ...]] = {
    "move": (
        "view",
        "reshape",
        "transpose",
        "permute",
        "contiguous",
        "flatten",
        "unflatten",
        "squeeze",
        "unsqueeze",
        "split",
        "tensor_split",
        "chunk",
        "t",
        "swapaxes",
        "movedim",
        "unbind",
        "expand",
        "repeat",  # copies: DeBERTa's relative embeddings per batch element
        "view_as",
        "reshape_as",
        "clone",
    ),
    "homogeneous": ("relu", "relu_"),
    "approximate": ("tanh", "sigmoid"),
    "scalar": ("mul", "div", "__mul__", "__truediv__"),
    "matmul": ("matmul",),
    "vector_norm": ("norm",),
}
for _kind, _fns in _FUNCTIONS.items():
    for _fn in _fns:
        register_function_op(_fn, _kind)
for _kind, _names in _METHODS.items():
    for _name in _names:
        register_method_op(_name, _kind)

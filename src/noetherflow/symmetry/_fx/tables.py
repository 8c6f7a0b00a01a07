"""Op tables of the detection engine: how each module, function and method treats features.

Element-wise maps are linear, positively homogeneous, or not homogeneous (approximate);
"move" operations only rearrange features (view, transpose, split, pooling indices, …).

Modules are looked up in :data:`MODULE_OPS`, a :class:`noetherflow._registry.Registry` (a
subclass that overrides ``forward`` is not matched): ``register_module_op(cls, kind)``
teaches detection a new activation, dropout, pooling or reshaping module.
"""

from __future__ import annotations

import operator
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

_HOM_FUNCS: set[Any] = {F.relu, torch.relu, F.leaky_relu, F.relu_}
# Functional normalisations over whole feature groups (no running statistics): scaling their
# input by one factor leaves them unchanged up to eps.
NORM_FUNCTIONS: set[Any] = {F.layer_norm, F.group_norm, F.rms_norm}
_DROPOUT_FUNCS: set[Any] = {F.dropout, F.dropout1d, F.dropout2d, F.dropout3d}
_POOL_FUNCS: set[Any] = {
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
}
_NONHOM_FUNCS: set[Any] = {
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
}
_MOVE_FUNCS: set[Any] = {
    torch.flatten,
    torch.reshape,
    torch.transpose,
    torch.permute,
    torch.squeeze,
    torch.unsqueeze,
    torch.split,
    torch.chunk,
    torch.t,
    torch.swapaxes,
    torch.movedim,
    torch.unbind,
    operator.getitem,
}
_MOVE_METHODS = {
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
}
_HOM_METHODS = {"relu", "relu_"}
_NONHOM_METHODS = {"tanh", "sigmoid"}
_SCALAR_FUNCS: set[Any] = {operator.mul, operator.truediv, torch.mul, torch.div}
_SCALAR_METHODS = {"mul", "div", "__mul__", "__truediv__"}
_MATMUL_FUNCS: set[Any] = {operator.matmul, torch.matmul, torch.bmm}
_SDPA = F.scaled_dot_product_attention
# Rotary position embeddings called as one function f(q, k, cos, sin, …) → (q', k'), kept as
# one node by the concrete tracer (registry by name).
ROTARY_FUNCTIONS = {"apply_rotary_pos_emb"}
_NORM_FUNCS: set[Any] = {torch.norm, torch.linalg.norm, torch.linalg.vector_norm}

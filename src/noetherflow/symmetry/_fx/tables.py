"""Op tables of the detection engine: how each module, function and method treats features.

Element-wise maps are linear, positively homogeneous, or not homogeneous (approximate);
"move" operations only rearrange features (view, transpose, split, pooling indices, …).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

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

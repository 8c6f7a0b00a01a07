"""Factors of normalisation affines for the hooks: y = γ ⊙ x̂ (+ β) per feature.

Each function turns a norm layer's captured input ``a`` and output-gradient ``g`` into the
normalised input x̂ and the gradient, both ``[N, T, O]`` with ``O`` the number of affine
features: sample n's γ-gradient is Σ_t g_{nto} x̂_{nto} and its β-gradient Σ_t g_{nto}
(the ``elementwise`` handlers of :mod:`.registry`). x̂ is recomputed from ``a`` with the same
arithmetic as the layer's forward (the same dtype casts), so that the statistics equal
autograd's per-sample gradients to round-off.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from noetherflow._checks import batch_statistics, instance_statistics

__all__ = [
    "batchnorm_check",
    "batchnorm_factors",
    "groupnorm_factors",
    "hf_rmsnorm_factors",
    "instancenorm_factors",
    "layernorm_factors",
    "rmsnorm_factors",
    "t5_rmsnorm_factors",
]


def _features_last(m: nn.Module, x: Tensor, g: Tensor, xhat: Tensor) -> tuple[Tensor, Tensor]:
    """x̂ and g ``[N, *, *shape]`` → ``[N, T, O]`` with O = prod(``m.normalized_shape``)."""
    shape: tuple[int, ...] = tuple(m.normalized_shape)  # type: ignore[arg-type]
    o, n = math.prod(shape), x.shape[0]
    return xhat.reshape(n, -1, o), g.reshape(n, -1, o)


def layernorm_factors(m: nn.Module, a: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """Normalised input x̂ and output-gradient of an ``nn.LayerNorm``, both ``[N, T, O]``.

    ``O = prod(normalized_shape)``; the affine is ``y = γ ⊙ x̂ + β``.
    """
    assert isinstance(m, nn.LayerNorm)
    return _features_last(m, a, g, F.layer_norm(a, m.normalized_shape, eps=m.eps))


def channels_first_layernorm_factors(m: nn.Module, a: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """Hugging Face ``ConvNextLayerNorm``: a LayerNorm over dim 1 when ``channels_first``.

    ``a``, ``g``: ``[N, C, H, W]`` (channels first) or ``[N, *, C]`` → ``[N, T, C]``.
    """
    if getattr(m, "data_format", "channels_last") == "channels_first":
        a, g = a.movedim(1, -1), g.movedim(1, -1)
    return layernorm_factors(m, a, g)


def rmsnorm_factors(m: nn.Module, a: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """``nn.RMSNorm``: x̂ = x / sqrt(mean(x²) + eps) over ``normalized_shape``. ``[N, T, O]``."""
    assert isinstance(m, nn.RMSNorm)
    return _features_last(m, a, g, F.rms_norm(a, m.normalized_shape, eps=m.eps))


def hf_rmsnorm_factors(m: nn.Module, a: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """Hugging Face ``LlamaRMSNorm`` and its copies (Qwen2, Mistral, ...): ``y = w ⊙ x̂``.

    x̂ is computed in float32 and cast back to the input dtype, as the layer does (the last
    axis is normalised; ``eps`` is ``m.variance_epsilon``). ``[N, *, O]`` → ``[N, T, O]``.
    """
    eps = float(m.variance_epsilon)  # type: ignore[arg-type]
    h = a.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    n, o = a.shape[0], a.shape[-1]
    return h.to(a.dtype).reshape(n, -1, o), g.reshape(n, -1, o)


def t5_rmsnorm_factors(m: nn.Module, a: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """Hugging Face ``T5LayerNorm``: the mean square in float32, the product in the input's dtype.

    ``[N, *, O]`` → ``[N, T, O]``.
    """
    var = a.to(torch.float32).pow(2).mean(-1, keepdim=True)
    h = a * torch.rsqrt(var + float(m.variance_epsilon))  # type: ignore[arg-type]
    w = m.weight
    assert isinstance(w, Tensor)
    if w.dtype in (torch.float16, torch.bfloat16):
        h = h.to(w.dtype)
    n, o = a.shape[0], a.shape[-1]
    return h.reshape(n, -1, o), g.reshape(n, -1, o)


def batchnorm_check(m: nn.Module) -> str | None:
    """Why a BatchNorm's affine cannot be read per sample (:func:`batch_statistics`)."""
    assert isinstance(m, nn.modules.batchnorm._BatchNorm)
    return batch_statistics(m)


def batchnorm_factors(m: nn.Module, a: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """Eval-mode BatchNorm1d/2d/3d: x̂ = (x − μ_run) / sqrt(σ²_run + eps), channels on dim 1.

    ``a``, ``g``: ``[N, C]`` or ``[N, C, *spatial]`` → ``[N, T, C]`` (T = spatial positions,
    1 without). Only valid in eval mode with running statistics (:func:`batchnorm_check`).
    """
    assert isinstance(m, nn.modules.batchnorm._BatchNorm)
    assert m.running_mean is not None and m.running_var is not None
    c = a.shape[1]
    view = (1, c) + (1,) * (a.dim() - 2)
    mean, var = m.running_mean.view(view), m.running_var.view(view)
    xhat = (a - mean) * torch.rsqrt(var + m.eps)
    n = a.shape[0]
    return xhat.movedim(1, -1).reshape(n, -1, c), g.movedim(1, -1).reshape(n, -1, c)


def _channels_last(x: Tensor, g: Tensor, xhat: Tensor) -> tuple[Tensor, Tensor]:
    """x̂ and g ``[N, C, *spatial]`` → ``[N, T, C]`` (T = spatial positions)."""
    n, c = x.shape[0], x.shape[1]
    return xhat.movedim(1, -1).reshape(n, -1, c), g.movedim(1, -1).reshape(n, -1, c)


def groupnorm_factors(m: nn.Module, a: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """``nn.GroupNorm``: x̂ normalised per sample over each group of channels (dim 1).

    ``a``, ``g``: ``[N, C, *spatial]`` → ``[N, T, C]``. Each sample's statistics only: the
    affine's per-sample gradients are those of its own x̂.
    """
    assert isinstance(m, nn.GroupNorm)
    return _channels_last(a, g, F.group_norm(a, m.num_groups, eps=m.eps))


def instancenorm_factors(m: nn.Module, a: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """``nn.InstanceNorm1d/2d/3d``: x̂ per sample and channel over its positions.

    In eval mode with ``track_running_stats`` the running statistics, as the layer does;
    the hook's recomputation never updates them. ``a``, ``g``: ``[N, C, *spatial]`` →
    ``[N, T, C]``.
    """
    assert isinstance(m, nn.modules.instancenorm._InstanceNorm)
    own = instance_statistics(m)
    mean = None if own else m.running_mean
    var = None if own else m.running_var
    xhat = F.instance_norm(a, mean, var, use_input_stats=own, eps=m.eps)
    return _channels_last(a, g, xhat)

"""Registry of the layer types the hook estimator understands (BackPACK/Opacus style).

Each supported module class maps to a :class:`LayerHandler` with its factor function (a
subclass is matched when it inherits the registered class's ``forward``, the rule of
:class:`noetherflow._registry.Registry`): it turns the captured layer input and
output-gradient into the factors ``a`` ``[N, T, I]`` and ``g`` ``[N, T, O]`` of
:mod:`.layers`, with which the weight gradient of sample n is the ``[O, I]`` matrix
G_n = Σ_t g_{nto} a_{nti}. Adding a layer type is one call::

    register_layer(MyLinear, LayerHandler(factors=linear_factors, transposed=True))

``transposed`` says the weight is stored as ``[I, O]`` (e.g. Hugging Face's ``Conv1D``);
``matrix=False`` says it is not the ``[O, I]`` factor matrix itself but a reshape of it
(convolutions, whose ``I`` mixes channels and kernel taps): such layers support the
statistics of diagonal and dense symmetries, not rotations. A grouped convolution gives
factors with a group axis, ``a`` ``[N, T, G, I_g]`` and ``g`` ``[N, T, G, O_g]``: sample n's
gradient of group γ is Σ_t g_{ntγ} a_{ntγ}ᵀ, and the weight is the ``[G·O_g, I_g]`` stack
of the groups' blocks (no cross-group zeros are formed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from noetherflow._errors import UnsupportedLayerError
from noetherflow._registry import Registry
from noetherflow.stats.attention import mha_check, mha_factors, mha_parts
from noetherflow.stats.norms import (
    batchnorm_check,
    batchnorm_factors,
    channels_first_layernorm_factors,
    groupnorm_factors,
    hf_rmsnorm_factors,
    instancenorm_factors,
    layernorm_factors,
    rmsnorm_factors,
    t5_rmsnorm_factors,
)

__all__ = [
    "LayerHandler",
    "conv_factors",
    "handler_for",
    "layernorm_factors",
    "linear_factors",
    "register_layer",
    "registered_layers",
]

Factors = Callable[[nn.Module, Tensor, Tensor], tuple[Tensor, Tensor]]
Parts = dict[str, tuple[Tensor | None, Tensor | None]]
CallFactors = Callable[
    [nn.Module, tuple[Any, ...], dict[str, Any], Tensor], dict[str, tuple[Tensor, Tensor]]
]


@dataclass(frozen=True)
class LayerHandler:
    """How the hooks read one layer type.

    Attributes:
        factors: ``factors(module, input, output_grad)`` → ``(a [N, T, I], g [N, T, O])``.
        transposed: the weight is stored ``[I, O]`` instead of ``[O, I]``.
        matrix: the weight (after transposition) is exactly the ``[O, I]`` factor matrix;
            False when it is a reshape of it (convolutions).
        check: optional ``check(module)`` → a reason the module is not supported, or None.
        elementwise: the layer is ``y = w ⊙ a + b`` per feature (normalisation affines):
            ``factors`` give ``a`` and ``g`` both ``[N, T, O]`` and sample n's weight
            gradient is Σ_t g_{nto} a_{nto} (``[O]``, small: statistics reduce it directly).
        fallback: the estimators that the error names when ``check`` refuses a module.
        parts: for a module with several Linear-like parts (``nn.MultiheadAttention``:
            ``in_proj`` and ``out_proj``), ``parts(module)`` → ``{part: (weight, bias)}``;
            None: the one part ``""`` with the module's ``weight`` and ``bias``.
        call_factors: instead of ``factors``, for a layer whose factors are not a function
            of its first input and output-gradient alone: ``call_factors(module, args,
            kwargs, output_grad)`` → ``{part: (a, g)}``, called in the backward pass with the
            forward call's (detached) arguments and the gradient of its first output, while
            the parameters are those of the forward pass.
    """

    factors: Factors | None = None
    transposed: bool = False
    matrix: bool = True
    check: Callable[[nn.Module], str | None] | None = None
    elementwise: bool = False
    fallback: str = "estimator='reference' or 'microbatch'"
    parts: Callable[[nn.Module], Parts] | None = None
    call_factors: CallFactors | None = None

    def __post_init__(self) -> None:
        if (self.factors is None) == (self.call_factors is None):
            raise TypeError("LayerHandler: pass exactly one of factors= and call_factors=.")

    def parts_of(self, module: nn.Module) -> Parts:
        """``{part: (weight, bias)}`` of ``module`` (None where a part has no such tensor)."""
        if self.parts is not None:
            return self.parts(module)
        w, b = getattr(module, "weight", None), getattr(module, "bias", None)
        return {"": (w if isinstance(w, Tensor) else None, b if isinstance(b, Tensor) else None)}

    def to_param(self, t: Tensor, shape: tuple[int, ...] | list[int] | object) -> Tensor:
        """A weight statistic ``[..., O, I]`` in the parameter's layout ``[..., *shape]``."""
        if self.transposed:
            t = t.transpose(-1, -2)
        lead = t.shape[:-2]
        return t.reshape(*lead, *shape)  # type: ignore[misc]

    def to_matrix(self, t: Tensor) -> Tensor:
        """A weight-shaped tensor as the ``[O, I]`` factor matrix."""
        if self.transposed:
            return t.transpose(0, 1)
        return t.reshape(t.shape[0], -1)

    def factor_axis(self, axis: int) -> int:
        """The factor-matrix axis (0 = O, 1 = I) of the weight's ``axis`` (``matrix`` layers)."""
        return 1 - axis if self.transposed else axis


def linear_factors(m: nn.Module, a: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """Input ``[N, *, I]`` and output-gradient ``[N, *, O]`` as ``[N, T, I]``, ``[N, T, O]``."""
    n = a.shape[0]
    return a.reshape(n, -1, a.shape[-1]), g.reshape(n, -1, g.shape[-1])


def _conv_check(m: nn.Module) -> str | None:
    if isinstance(m.padding, str) or m.padding_mode != "zeros":
        return f"padding={m.padding!r}, padding_mode={m.padding_mode!r}"
    return None


def conv_factors(m: nn.Module, a: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """Unfolded input and output-gradient of a Conv1d/2d.

    ``[N, T, C·k]`` and ``[N, T, O]`` (T output positions, k kernel taps); with ``groups``
    G > 1, ``[N, T, G, (C/G)·k]`` and ``[N, T, G, O/G]`` (the unfolded channels are
    channel-major, so each group's columns are contiguous).
    """
    n = a.shape[0]
    assert isinstance(m, nn.Conv1d | nn.Conv2d)
    if isinstance(m, nn.Conv1d):
        a, g = a.unsqueeze(2), g.unsqueeze(2)
        ks = (1, m.kernel_size[0])
        st, pd, dl = (1, m.stride[0]), (0, int(m.padding[0])), (1, m.dilation[0])
    else:
        ks = (m.kernel_size[0], m.kernel_size[1])
        st, dl = (m.stride[0], m.stride[1]), (m.dilation[0], m.dilation[1])
        pd = (int(m.padding[0]), int(m.padding[1]))
    cols = F.unfold(a, ks, dilation=dl, padding=pd, stride=st).transpose(1, 2)  # [N, T, C*k]
    gt = g.reshape(n, g.shape[1], -1).transpose(1, 2)  # [N, T, O]
    if m.groups == 1:
        return cols, gt
    t, gr = cols.shape[1], m.groups
    return cols.reshape(n, t, gr, -1), gt.reshape(n, t, gr, -1)


def _embedding_check(m: nn.Module) -> str | None:
    assert isinstance(m, nn.Embedding)
    if m.max_norm is not None or m.scale_grad_by_freq or m.sparse:
        return (
            f"max_norm={m.max_norm}, scale_grad_by_freq={m.scale_grad_by_freq}, sparse={m.sparse}"
        )
    return None


def embedding_factors(m: nn.Module, a: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """One-hot ids ``[N, T, V]`` and output-gradient ``[N, T, E]`` of an ``nn.Embedding``.

    The table ``[V, E]`` is the ``[I, O]`` weight of a linear map of one-hot inputs
    (``transposed``); the ``padding_idx`` row gets no gradient, so its column is zero. The
    one-hot factor has V columns: for a large vocabulary ``estimator='reference'`` costs less.
    """
    assert isinstance(m, nn.Embedding)
    n = a.shape[0]
    gt = g.reshape(n, -1, g.shape[-1])
    hot = F.one_hot(a.reshape(n, -1).long(), m.num_embeddings).to(gt.dtype)
    if m.padding_idx is not None:
        hot[..., m.padding_idx] = 0
    return hot, gt


# Layer class (or the qualified name of an optional package's class) → handler.
LAYERS: Registry[LayerHandler] = Registry(
    "hook handler",
    register_with="noetherflow.stats.register_layer(cls, LayerHandler(...))",
    flag="overwrite",
)


def register_layer(
    cls: type[nn.Module] | str, handler: LayerHandler, *, overwrite: bool = False
) -> None:
    """Teach the hook estimator a layer type and its subclasses that keep its ``forward``.

    ``cls`` may be the qualified name ``"pkg.module.Class"`` of a class of an optional
    package, which is then never imported here. A dense linear layer
    (``factors=linear_factors``, one part) is also made known to
    :func:`noetherflow.find_symmetries` with the same weight layout (``transposed``: the
    weight is ``[in, out]``), so one registration is found, hooked, solved and teleported.

    Raises:
        ValueError: ``cls`` is registered already and ``overwrite`` is False.
    """
    if not (isinstance(cls, str) or (isinstance(cls, type) and issubclass(cls, nn.Module))):
        raise TypeError(f"register_layer: {cls!r} is not an nn.Module subclass.")
    LAYERS.register(cls, handler, replace=overwrite)
    dense = handler.factors is linear_factors and not handler.elementwise
    if dense and handler.parts is None and handler.call_factors is None:
        from noetherflow.symmetry._fx.layers import register_dense

        register_dense(cls, transposed=handler.transposed, overwrite=overwrite)


_NORM = LayerHandler(layernorm_factors, elementwise=True)
_HF_RMS = LayerHandler(hf_rmsnorm_factors, elementwise=True)
# Hugging Face RMSNorm classes whose forward is LlamaRMSNorm's (x̂ in float32, cast back).
_HF_RMS_MODELS = {
    "llama": "Llama",
    "mistral": "Mistral",
    "mixtral": "Mixtral",
    "qwen2": "Qwen2",
    "qwen2_moe": "Qwen2Moe",
    "qwen3": "Qwen3",
    "qwen3_moe": "Qwen3Moe",
    "phi3": "Phi3",
    "granite": "Granite",
    "olmo2": "Olmo2",  # (w ⊙ x̂₃₂) cast afterwards: the same x̂ and γ-gradient
    "olmoe": "Olmoe",
    "glm": "Glm",
    "smollm3": "SmolLM3",
    "deepseek_v3": "DeepseekV3",
    "mistral3": "Mistral3",
}

# Layer classes of optional packages, registered by their qualified name so that the package
# is never imported here: Hugging Face's Conv1D (GPT-2) is nn.Linear with the weight stored
# [I, O] (y = x @ W + b); its RMSNorms are elementwise affines.
_BY_NAME: dict[str, LayerHandler] = {
    "transformers.pytorch_utils.Conv1D": LayerHandler(linear_factors, transposed=True),
    **{
        f"transformers.models.{mod}.modeling_{mod}.{cls}RMSNorm": _HF_RMS
        for mod, cls in _HF_RMS_MODELS.items()
    },
    "transformers.models.t5.modeling_t5.T5LayerNorm": LayerHandler(
        t5_rmsnorm_factors, elementwise=True
    ),
    "transformers.models.convnext.modeling_convnext.ConvNextLayerNorm": LayerHandler(
        channels_first_layernorm_factors, elementwise=True
    ),
}


def registered_layers() -> list[type[nn.Module]]:
    """The layer classes the hook estimator supports, in registration order.

    Classes of optional packages (Hugging Face ``Conv1D``, its RMSNorms, ``T5LayerNorm``,
    ``ConvNextLayerNorm``) are listed once a model using them has been seen.
    """
    return LAYERS.classes()


def handler_for(module: nn.Module, name: str = "", *, check: bool = True) -> LayerHandler | None:
    """The handler of ``module``'s class by the registry's subclass rule (None if none).

    The dynamic ``FSDP<Class>`` subclass that ``fully_shard`` gives a module inherits
    ``Class``'s forward, so it counts as the class it wraps.

    Raises:
        UnsupportedLayerError: with ``check``, the class is registered but this instance is
            not supported (e.g. BatchNorm in training mode).
    """
    h = LAYERS.lookup(type(module))
    if h is None:
        h = _computed_norm(module)
    if h is None or not check:
        return h
    why = h.check(module) if h.check is not None else None
    if why is not None:
        raise UnsupportedLayerError(
            f"Layer {name!r} ({type(module).__name__}): {why} is not supported by "
            f"estimator='hooks'; use {h.fallback}."
        )
    return h


def computed_affine_factors(m: nn.Module, a: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """x̂ and g ``[N, T, C]`` of a norm recognised by what it computes, ``y = w ⊙ x̂(a) + b``.

    x̂ is the module's own output with w = 1 and b = 0 (``functional_call``), so it is computed
    exactly as the forward computes it, casts included (DeBERTa's float32 normalisation).
    """
    from noetherflow.symmetry._fx.layers import norm_spec

    spec = norm_spec(m)
    assert spec is not None
    w = m.weight
    assert isinstance(w, Tensor)
    c = int(w.shape[0])
    unit = {"weight": torch.ones(c, dtype=a.dtype, device=a.device)}
    if isinstance(getattr(m, "bias", None), Tensor):
        unit["bias"] = torch.zeros(c, dtype=a.dtype, device=a.device)
    with torch.no_grad():
        xhat = functional_call(m, unit, (a,))
    n = a.shape[0]
    return xhat.movedim(spec.axis, -1).reshape(n, -1, c), g.movedim(spec.axis, -1).reshape(n, -1, c)


_COMPUTED = LayerHandler(computed_affine_factors, elementwise=True)


def _computed_norm(m: nn.Module) -> LayerHandler | None:
    """The handler of a norm that no class registration matches, or None.

    For a norm that detection recognised by what it computes
    (:mod:`noetherflow.symmetry._fx.numeric`) as ``w ⊙ x̂ + b`` with a per-feature affine (not
    Gemma's ``(1 + w)``): ConvNeXtV2's LayerNorm subclass, DeBERTa's ``DebertaLayerNorm``.
    """
    w = getattr(m, "weight", None)
    if not isinstance(w, nn.Parameter) or w.dim() != 1:
        return None
    from noetherflow.symmetry._fx.layers import NORMS, norm_spec

    if NORMS.lookup(type(m)) is not None:
        return None  # registered norms without a hook handler: not by analogy
    spec = norm_spec(m)
    if spec is None or spec.batch or spec.per_channel or not spec.linear_affine:
        return None
    return _COMPUTED


_BN = LayerHandler(
    batchnorm_factors,
    elementwise=True,
    check=batchnorm_check,
    fallback="estimator='microbatch' (micro-batches as the sample unit), or put the model in "
    "eval mode",
)
for _name, _handler in _BY_NAME.items():
    register_layer(_name, _handler)
register_layer(nn.Linear, LayerHandler(linear_factors))
register_layer(nn.Conv1d, LayerHandler(conv_factors, matrix=False, check=_conv_check))
register_layer(nn.Conv2d, LayerHandler(conv_factors, matrix=False, check=_conv_check))
register_layer(
    nn.Embedding, LayerHandler(embedding_factors, transposed=True, check=_embedding_check)
)
register_layer(nn.LayerNorm, _NORM)
register_layer(nn.RMSNorm, LayerHandler(rmsnorm_factors, elementwise=True))
for _cls in (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm):
    register_layer(_cls, _BN)
register_layer(nn.GroupNorm, LayerHandler(groupnorm_factors, elementwise=True))
for _inorm in (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d):
    register_layer(_inorm, LayerHandler(instancenorm_factors, elementwise=True))
register_layer(
    nn.MultiheadAttention,
    LayerHandler(call_factors=mha_factors, parts=mha_parts, check=mha_check),
)

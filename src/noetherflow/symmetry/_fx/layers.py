"""Registries of the modules the detection understands: layers and normalisations.

A :class:`LayerSpec` says where a parameterised linear layer keeps its features (axis of the
output, of the input, of the weight); a :class:`NormSpec` says which axis a normalisation
normalises and where its eps lives. Lookups walk the class's MRO, first by class, then by
qualified name (for optional packages such as Hugging Face ``transformers``, which is never
imported here), then by what the module computes (:mod:`noetherflow.symmetry._fx.numeric`: a
linear map, a LayerNorm or RMSNorm with its eps, checked numerically), then the duck-typed
``*RMSNorm`` rule. A subclass that overrides ``forward`` does not inherit its base's
registration (its forward may do anything, e.g. permute around the norm): it is recognised
numerically or traced through.

Register a new layer with :func:`register_layer` / :func:`register_norm`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from noetherflow.symmetry._fx.numeric import is_rms, linear_affine, numeric_layer, numeric_norm

__all__ = [
    "LayerSpec",
    "NormSpec",
    "is_known_module",
    "layer_spec",
    "norm_spec",
    "register_dense",
    "register_layer",
    "register_norm",
]


@dataclass(frozen=True)
class LayerSpec:
    """Feature axes of a linear layer ``y = x·W`` (Linear, Conv, HF Conv1D).

    ``out_axis``/``in_axis``: the feature axis of the output/input tensor (−1 for Linear,
    1 for a batched conv). ``w_out``/``w_in``: the axis of ``weight`` indexing output/input
    features (0/1 for ``nn.Linear`` and convs, 1/0 for HF ``Conv1D`` whose weight is
    ``[in, out]``). ``groups`` > 1 for grouped convolutions.
    """

    out_axis: int
    in_axis: int
    w_out: int
    w_in: int
    conv: bool = False
    groups: int = 1


@dataclass(frozen=True)
class NormSpec:
    """A normalisation layer: ``axis`` is the feature axis of its input and output.

    ``per_channel``: statistics per channel over the batch (BatchNorm), so each channel of
    the layer feeding it is scale invariant on its own; otherwise the whole feature vector
    is normalised together (LayerNorm, RMSNorm, GroupNorm). ``eps_attr``: the attribute
    holding eps. ``batch``: a BatchNorm (running statistics, train/eval behaviour).
    ``rms``: divides by the root mean square (no centring). ``linear_affine``: its affine
    weight multiplies the output (False for Gemma's ``(1 + w)``: no rescaling of w).
    """

    axis: int
    per_channel: bool
    eps_attr: str = "eps"
    batch: bool = False
    rms: bool = False
    linear_affine: bool = True


_LAYERS: dict[type, Callable[[nn.Module], LayerSpec]] = {}
_LAYERS_BY_NAME: dict[str, Callable[[nn.Module], LayerSpec]] = {}
_NORMS: dict[type, Callable[[nn.Module], NormSpec]] = {}
_NORMS_BY_NAME: dict[str, Callable[[nn.Module], NormSpec]] = {}


def register_layer(
    cls: type | str, spec: Callable[[nn.Module], LayerSpec], *, overwrite: bool = False
) -> None:
    """Register a linear layer type (a class, or its qualified name ``"pkg.mod.Class"``).

    Raises:
        ValueError: ``cls`` is registered already and ``overwrite`` is False.
    """
    table: dict[object, object] = _LAYERS_BY_NAME if isinstance(cls, str) else _LAYERS  # type: ignore[assignment]
    if cls in table and not overwrite:
        name = cls if isinstance(cls, str) else cls.__name__
        raise ValueError(
            f"register_layer: {name} has a detection pattern already; pass overwrite=True to "
            "replace it."
        )
    table[cls] = spec


def register_dense(cls: type, *, transposed: bool, overwrite: bool = False) -> None:
    """``cls`` computes ``y = x·Wᵀ + b`` (``W [out, in]``), or ``x·W + b`` when ``transposed``.

    Called by :func:`noetherflow.stats.register_layer` for dense layers. A class detection
    knows already (``nn.Linear``, Hugging Face ``Conv1D``) keeps its pattern.
    """
    known = cls in _LAYERS or f"{cls.__module__}.{cls.__qualname__}" in _LAYERS_BY_NAME
    if known and not overwrite:
        return
    axes = (1, 0) if transposed else (0, 1)
    register_layer(cls, lambda m: LayerSpec(-1, -1, *axes), overwrite=True)


def register_norm(cls: type | str, spec: Callable[[nn.Module], NormSpec]) -> None:
    """Register a normalisation type (a class, or its qualified name)."""
    if isinstance(cls, str):
        _NORMS_BY_NAME[cls] = spec
    else:
        _NORMS[cls] = spec


def _lookup(
    m: nn.Module,
    by_cls: dict[type, Callable[[nn.Module], LayerSpec | NormSpec]],
    by_name: dict[str, Callable[[nn.Module], LayerSpec | NormSpec]],
) -> LayerSpec | NormSpec | None:
    for cls in type(m).__mro__:
        fn = by_cls.get(cls) or by_name.get(f"{cls.__module__}.{cls.__qualname__}")
        if fn is not None:
            if cls is not type(m) and type(m).forward is not getattr(cls, "forward", None):
                return None  # a subclass with its own forward: trace through it instead
            return fn(m)
    return None


def layer_spec(m: nn.Module | None) -> LayerSpec | None:
    """The :class:`LayerSpec` of ``m``, or None when it is not a known linear layer."""
    if m is None:
        return None
    out = _lookup(m, _LAYERS, _LAYERS_BY_NAME)  # type: ignore[arg-type]
    assert out is None or isinstance(out, LayerSpec)
    if out is None and not _registered_elsewhere(m):
        axes = numeric_layer(m)  # e.g. FalconLinear: an nn.Linear with its own forward
        if axes is not None:
            return LayerSpec(-1, -1, *axes)
    return out


def _duck_rms_norm(m: nn.Module) -> NormSpec | None:
    """``*RMSNorm`` modules the numeric test could not run (e.g. on the meta device)."""
    if not type(m).__name__.endswith("RMSNorm"):
        return None
    own = dict(m.named_parameters(recurse=False))
    w = own.get("weight")
    if set(own) != {"weight"} or w is None or w.dim() != 1 or any(True for _ in m.children()):
        return None
    for attr in ("variance_epsilon", "eps"):
        if isinstance(getattr(m, attr, None), float):
            return NormSpec(-1, False, attr, rms=True)
    return None


def norm_spec(m: nn.Module | None) -> NormSpec | None:
    """The :class:`NormSpec` of ``m``, or None when it is not a known normalisation."""
    if m is None:
        return None
    out = _lookup(m, _NORMS, _NORMS_BY_NAME)  # type: ignore[arg-type]
    assert out is None or isinstance(out, NormSpec)
    if out is not None:
        return out
    if not _registered_elsewhere(m):
        found = numeric_norm(m)  # T5LayerNorm, Gemma's (1 + w) RMSNorm, LayerNorm subclasses
        if found is not None:
            axis, attr, kind = found
            return NormSpec(axis, False, attr, rms=is_rms(kind), linear_affine=linear_affine(kind))
    return _duck_rms_norm(m)


def _registered_elsewhere(m: nn.Module) -> bool:
    """A torch.nn builtin that is not a layer or norm here (Embedding, activations)."""
    cls = type(m)
    return cls.__module__.startswith("torch.nn") and not any(
        c in _LAYERS or c in _NORMS for c in cls.__mro__
    )


# Element-wise activations of model zoos, none positively homogeneous of degree 1 (GELU,
# "gelu_new", SiLU, quick GELU, …): kept as one node and classified as approximate.
ZOO_ACTIVATION_PACKAGES = ("transformers.activations",)


def is_zoo_activation(m: nn.Module | None) -> bool:
    """An activation module of a model zoo (see :data:`ZOO_ACTIVATION_PACKAGES`)."""
    return m is not None and type(m).__module__ in ZOO_ACTIVATION_PACKAGES


def is_known_module(m: nn.Module) -> bool:
    """A layer, a normalisation, a zoo activation, or a module a matcher reads as a whole."""
    return (
        is_zoo_activation(m)
        or layer_spec(m) is not None
        or norm_spec(m) is not None
        or isinstance(m, nn.MultiheadAttention | nn.PReLU)
    )


def _linear(m: nn.Module) -> LayerSpec:
    return LayerSpec(-1, -1, 0, 1)


def _conv(m: nn.Module) -> LayerSpec:
    return LayerSpec(1, 1, 0, 1, conv=True, groups=int(getattr(m, "groups", 1)))


def _hf_conv1d(m: nn.Module) -> LayerSpec:
    return LayerSpec(-1, -1, 1, 0)


def _layer_norm(m: nn.Module) -> NormSpec:
    # ConvNeXt-style LayerNorm subclasses normalise the channel axis of NCHW inputs.
    axis = 1 if getattr(m, "data_format", "channels_last") == "channels_first" else -1
    return NormSpec(axis, False)


register_layer(nn.Linear, _linear)
for _c in (nn.Conv1d, nn.Conv2d, nn.Conv3d):
    register_layer(_c, _conv)
register_layer("transformers.pytorch_utils.Conv1D", _hf_conv1d)
for _b in (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d):
    register_norm(_b, lambda m: NormSpec(1, True, batch=True))
register_norm(nn.LayerNorm, _layer_norm)
register_norm("transformers.models.convnext.modeling_convnext.ConvNextLayerNorm", _layer_norm)
register_norm(nn.GroupNorm, lambda m: NormSpec(1, False))
register_norm(nn.RMSNorm, lambda m: NormSpec(-1, False))

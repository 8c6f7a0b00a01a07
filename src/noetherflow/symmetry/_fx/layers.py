"""Registries of the modules the detection understands: layers and normalisations.

A :class:`LayerSpec` says where a parameterised linear layer keeps its features (axis of the
output, of the input, of the weight); a :class:`NormSpec` says which axis a normalisation
normalises and where its eps lives. Both tables are :class:`noetherflow._registry.Registry`
instances (MRO walk by class or qualified name; a subclass that overrides ``forward`` is not
matched, since its forward may do anything, e.g. permute around the norm). A module no
registration matches is recognised by what it computes
(:mod:`noetherflow.symmetry._fx.numeric`: a linear map, a LayerNorm or RMSNorm with its eps,
checked numerically), then by the duck-typed ``*RMSNorm`` rule, or traced through.

A dense layer registered for the hooks (:func:`noetherflow.stats.register_layer`) is
registered here too; :func:`register_layer` / :func:`register_norm` add other layouts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from noetherflow._checks import batch_statistics, instance_statistics
from noetherflow._registry import Registry, qualname
from noetherflow.symmetry._fx.numeric import (
    is_rms,
    linear_affine,
    low_precision,
    numeric_layer,
    numeric_norm,
)
from noetherflow.symmetry._fx.tables import module_op

__all__ = [
    "LAYERS",
    "NORMS",
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

    ``per_channel``: statistics per channel (BatchNorm over the batch, InstanceNorm over each
    sample's positions), so each channel of the layer feeding it is scale invariant on its
    own; otherwise the features are normalised together (LayerNorm, RMSNorm), or in
    ``groups`` equal contiguous groups of channels (GroupNorm), each group on its own.
    ``eps_attr``: the attribute holding eps. ``batch``: a BatchNorm (running statistics,
    train/eval behaviour). ``instance``: an InstanceNorm (each sample's statistics; with
    ``track_running_stats``, the running ones in eval mode).
    ``rms``: divides by the root mean square (no centring). ``linear_affine``: its affine
    weight multiplies the output (False for Gemma's ``(1 + w)``: no rescaling of w).
    ``low_precision``: it normalises in float32 inside a float64 model and applies its
    affine in float64 (DeBERTa's ``DebertaLayerNorm``): the affine's rescaling is exact, the
    scale invariance of its input only to float32 round-off (not claimed).
    """

    axis: int
    per_channel: bool
    eps_attr: str = "eps"
    batch: bool = False
    instance: bool = False
    groups: int = 1
    rms: bool = False
    linear_affine: bool = True
    low_precision: bool = False

    def running(self, m: nn.Module) -> bool:
        """Whether ``m`` normalises by running statistics now (not scale invariant then)."""
        if self.batch:
            return batch_statistics(m) is None
        if self.instance:
            return not instance_statistics(m)
        return False


LayerSpecFn = Callable[[nn.Module], LayerSpec]
NormSpecFn = Callable[[nn.Module], NormSpec]
_FIX = "noetherflow.stats.register_layer(cls, LayerHandler(linear_factors, ...))"
LAYERS: Registry[LayerSpecFn] = Registry("detection pattern", register_with=_FIX, flag="overwrite")
NORMS: Registry[NormSpecFn] = Registry(
    "normalisation spec",
    register_with="noetherflow.symmetry._fx.layers.register_norm(cls, spec)",
    flag="overwrite",
)


def register_layer(cls: type | str, spec: LayerSpecFn, *, overwrite: bool = False) -> None:
    """Register a linear layer type (a class, or its qualified name ``"pkg.mod.Class"``).

    Raises:
        ValueError: ``cls`` is registered already and ``overwrite`` is False.
    """
    LAYERS.register(cls, spec, replace=overwrite)


def register_dense(cls: type | str, *, transposed: bool, overwrite: bool = False) -> None:
    """``cls`` computes ``y = x·Wᵀ + b`` (``W [out, in]``), or ``x·W + b`` when ``transposed``.

    Called by :func:`noetherflow.stats.register_layer` for dense layers. A class detection
    knows already (``nn.Linear``, Hugging Face ``Conv1D``) keeps its pattern.
    """
    known = cls in LAYERS or (isinstance(cls, type) and qualname(cls) in LAYERS)
    if known and not overwrite:
        return
    axes = (1, 0) if transposed else (0, 1)
    register_layer(cls, lambda m: LayerSpec(-1, -1, *axes), overwrite=True)


def register_norm(cls: type | str, spec: NormSpecFn, *, overwrite: bool = False) -> None:
    """Register a normalisation type (a class, or its qualified name).

    Raises:
        ValueError: ``cls`` is registered already and ``overwrite`` is False.
    """
    NORMS.register(cls, spec, replace=overwrite)


def layer_spec(m: nn.Module | None) -> LayerSpec | None:
    """The :class:`LayerSpec` of ``m``, or None when it is not a known linear layer."""
    if m is None:
        return None
    fn = LAYERS.lookup(type(m))
    out = None if fn is None else fn(m)
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
    fn = NORMS.lookup(type(m))
    if fn is not None:
        return fn(m)
    if not _registered_elsewhere(m):
        found = numeric_norm(m)  # T5LayerNorm, Gemma's (1 + w) RMSNorm, LayerNorm subclasses
        if found is not None:
            axis, attr, kind = found
            return NormSpec(
                axis,
                False,
                attr,
                rms=is_rms(kind),
                linear_affine=linear_affine(kind),
                low_precision=low_precision(kind),
            )
    return _duck_rms_norm(m)


def _registered_elsewhere(m: nn.Module) -> bool:
    """A torch.nn builtin that is not a layer or norm here (Embedding, activations)."""
    cls = type(m)
    return cls.__module__.startswith("torch.nn") and not any(
        c in LAYERS or c in NORMS for c in cls.__mro__
    )


# Element-wise activations of model zoos, none positively homogeneous of degree 1 (GELU,
# "gelu_new", SiLU, quick GELU, …): kept as one node and classified as approximate.
ZOO_ACTIVATION_PACKAGES = ("transformers.activations",)


def is_zoo_activation(m: nn.Module | None) -> bool:
    """An activation module of a model zoo (see :data:`ZOO_ACTIVATION_PACKAGES`)."""
    return m is not None and type(m).__module__ in ZOO_ACTIVATION_PACKAGES


def is_known_module(m: nn.Module) -> bool:
    """A module kept as one node: a layer, norm, op-table module or zoo activation, or MHA."""
    return (
        is_zoo_activation(m)
        or module_op(m) is not None
        or layer_spec(m) is not None
        or norm_spec(m) is not None
        or _claimed_whole(m)
    )


def _claimed_whole(m: nn.Module) -> bool:
    """A module-stage matcher reads ``m`` as a whole (``nn.MultiheadAttention``)."""
    from noetherflow.symmetry._fx.patterns import claimed  # its registry fills on first use

    return bool(claimed(m))


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


def _group_norm(m: nn.Module) -> NormSpec:
    assert isinstance(m, nn.GroupNorm)
    return NormSpec(1, False, groups=m.num_groups)


register_norm(nn.GroupNorm, _group_norm)
for _i in (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d):
    register_norm(_i, lambda m: NormSpec(1, True, instance=True))
register_norm(nn.RMSNorm, lambda m: NormSpec(-1, False))

"""Recognise a layer by what it computes, not by its class name (issue 26).

A module that no registration matches (a subclass with its own ``forward`` such as Falcon's
``FalconLinear`` or ConvNeXtV2's LayerNorm subclass; a norm named anything, such as T5's
``T5LayerNorm``) is run on a few random inputs with random parameters
(:func:`torch.func.functional_call`: the module's own parameters are not touched) and
compared with the closed forms:

* linear: ``y = x·Wᵀ + b`` (``W`` of shape ``[out, in]``), or ``y = x·W + b`` (``[in, out]``,
  Hugging Face's ``Conv1D`` layout), on the last axis;
* normalisation over the feature axis (−1, or 1 for channels-first inputs), with eps the
  value of one of its attributes (``eps``, ``variance_epsilon``, ``epsilon``):
  LayerNorm ``(x − μ)/√(σ² + eps)·w + b``; RMSNorm ``x/√(mean x² + eps)·w``; the
  RMSNorm with ``(1 + w)`` of Gemma, whose affine weight does not rescale linearly; and,
  in a float64 model, LayerNorm and RMSNorm normalising in float32 with the affine applied
  in float64 (DeBERTa's ``DebertaLayerNorm``): their affine rescales exactly, their input's
  scale invariance holds to float32 round-off only.

The inputs are drawn at two scales, one with σ² ≈ eps, so a wrong eps (or eps attribute)
fails the comparison. Tolerances: 1e-10 relative in float64, 1e-4 in lower precision, 1e-5
for the float32 normalisations in float64. The verdict is cached per module.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.fx._symbolic_trace import _orig_module_call, _orig_module_getattr
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["EPS_ATTRS", "numeric_layer", "numeric_norm"]

EPS_ATTRS = ("eps", "variance_epsilon", "epsilon")
_LAYER_CACHE: WeakIdKeyDictionary = WeakIdKeyDictionary()
_NORM_CACHE: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _own(m: nn.Module) -> dict[str, nn.Parameter] | None:
    """``weight`` (and ``bias``) of a module without children, else None."""
    if any(True for _ in m.children()):
        return None
    own = dict(m.named_parameters(recurse=False))
    if "weight" not in own or not set(own) <= {"weight", "bias"}:
        return None
    return own


def _tol(dtype: torch.dtype) -> float:
    return 1e-10 if dtype == torch.float64 else 1e-4


def _close(got: object, ref: Tensor, tol: float) -> bool:
    if not isinstance(got, Tensor) or got.shape != ref.shape:
        return False
    d = float((got.double() - ref).norm() / ref.norm().clamp_min(1e-300))
    return d <= tol


def _run(m: nn.Module, params: dict[str, Tensor], x: Tensor) -> object:
    # Called while torch.fx traces (is_leaf_module): run with nn.Module's own __call__ and
    # __getattr__, not fx's patched ones, so nothing lands in the graph being traced.
    call, getattr_ = nn.Module.__call__, nn.Module.__getattr__
    nn.Module.__call__ = _orig_module_call  # type: ignore[method-assign]
    nn.Module.__getattr__ = _orig_module_getattr  # type: ignore[method-assign]
    try:
        with torch.no_grad():
            return functional_call(m, params, (x,))
    except Exception:  # the module does not accept this input: not this form
        return None
    finally:
        nn.Module.__call__ = call  # type: ignore[method-assign]
        nn.Module.__getattr__ = getattr_  # type: ignore[method-assign]


def numeric_layer(m: nn.Module) -> tuple[int, int] | None:
    """``(w_out, w_in)`` when ``m`` computes a dense linear map on the last axis, else None."""
    if m in _LAYER_CACHE:
        return _LAYER_CACHE[m]
    out = _numeric_layer(m)
    _LAYER_CACHE[m] = out
    return out


def _numeric_layer(m: nn.Module) -> tuple[int, int] | None:
    own = _own(m)
    if own is None or own["weight"].dim() != 2 or own["weight"].is_meta:
        return None
    w0 = own["weight"]
    dt, dev = w0.dtype, w0.device
    if not dt.is_floating_point:
        return None
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(w0.shape, generator=gen, dtype=torch.float64)
    for w_out, w_in in ((0, 1), (1, 0)):
        n_out, n_in = w.shape[w_out], w.shape[w_in]
        b = None
        if "bias" in own:
            if own["bias"].shape != (n_out,):
                continue
            b = torch.randn(n_out, generator=gen, dtype=torch.float64)
        x = torch.randn(2, 3, n_in, generator=gen, dtype=torch.float64)
        mat = w.T if w_out == 0 else w
        ref = x @ mat + (b if b is not None else 0)
        params = {"weight": w.to(dev, dt)}
        if b is not None:
            params["bias"] = b.to(dev, dt)
        if _close(_run(m, params, x.to(dev, dt)), ref, _tol(dt)):
            return w_out, w_in
    return None


def _layer_norm(x: Tensor, axis: int, eps: float, w: Tensor, b: Tensor | None) -> Tensor:
    mu = x.mean(axis, keepdim=True)
    var = (x - mu).pow(2).mean(axis, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + (0 if b is None else b)


def _rms_norm(x: Tensor, axis: int, eps: float, w: Tensor, b: Tensor | None) -> Tensor:
    return x / torch.sqrt(x.pow(2).mean(axis, keepdim=True) + eps) * w + (0 if b is None else b)


def _rms_norm_1p(x: Tensor, axis: int, eps: float, w: Tensor, b: Tensor | None) -> Tensor:
    return _rms_norm(x, axis, eps, 1 + w, b)


def _in_float32(form: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """``form`` normalising in float32 and applying the affine in the input's dtype.

    DeBERTa's ``DebertaLayerNorm``: ``x̂ = LN(x.float()).to(x.dtype)``, then ``w ⊙ x̂ + b``.
    """

    def low(x: Tensor, axis: int, eps: float, w: Tensor, b: Tensor | None) -> Tensor:
        one = torch.ones_like(w, dtype=torch.float32)
        xhat = form(x.to(torch.float32), axis, eps, one, None).to(x.dtype)
        return xhat * w + (0 if b is None else b)

    return low


# kind → (closed form, rms, affine weight rescales linearly, normalises in float32)
_FORMS: dict[str, tuple[Callable[..., Tensor], bool, bool, bool]] = {
    "layer": (_layer_norm, False, True, False),
    "rms": (_rms_norm, True, True, False),
    "rms(1+w)": (_rms_norm_1p, True, False, False),
    # tried after the exact forms, float64 modules only, at float32's tolerance
    "layer@float32": (_in_float32(_layer_norm), False, True, True),
    "rms@float32": (_in_float32(_rms_norm), True, True, True),
}
_LOW_TOL = 1e-5  # float32 normalisation (round-off ~1e-7) compared in float64


def numeric_norm(m: nn.Module) -> tuple[int, str, str] | None:
    """``(axis, eps attribute, kind)`` when ``m`` computes a known normalisation, else None."""
    if m in _NORM_CACHE:
        return _NORM_CACHE[m]
    out = _numeric_norm(m)
    _NORM_CACHE[m] = out
    return out


def _numeric_norm(m: nn.Module) -> tuple[int, str, str] | None:
    own = _own(m)
    if own is None or own["weight"].dim() != 1 or own["weight"].is_meta:
        return None
    w0 = own["weight"]
    dt, dev, c = w0.dtype, w0.device, w0.numel()
    if not dt.is_floating_point or c < 2 or ("bias" in own and own["bias"].shape != (c,)):
        return None
    attrs = [a for a in EPS_ATTRS if isinstance(getattr(m, a, None), float)]
    if not attrs:
        return None
    gen = torch.Generator().manual_seed(0)
    w = torch.rand(c, generator=gen, dtype=torch.float64) + 0.5
    b = torch.randn(c, generator=gen, dtype=torch.float64) if "bias" in own else None
    params = {"weight": w.to(dev, dt)}
    if b is not None:
        params["bias"] = b.to(dev, dt)
    for axis, shape in ((-1, (2, 3, c)), (1, (2, c, 3, 3))):
        x0 = torch.randn(shape, generator=gen, dtype=torch.float64) + 0.7
        view = [1] * len(shape)
        view[axis] = c
        wv, bv = w.view(view), None if b is None else b.view(view)
        for attr in attrs:
            eps = float(getattr(m, attr))
            scales = (1.0, math.sqrt(eps) if eps > 0 else 1e-3)
            xs = [x0 * s for s in scales]
            outs = [_run(m, params, x.to(dev, dt)) for x in xs]
            for kind, (form, _, _, low) in _FORMS.items():
                if low and dt != torch.float64:
                    continue  # in float32 the float32 forms are the exact ones
                tol = _LOW_TOL if low else _tol(dt)
                refs = [form(x, axis, eps, wv, bv) for x in xs]
                if all(_close(o, r, tol) for o, r in zip(outs, refs, strict=True)):
                    return axis, attr, kind
    return None


def is_rms(kind: str) -> bool:
    return _FORMS[kind][1]


def linear_affine(kind: str) -> bool:
    return _FORMS[kind][2]


def low_precision(kind: str) -> bool:
    """The norm normalises in float32 inside a float64 model (its affine in float64)."""
    return _FORMS[kind][3]

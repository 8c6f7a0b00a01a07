"""Hook factors of ``nn.MultiheadAttention``: its fused ``in_proj`` and its ``out_proj``.

The module calls its projections through ``F.multi_head_attention_forward``, so no hook of
``out_proj`` ever fires and the gradients of the q/k/v projection outputs never exist as
tensors. The handler reads the whole call instead: in the backward pass it recomputes the
projections from the captured query/key/value and the attention core (the same masks as
the module: ``key_padding_mask``, ``attn_mask``, ``is_causal``), and backpropagates the
captured output-gradient through the core in closed form (:func:`attention_grads`). Then

* ``out_proj``: a = the core's output ``[N, L, E]``, g = the output-gradient ``[N, L, E]``;
* ``in_proj`` (weight ``[3E, E]``, rows q | k | v): with self-attention (query, key and value
  the same tensor) a = the input ``[N, L, E]`` and g = (dq | dk | dv) ``[N, L, 3E]``; with
  different inputs their tokens are concatenated, a ``[N, L + S (+ S), E]``, and each
  input's tokens carry only the gradient of the rows that read it (zeros elsewhere), so that
  Σ_t g_t a_tᵀ stacks the three row blocks' per-sample gradients exactly.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from noetherflow._errors import UnsupportedLayerError

__all__ = ["attention_grads", "mha_check", "mha_factors", "mha_parts"]

_SIG = inspect.signature(nn.MultiheadAttention.forward)


def mha_check(m: nn.Module) -> str | None:
    """What of this ``nn.MultiheadAttention`` the hooks do not read (None: all of it)."""
    assert isinstance(m, nn.MultiheadAttention)
    if not m._qkv_same_embed_dim:
        return f"kdim={m.kdim}, vdim={m.vdim} (separate q/k/v projection weights)"
    if m.bias_k is not None:
        return "add_bias_kv=True"
    if m.add_zero_attn:
        return "add_zero_attn=True"
    if m.training and m.dropout > 0:
        return f"dropout={m.dropout} in training mode (random attention weights)"
    return None


def mha_parts(m: nn.Module) -> dict[str, tuple[Tensor | None, Tensor | None]]:
    """``in_proj`` (fused q/k/v weight ``[3E, E]`` and bias) and ``out_proj``."""
    assert isinstance(m, nn.MultiheadAttention)
    return {
        "in_proj": (m.in_proj_weight, m.in_proj_bias),
        "out_proj": (m.out_proj.weight, m.out_proj.bias),
    }


def _additive(mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """A boolean mask (True = not attended) as an additive float mask, as the module does."""
    if mask is None or mask.is_floating_point():
        return mask
    return torch.zeros_like(mask, dtype=dtype).masked_fill_(mask, float("-inf"))


def _merged_mask(
    m: nn.MultiheadAttention, n: int, length: int, src: int, kw: dict[str, Any], dtype: torch.dtype
) -> tuple[Tensor | None, bool]:
    """The additive mask ``[N or 1, H or 1, L, S]`` and the causal flag of one call.

    As ``F.multi_head_attention_forward``: ``is_causal`` without a key padding mask and
    without ``need_weights`` means a causal mask (the given ``attn_mask`` is only a hint);
    otherwise ``attn_mask`` (``[L, S]`` or ``[N·H, L, S]``) plus the key padding mask
    (``[N, S]``).
    """
    kpm, am = kw["key_padding_mask"], kw["attn_mask"]
    if kw["is_causal"] and kpm is None and not kw["need_weights"]:
        return None, True
    am, kpm = _additive(am, dtype), _additive(kpm, dtype)
    if am is not None:
        am = am.view(1, 1, length, src) if am.dim() == 2 else am.view(n, m.num_heads, length, src)
    if kpm is not None:
        kpm = kpm.view(n, 1, 1, src)
        am = kpm if am is None else am + kpm
    return am, False


def attention_grads(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    heads: int,
    mask: Tensor | None,
    causal: bool,
    d_out: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Scaled dot-product attention and its backward pass in closed form.

    With P = softmax(Q Kᵀ/√d + M) per head and O = P V: dV = Pᵀ dO, dP = dO Vᵀ,
    dS = P ⊙ (dP − rowsum(dP ⊙ P)), dQ = dS K/√d, dK = dSᵀ Q/√d.

    Args:
        q: queries ``[N, L, E]`` (heads side by side along E).
        k: keys ``[N, S, E]``.
        v: values ``[N, S, E]``.
        heads: number of heads H (E/H per head).
        mask: additive mask broadcastable to ``[N, H, L, S]``, or None.
        causal: mask the keys after each query (top-left aligned, as SDPA).
        d_out: gradient of the loss with respect to the output ``[N, L, E]``.

    Returns:
        ``(out [N, L, E], dq [N, L, E], dk [N, S, E], dv [N, S, E])``.
    """
    n, length, e = q.shape
    src, hd = k.shape[1], e // heads

    def split(x: Tensor) -> Tensor:  # [N, T, E] → [N, H, T, E/H]
        return x.reshape(n, x.shape[1], heads, hd).transpose(1, 2)

    def merge(x: Tensor) -> Tensor:  # [N, H, T, E/H] → [N, T, E]
        return x.transpose(1, 2).reshape(n, x.shape[2], e)

    qh, kh, vh, do = split(q), split(k), split(v), split(d_out)
    scale = 1.0 / math.sqrt(hd)
    s = (qh @ kh.transpose(-1, -2)).mul_(scale)
    if mask is not None:
        s = s + mask
    if causal:
        upper = torch.ones(length, src, dtype=torch.bool, device=q.device).triu_(1)
        s = s.masked_fill(upper, float("-inf"))
    p = torch.softmax(s, dim=-1)
    dp = do @ vh.transpose(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    out = merge(p @ vh)
    dv = merge(p.transpose(-1, -2) @ do)
    dq = merge((ds @ kh).mul_(scale))
    dk = merge((ds.transpose(-1, -2) @ qh).mul_(scale))
    return out, dq, dk, dv


def _stack_inputs(
    xs: tuple[Tensor, Tensor, Tensor], grads: tuple[Tensor, Tensor, Tensor]
) -> tuple[Tensor, Tensor]:
    """in_proj factors: each distinct input's tokens with the gradients of the rows it feeds.

    ``xs`` (query, key, value inputs ``[N, T_j, E]``, possibly the same tensor) and
    ``grads`` (dq, dk, dv) → a ``[N, ΣT, E]``, g ``[N, ΣT, 3E]``.
    """
    groups: list[tuple[Tensor, list[int]]] = []
    for j, x in enumerate(xs):
        for x0, js in groups:
            if x0 is x:
                js.append(j)
                break
        else:
            groups.append((x, [j]))
    e = grads[0].shape[2]
    a = torch.cat([x for x, _ in groups], dim=1) if len(groups) > 1 else groups[0][0]
    g = grads[0].new_zeros(a.shape[0], a.shape[1], 3 * e)
    t0 = 0
    for x, js in groups:
        for j in js:
            g[:, t0 : t0 + x.shape[1], j * e : (j + 1) * e] = grads[j]
        t0 += x.shape[1]
    return a, g


def mha_factors(
    m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], grad: Tensor
) -> dict[str, tuple[Tensor, Tensor]]:
    """The factors of ``in_proj`` and ``out_proj`` from one call and its output-gradient.

    ``args``/``kwargs``: the call of ``m.forward`` (query, key, value and the masks);
    ``grad``: gradient of the attention output (``[N, L, E]`` with ``batch_first``, else
    ``[L, N, E]``). Returns ``{"in_proj": (a, g), "out_proj": (a, g)}`` as described in the
    module docstring, batch first.
    """
    assert isinstance(m, nn.MultiheadAttention)
    why = mha_check(m)
    if why is not None:  # the mode may have changed since the capture began
        raise UnsupportedLayerError(
            f"nn.MultiheadAttention: {why} is not supported by estimator='hooks'; use "
            "estimator='reference' or 'microbatch'."
        )
    kw = _SIG.bind(m, *args, **kwargs)
    kw.apply_defaults()
    call = kw.arguments
    xs: tuple[Tensor, Tensor, Tensor] = (call["query"], call["key"], call["value"])
    if xs[0].dim() != 3:
        raise UnsupportedLayerError(
            f"nn.MultiheadAttention: unbatched query of shape {tuple(xs[0].shape)}; "
            "estimator='hooks' needs a batch dimension (query [N, L, E] with batch_first)."
        )
    if not m.batch_first:  # [T, N, E] → [N, T, E], the same tensor for the same input
        seen: dict[int, Tensor] = {}
        xs = tuple(seen.setdefault(id(x), x.transpose(0, 1)) for x in xs)  # type: ignore[assignment]
        grad = grad.transpose(0, 1)
    w_in, b_in = m.in_proj_weight.detach(), m.in_proj_bias
    b3 = b_in.detach().chunk(3) if b_in is not None else (None, None, None)
    q, k, v = (F.linear(x, w, b) for x, w, b in zip(xs, w_in.chunk(3), b3, strict=True))
    n, length, src = q.shape[0], q.shape[1], k.shape[1]
    mask, causal = _merged_mask(m, n, length, src, call, q.dtype)
    d_core = grad @ m.out_proj.weight.detach()  # gradient of out_proj's input
    core, dq, dk, dv = attention_grads(q, k, v, m.num_heads, mask, causal, d_core)
    return {"in_proj": _stack_inputs(xs, (dq, dk, dv)), "out_proj": (core, grad)}

"""Model inputs: positional (a tensor or a tuple) or keyword (a mapping), and batches of them.

Every function that runs the user's model on user data (``find_symmetries``,
``SymmetrySet.verify``, ``clip_to_eps``, ``collect_stats`` and the monitor and teleporter on
top of it) reads its inputs through :meth:`ModelInputs.of`:

* a tensor: one positional input, ``model(x)``;
* a tuple: several positional inputs, ``model(*inputs)`` (a model taking one dict is
  passed ``(batch,)``);
* a mapping with string keys (a ``dict``, a Hugging Face ``BatchEncoding``): keyword inputs,
  ``model(**inputs)``, e.g. ``{"input_ids": ids, "attention_mask": mask}``.

Batches (the estimators that split a batch into samples or micro-batches). The batch size N
is the length of dim 0 of the first tensor, positional inputs first. Every tensor whose dim 0
has length N is split into samples; a tensor of dim 0 of length 1 (e.g. ``position_ids`` of
shape ``[1, T]``), a 0-dim tensor and any other value (``None``, ``True``, a number) is passed
unchanged to every sample. Any other length is an error: a tensor that is not split although
it differs per sample would silently mix samples.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import Tensor, nn

__all__ = ["ModelInputs", "Probe"]

_WHAT = (
    "a tensor (one positional input), a tuple (positional inputs) or a dict with string keys "
    "(keyword inputs, model(**inputs), e.g. {'input_ids': ids, 'attention_mask': mask})"
)


def _shape(v: Any) -> str:
    if isinstance(v, Tensor):
        return f"{tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}"
    return type(v).__name__


@dataclass(frozen=True)
class ModelInputs:
    """Positional ``args`` and keyword ``kwargs`` of one model call.

    Attributes:
        args: positional inputs.
        kwargs: keyword inputs (string keys).
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    @classmethod
    def of(cls, inputs: Any, who: str) -> ModelInputs:
        """Read ``inputs`` as in the module docstring; ``who`` names the caller in errors."""
        if isinstance(inputs, ModelInputs):
            return inputs
        if inputs is None:
            raise TypeError(f"{who}: the inputs are None; expected {_WHAT}.")
        if isinstance(inputs, Mapping):
            bad = [k for k in inputs if not isinstance(k, str)]
            if bad:
                raise TypeError(
                    f"{who}: keyword inputs need string keys (argument names of the model's "
                    f"forward); got the key {bad[0]!r} ({type(bad[0]).__name__}). Pass "
                    "positional inputs as a tuple, or a dict that is itself one positional input "
                    "as (batch,)."
                )
            if not inputs:
                raise ValueError(f"{who}: the keyword inputs are an empty dict; expected {_WHAT}.")
            return cls((), dict(inputs))
        if isinstance(inputs, tuple):
            return cls(inputs, {})
        return cls((inputs,), {})

    def __call__(self, model: nn.Module | Callable[..., Any]) -> Any:
        """``model(*args, **kwargs)``."""
        return model(*self.args, **self.kwargs)

    def map(self, fn: Callable[[Any], Any]) -> ModelInputs:
        """``fn`` applied to every leaf (tensors inside tuples, lists and dicts included)."""
        return ModelInputs(
            tuple(pytree.tree_map(fn, a) for a in self.args),
            {k: pytree.tree_map(fn, v) for k, v in self.kwargs.items()},
        )

    def named_leaves(self) -> list[tuple[str, Any]]:
        """(name, leaf) of every leaf: ``"input 0"``, ``"input_ids"``, ``"input 1[2]"``."""
        out: list[tuple[str, Any]] = []
        items = [(f"input {i}", a) for i, a in enumerate(self.args)]
        items += list(self.kwargs.items())
        for name, v in items:
            leaves, _ = pytree.tree_flatten(v)
            if len(leaves) == 1 and leaves[0] is v:
                out.append((name, v))
            else:
                out += [(f"{name}[{j}]", leaf) for j, leaf in enumerate(leaves)]
        return out

    def tensors(self) -> list[Tensor]:
        """Every tensor among the inputs."""
        return [v for _, v in self.named_leaves() if isinstance(v, Tensor)]

    def check_finite(self, who: str) -> None:
        """Refuse NaN/Inf in a floating-point input, naming it (e.g. ``'input 0'``).

        An additive attention mask should use a large finite negative value
        (``torch.finfo(dtype).min``, as Hugging Face does) rather than ``-inf``.
        """
        for name, v in self.named_leaves():
            if isinstance(v, Tensor) and (v.is_floating_point() or v.is_complex()):
                if not bool(torch.isfinite(v).all()):
                    what = "NaN" if bool(torch.isnan(v).any()) else "Inf"
                    raise ValueError(
                        f"{who}: the inputs contain NaN or Inf: {name} (shape "
                        f"{tuple(v.shape)}) has {what} entries; expected finite inputs. Pass "
                        "a finite batch (an additive mask: use torch.finfo(dtype).min instead "
                        "of -inf)."
                    )

    def check_nonempty(self, who: str) -> None:
        """Refuse a batch of 0 samples: every output change on it is 0, a vacuous check."""
        leaves = [(k, v) for k, v in self.named_leaves() if isinstance(v, Tensor) and v.ndim]
        if leaves and leaves[0][1].shape[0] == 0:
            name, v = leaves[0]
            raise ValueError(
                f"{who}: the example batch is empty: {name} has shape {tuple(v.shape)}, 0 "
                "samples along dim 0, so no output can change and every check would pass "
                "vacuously; expected at least one sample (a few, e.g. x[:8]). Pass a "
                "non-empty batch."
            )

    def describe(self) -> str:
        """Shapes for error messages: ``(4, 8) int64, attention_mask=(4, 8) int64``."""
        parts = [_shape(a) for a in self.args]
        parts += [f"{k}={_shape(v)}" for k, v in self.kwargs.items()]
        return ", ".join(parts)

    # -- batches -------------------------------------------------------------------------
    def batch_size(self, who: str, *, split: bool = True) -> int:
        """N: dim 0 of the first tensor with at least one dimension.

        ``split``: the batch will be split into samples, so every other tensor must have dim 0
        of length N or 1 (the hook estimator runs the batch whole and skips this check).

        Raises:
            ValueError: no tensor with a batch dimension, or (``split``) a tensor whose dim 0
                is neither N nor 1.
        """
        leaves = [(k, v) for k, v in self.named_leaves() if isinstance(v, Tensor) and v.ndim]
        if not leaves:
            raise ValueError(
                f"{who}: the inputs ({self.describe()}) hold no tensor with a batch dimension; "
                "expected samples along dim 0 of the first input tensor."
            )
        first, t0 = leaves[0]
        n = int(t0.shape[0])
        for k, v in leaves[1:] if split else ():
            if v.shape[0] not in (n, 1):
                raise ValueError(
                    f"{who}: input {k!r} has shape {tuple(v.shape)}, but the batch size is {n} "
                    f"(dim 0 of {first!r}, the first input tensor); expected dim 0 of every "
                    f"tensor to be {n} (split into samples) or 1 (passed unchanged to every "
                    "sample). Reorder the inputs so that a batched tensor comes first, or keep "
                    "per-batch constants out of the inputs (e.g. as module attributes)."
                )
        return n

    def _batched(self, n: int) -> Callable[[Any], bool]:
        return lambda v: isinstance(v, Tensor) and v.ndim > 0 and v.shape[0] == n and n != 1

    def slice(self, start: int, stop: int, n: int) -> ModelInputs:
        """Samples ``start:stop`` of a batch of ``n`` (unbatched values unchanged)."""
        is_b = self._batched(n)
        return self.map(lambda v: v[start:stop] if is_b(v) else v)

    def in_dims(self, n: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``torch.func.vmap`` in_dims of ``(args, kwargs)``: 0 where split, None elsewhere."""
        is_b = self._batched(n)
        dims = self.map(lambda v: 0 if is_b(v) else None)
        return dims.args, dims.kwargs

    def unsqueezed(self, dims: tuple[tuple[Any, ...], dict[str, Any]]) -> ModelInputs:
        """Inside vmap: a batch of one, the split leaves (``dims`` from :meth:`in_dims`)."""
        none = lambda x: x is None  # noqa: E731 - None is a leaf here, not an empty node
        flat_d = pytree.tree_leaves(dims, is_leaf=none)
        flat_v, spec = pytree.tree_flatten((self.args, self.kwargs), is_leaf=none)
        vals = [v.unsqueeze(0) if d == 0 else v for v, d in zip(flat_v, flat_d, strict=True)]
        args, kwargs = pytree.tree_unflatten(vals, spec)
        return ModelInputs(tuple(args), dict(kwargs))

    def forward_error(self, exc: Exception, who: str) -> str:
        """Why ``model(*inputs)`` failed: the inputs' shapes, torch's words, the dtype hint."""
        hint = self.dtype_hint(exc)
        first = (str(exc).strip().splitlines() or [""])[0]
        return (
            f"{who}: the model's forward failed on the inputs ({self.describe()}): "
            f"{type(exc).__name__}: {first}. "
            + (
                hint
                or "Expected inputs of the shapes and dtype the model takes (samples along dim 0)."
            )
        )

    def dtype_hint(self, exc: BaseException) -> str | None:
        """Why a forward failed on input dtypes, and the fix; None when it is not that.

        Integer inputs to a model that computes in floating point (token ids given to a
        Linear), or floating-point inputs where the model indexes an embedding.
        """
        msg = str(exc)
        if not isinstance(exc, RuntimeError):
            return None
        ts = [(k, v) for k, v in self.named_leaves() if isinstance(v, Tensor)]
        ints = [f"{k} ({str(v.dtype).removeprefix('torch.')})" for k, v in ts if _integer(v)]
        floats = [
            f"{k} ({str(v.dtype).removeprefix('torch.')})" for k, v in ts if v.is_floating_point()
        ]
        if floats and "indices" in msg and ("Long" in msg or "Int" in msg):
            return (
                f"the model indexes an embedding with floating-point inputs {floats}; expected "
                "token ids as an integer tensor. Pass x.long() (the estimators need no gradient "
                "with respect to the inputs)."
            )
        if ints and ("dtype" in msg or "scalar type" in msg):
            return (
                f"the model computes in floating point but got integer inputs {ints}; expected "
                "inputs of the dtype the model computes in, unless it takes indices "
                "(nn.Embedding). Convert the batch, e.g. x.to(next(model.parameters()).dtype)."
            )
        return None


def _integer(t: Tensor) -> bool:
    return not t.is_floating_point() and not t.is_complex()


@dataclass(frozen=True)
class Probe:
    """Inputs to compare a model's outputs on, e.g. the example inputs of detection."""

    inputs: ModelInputs

    @classmethod
    def of(cls, inputs: Any, who: str) -> Probe:
        if isinstance(inputs, Probe):
            return inputs
        return cls(ModelInputs.of(inputs, who))

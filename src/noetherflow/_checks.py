"""Private: the one place where options and numbers are validated.

Every public entry point parses its string options with :func:`parse_enum` and checks its
numbers with the validators below, so that each error names the value, what was expected and
the fix, in one wording.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from datetime import timedelta
from enum import Enum
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor, nn

__all__ = [
    "Fingerprint",
    "batch_statistics",
    "instance_statistics",
    "check_bool",
    "check_decay_type",
    "check_finite_model",
    "check_finite_number",
    "check_instance",
    "check_model_and_set",
    "check_nonnegative",
    "check_nonnegative_int",
    "check_positive",
    "check_positive_int",
    "check_real",
    "check_seed",
    "check_spd",
    "check_stats_cover",
    "check_timeout",
    "fingerprint",
    "parse_enum",
    "same_fingerprint",
]

#: Signature of one parameter's values: Σθ, Σθ², Σ w_k θ_k (see :func:`fingerprint`).
Fingerprint = tuple[float, float, float]

E = TypeVar("E", bound=Enum)


def parse_enum(cls: type[E], value: object, name: str, hint: str = "") -> E:
    """``cls(value)``, or a ``ValueError`` naming ``name``, the value and the accepted members.

    ``hint`` (optional) explains the members, e.g. ``"'mean' (batch mean) or 'sum'"``.
    """
    if isinstance(value, cls):
        return value
    try:
        return cls(value)
    except ValueError:
        allowed = hint or ", ".join(repr(m.value) for m in cls)
        raise ValueError(f"{name}={value!r} is not supported; expected {allowed}.") from None


def _string_fix(value: object, name: str, integer: bool) -> str:
    """For a string that reads as a number, the call that passes the number itself."""
    if isinstance(value, str):
        try:
            v = float(value)
        except ValueError:
            return ""
        shown = int(v) if integer and v.is_integer() else v
        return f"; pass {name}={shown!r} (a number, not a string)"
    return ""


_INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def check_real(
    value: object, name: str, meaning: str = "", expected: str = "a real number"
) -> float:
    """``float(value)`` for a real number, else a ``TypeError`` naming the value and its type.

    A real number: a Python or NumPy int/float (``numbers.Real``), or a 0-d real tensor or
    array. A string (``lr="0.1"``), ``None`` and a bool are refused rather than converted:
    ``float("0.1")`` silently accepts a value read from a config file unparsed, and a bool is
    an ``int`` to Python but never a learning rate or a batch size.
    """
    if isinstance(value, bool | np.bool_):
        raise TypeError(f"{name}={value!r} is a bool; expected {expected}{_of(meaning)}.")
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, Tensor) and value.dim() == 0:
        if not (value.dtype.is_floating_point or value.dtype in _INT_DTYPES):
            raise TypeError(
                f"{name}={value!r} is a {value.dtype} tensor; expected {expected}{_of(meaning)}."
            )
        return float(value)
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iuf":
        return float(value)
    raise TypeError(
        f"{name}={value!r:.60} is a {type(value).__name__}; expected {expected}"
        f"{_of(meaning)}{_string_fix(value, name, 'integer' in expected)}."
    )


def check_decay_type(value: object, name: str = "weight_decay") -> None:
    """Refuse a string ``weight_decay``, which ``float()`` would read (``"1e-4"`` → 1e-4).

    Numbers, mappings and ``ParamDecay`` are checked where the decay is parsed; only the
    string, which that parse would convert silently, is refused here.
    """
    if isinstance(value, str | bytes):
        check_real(value, name, "γ of γ‖θ‖², or a mapping parameter → γ")


def check_finite_number(value: object, name: str, meaning: str = "") -> float:
    """``float(value)`` if it is a finite real number (:func:`check_real`), else an error."""
    v = check_real(value, name, meaning)
    if not math.isfinite(v):
        raise ValueError(f"{name}={value!r} is not finite; expected a finite real{_of(meaning)}.")
    return v


def check_positive(value: object, name: str, meaning: str = "") -> float:
    """A finite ``value > 0`` as a float, else a ``ValueError``."""
    v = check_finite_number(value, name, meaning)
    if v <= 0:
        raise ValueError(f"{name}={value!r} must be > 0{_of(meaning)}.")
    return v


def check_nonnegative(value: object, name: str, meaning: str = "", fix: str = "") -> float:
    """A finite ``value >= 0`` as a float, else a ``ValueError`` (``fix`` is appended)."""
    v = check_finite_number(value, name, meaning)
    if v < 0:
        raise ValueError(f"{name}={value!r} must be >= 0{_of(meaning)}{'; ' + fix if fix else ''}.")
    return v


def check_positive_int(value: object, name: str, meaning: str = "") -> int:
    """An integer ``value >= 1`` (Python, NumPy or integral float), else a ``ValueError``."""
    bad = ValueError(f"{name}={value!r} must be a positive integer{_of(meaning)}.")
    v = check_real(value, name, meaning, "a positive integer")
    if not math.isfinite(v) or not v.is_integer() or v < 1:
        raise bad
    return int(v)


def check_nonnegative_int(value: object, name: str, meaning: str = "") -> int:
    """An integer ``value >= 0`` (Python, NumPy or integral float), else a ``ValueError``."""
    check_real(value, name, meaning, "an integer >= 0")
    if isinstance(value, int | np.integer) and value == 0:
        return 0
    try:
        return check_positive_int(value, name, meaning)
    except ValueError:
        raise ValueError(f"{name}={value!r} must be an integer >= 0{_of(meaning)}.") from None


def check_seed(value: object, name: str = "seed") -> int:
    """An integer seed in ``[0, 2**63)`` (NumPy integers too), else an error naming it."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name}={value!r} is a {type(value).__name__}; expected an integer seed.")
    if not 0 <= int(value) < 2**63:
        raise ValueError(f"{name}={value!r} must be an integer in [0, 2**63).")
    return int(value)


def check_instance(value: object, cls: type | tuple[type, ...], name: str, what: str) -> None:
    """Refuse ``value`` unless it is a ``cls``: a ``TypeError`` naming ``name`` and ``what``."""
    if not isinstance(value, cls):
        raise TypeError(f"{name} is a {type(value).__name__} ({value!r:.60}); expected {what}.")


def check_model_and_set(model: object, syms: object, who: str) -> None:
    """``model`` an ``nn.Module`` and ``syms`` a :class:`~noetherflow.SymmetrySet`."""
    from noetherflow.symmetry.set import SymmetrySet

    check_instance(model, nn.Module, f"{who}: model", "an nn.Module")
    check_instance(
        syms,
        SymmetrySet,
        f"{who}: syms",
        "a SymmetrySet (nf.find_symmetries(model, x), or nf.SymmetrySet([...]))",
    )


def check_timeout(value: object, name: str = "timeout") -> timedelta | None:
    """``None``, a ``timedelta`` > 0, or a number of seconds > 0 (as a ``timedelta``)."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        if value.total_seconds() <= 0:
            raise ValueError(f"{name}={value!r} must be a positive duration.")
        return value
    if isinstance(value, bool):
        raise TypeError(f"{name}={value!r} is a bool; expected seconds (a number) or a timedelta.")
    return timedelta(seconds=check_positive(value, name, "seconds to wait for the other ranks"))


def check_bool(value: object, name: str) -> bool:
    """``value`` if it is a bool (NumPy's too), else a ``TypeError`` (no truthiness of strings)."""
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name}={value!r} is a {type(value).__name__}; expected True or False.")
    return bool(value)


def check_stats_cover(params: Sequence[Any], stats: Any, who: str) -> dict[Any, Fingerprint]:
    """Refuse statistics of another set, or computed at other parameter values.

    ``stats`` is a :class:`~noetherflow.stats.core.GradStats`: every parameter of the set
    needs an entry in ``stats.mean`` (statistics of another set lack some), and a parameter
    whose :func:`fingerprint` the statistics recorded must still have it (an optimizer step
    since makes them the statistics of another point). Non-finite parameters are left to the
    caller's divergence check, which names that cause. Returns the :func:`fingerprint` now of
    each parameter the statistics recorded one for (a caller's stamp need not repeat it).
    """
    mean: Mapping[Any, Any] = stats.mean if hasattr(stats, "mean") else stats  # or the means
    missing = [tuple(getattr(p, "shape", ())) for p in params if p not in mean]
    if missing:
        raise ValueError(
            f"{who}: the statistics have no entry for {len(missing)} parameter(s) of the "
            f"symmetry set (shapes {missing}); expected statistics collected for this set. "
            "Call collect_stats(model, syms, ...) with the same SymmetrySet."
        )
    known: Mapping[Any, Fingerprint] = getattr(stats, "fingerprint", None) or {}
    at = [p for p in params if p in known]
    now = fingerprint(at)
    moved = [
        tuple(p.shape)
        for p, f in zip(at, now, strict=True)
        if all(map(math.isfinite, f)) and not same_fingerprint(f, known[p])
    ]
    if moved:
        from noetherflow._errors import StatisticsError

        raise StatisticsError(
            f"{who}: parameters of shapes {moved} changed since the statistics were collected "
            "(an optimizer step or a teleport in between); statistics hold only at the "
            "parameters they were computed at. Collect them again (nf.collect_stats, or a "
            "new capture) after the last change of the parameters."
        )
    return dict(zip(at, now, strict=True))


def fingerprint(params: Sequence[Tensor]) -> tuple[Fingerprint, ...]:
    """A cheap signature of parameter values: Σθ, Σθ², Σ w_k θ_k (fixed weights w) each.

    Equal values give equal signatures (same device and dtype); a training step, a teleport
    or any in-place change alters them. One transfer to the host for all parameters.
    """
    if not params:
        return ()
    from noetherflow import _shard

    rows = []
    with torch.no_grad():
        for p in params:
            if _shard.is_sharded(p):  # sums over the rows of each shard, all-reduced
                rows.append(torch.tensor(_shard.fingerprint_sums(p.detach()), dtype=torch.float64))
                continue
            rows.append(_fingerprint_sums(p.detach().reshape(-1)).cpu())
    return tuple((a, b, c) for a, b, c in torch.stack(rows).tolist())


_FP_CHUNK = 13 * 2**16  # entries per float64 chunk (~7 MB): converted in cache


def _fingerprint_sums(x: Tensor) -> Tensor:
    """[Σx, Σx², Σ w_k x_k] of a flat tensor, w_k = k mod 13 + 1, in float64. ``[3]``.

    Chunk by chunk: a float64 copy of a whole large parameter (GPT-2's 57M symmetry
    parameters: 450 MB written and read three times) took twice as long.
    """
    w = torch.arange(1, 14, dtype=torch.float64, device=x.device)
    body = x.numel() - x.numel() % 13  # the columns of a [-1, 13] view carry w
    parts = []
    for s in range(0, body, _FP_CHUNK):
        c = x[s : min(s + _FP_CHUNK, body)].to(torch.float64)
        cols = c.view(-1, 13).sum(0)  # Σx is theirs too: one pass fewer
        parts.append(torch.stack([cols.sum(), c @ c, cols @ w]))
    t = x[body:].to(torch.float64)
    parts.append(torch.stack([t.sum(), t @ t, t @ w[: t.numel()]]))
    return torch.stack(parts).sum(0)


def same_fingerprint(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether two :func:`fingerprint` entries agree (to 1e-12, the rounding of a reduction)."""
    return all(
        x == y or (math.isfinite(x) and abs(x - y) <= 1e-12 * max(abs(x), abs(y)))
        for x, y in zip(a, b, strict=True)
    )


def _all_finite(t: Tensor) -> bool:
    """No NaN/Inf in ``t``: its max and min are finite (NaN propagates through both).

    Two reductions without a temporary: ``torch.isfinite(t).all()`` took 1 s on GPT-2's
    38.6M-entry embedding on one thread, ``amax``/``amin`` 0.13 s.
    """
    if t.numel() == 0:
        return True
    return bool(torch.isfinite(torch.stack([t.amax(), t.amin()])).all())


def check_finite_model(model: nn.Module, who: str) -> None:
    """Refuse a model with a NaN/Inf parameter, naming the first one (a diverged run)."""
    for name, p in model.named_parameters():
        if p.is_floating_point() and not _all_finite(p.detach()):
            what = "NaN" if bool(torch.isnan(p.detach()).any()) else "Inf"
            raise ValueError(
                f"{who}: parameter {name!r} (shape {tuple(p.shape)}) has {what} entries; "
                "expected a finite model (a diverged run, or a NaN written into a weight). "
                "Load finite weights, or re-initialise that parameter."
            )


def check_spd(m: Any, name: str, who: str) -> Tensor:
    """``m`` as a floating tensor if it is a finite symmetric positive definite matrix."""
    if not isinstance(m, Tensor):
        raise TypeError(f"{who}: {name} is a {type(m).__name__}; expected a square torch.Tensor.")
    if m.ndim != 2 or m.shape[0] != m.shape[1] or not m.is_floating_point():
        raise ValueError(
            f"{who}: {name} has shape {tuple(m.shape)} and dtype {m.dtype}; expected a square "
            "floating-point matrix."
        )
    if not bool(torch.isfinite(m).all()):
        raise ValueError(f"{who}: {name} has NaN/Inf entries; expected a finite matrix.")
    scale = float(m.abs().max()) if m.numel() else 0.0
    asym = float((m - m.T).abs().max()) if m.numel() else 0.0
    if asym > 100 * torch.finfo(m.dtype).eps * scale:
        raise ValueError(
            f"{who}: {name} is not symmetric (max |M − Mᵀ| = {asym:.3g}, max |M| = {scale:.3g}); "
            "expected a symmetric positive definite matrix. Symmetrise it, (M + M.T) / 2, if "
            "the asymmetry is rounding."
        )
    low = float(torch.linalg.eigvalsh(m.to(torch.float64)).min()) if m.numel() else 1.0
    if not low > 0:
        raise ValueError(
            f"{who}: {name} is not positive definite (smallest eigenvalue {low:.3g}); expected "
            "a symmetric positive definite matrix (a covariance with full rank). Add a ridge, "
            "M + eps·I, if it is singular."
        )
    return m


def _of(meaning: str) -> str:
    return f" ({meaning})" if meaning else ""


def batch_statistics(m: nn.Module) -> str | None:
    """Why ``m`` normalises by the statistics of the batch (None when it does not).

    The one check of "BatchNorm in training mode" (PyTorch's rule): a BatchNorm in training
    mode, or in eval mode without running statistics (``track_running_stats=False``),
    normalises with the batch's own mean and variance, which couples the samples: per-sample
    gradients are not defined, and the layer input and output-gradient do not give them.
    Any other module (LayerNorm, GroupNorm, an eval-mode BatchNorm with running statistics)
    gives None.
    """
    if not isinstance(m, nn.modules.batchnorm._BatchNorm):
        return None
    if m.training:
        return "training-mode BatchNorm (batch statistics couple the samples)"
    if m.running_mean is None or m.running_var is None:
        return "BatchNorm without running statistics (batch statistics couple the samples)"
    return None


def instance_statistics(m: nn.Module) -> bool:
    """Whether an InstanceNorm normalises by each sample's own statistics now.

    PyTorch's rule: in training mode, or without ``track_running_stats``; in eval mode with
    them it divides by its running statistics (and is then not scale invariant).
    """
    assert isinstance(m, nn.modules.instancenorm._InstanceNorm)
    return m.training or not m.track_running_stats

"""Validation helpers and matrix utilities shared by the closed forms (private)."""

from __future__ import annotations

import math
import numbers
from typing import Literal

import torch
from torch import Tensor

# Independent of the library (an oracle): plain Literals, named apart from nf.TimeModel and
# nf.Reduction (this one also has "half_sum", the ½Σ convention of some closed forms).
TimeScale = Literal["continuous", "discrete"]
LossScaling = Literal["sum", "mean", "half_sum"]
InitScheme = Literal["kaiming", "xavier"]


def _check_time(time: str) -> None:
    if time not in ("continuous", "discrete"):
        raise ValueError(
            f"time={time!r} is not a time model; expected 'continuous' (SGF, t = η·steps) "
            "or 'discrete' (per SGD step). Pass one of those two strings."
        )


def _check_real(name: str, value: object) -> None:
    """A string or a bool is refused (``float("0.1")`` would read it), a real number passes.

    The theory imports nothing from the library (an independent oracle), so this is its own
    check, the same rule as the library's ``check_real``.
    """
    if isinstance(value, Tensor):
        real = value.dim() == 0 and not value.dtype.is_complex and value.dtype != torch.bool
    else:
        real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if real:
        return
    fix = ""
    if isinstance(value, str):
        try:
            fix = f"; pass {name}={float(value)!r} (a number, not a string)"
        except ValueError:
            pass
    raise TypeError(
        f"{name}={value!r:.60} is a {type(value).__name__}; expected a real number{fix}."
    )


def _check_positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    _check_real(name, value)  # a string or a bool: a TypeError naming it
    ok = value >= 0 if allow_zero else value > 0
    if not (ok and math.isfinite(value)):
        bound = "≥ 0" if allow_zero else "> 0"
        raise ValueError(f"{name}={value!r} is invalid; expected a finite number {bound}.")


def _check_matrix(name: str, m: Tensor, rows: int | None = None, cols: int | None = None) -> None:
    if not isinstance(m, Tensor) or m.dim() != 2:
        shape = tuple(m.shape) if isinstance(m, Tensor) else type(m).__name__
        raise ValueError(
            f"{name} has shape {shape}; expected a 2-D tensor. Pass a matrix "
            "(use .reshape(rows, cols) for vectors)."
        )
    if rows is not None and m.shape[0] != rows:
        raise ValueError(
            f"{name} has shape {tuple(m.shape)}; expected {rows} rows to match the other "
            "arguments. Check the orientation (U is [d_y, d], W is [d, d_x])."
        )
    if cols is not None and m.shape[1] != cols:
        raise ValueError(
            f"{name} has shape {tuple(m.shape)}; expected {cols} columns to match the other "
            "arguments. Check the orientation (U is [d_y, d], W is [d, d_x])."
        )


def _check_square(name: str, m: Tensor, n: int | None = None) -> None:
    _check_matrix(name, m)
    if m.shape[0] != m.shape[1]:
        raise ValueError(f"{name} has shape {tuple(m.shape)}; expected a square matrix.")
    if n is not None and m.shape[0] != n:
        raise ValueError(
            f"{name} has shape {tuple(m.shape)}; expected [{n}, {n}] to match the other arguments."
        )


def _sym(m: Tensor) -> Tensor:
    return 0.5 * (m + m.T)


def _psd_power(m: Tensor, power: float, name: str) -> Tensor:
    """``m**power`` for a symmetric positive (semi)definite ``m`` (negative powers need PD)."""
    evals, evecs = torch.linalg.eigh(_sym(m))
    scale = evals.abs().max().clamp_min(torch.finfo(m.dtype).tiny)
    if power < 0 and bool((evals <= 1e-12 * scale).any()):
        raise ValueError(
            f"{name} is singular (smallest eigenvalue {evals.min().item():.3e}); expected a "
            "positive-definite matrix. Restrict to the span of the data or add an explicit "
            "ridge."
        )
    if bool((evals < -1e-10 * scale).any()):
        raise ValueError(
            f"{name} has a negative eigenvalue ({evals.min().item():.3e}); expected a "
            "positive-semidefinite matrix (a second moment or covariance)."
        )
    return (evecs * evals.clamp_min(0.0).pow(power)) @ evecs.T


def _rank_svd(m: Tensor, rtol: float) -> tuple[Tensor, Tensor, Tensor]:
    """Thin SVD ``m = L diag(s) R`` truncated to the numerical rank.

    ``L`` has shape ``[rows, k]``, ``s`` shape ``[k]``, ``R`` shape ``[k, cols]``.
    """
    left, s, right = torch.linalg.svd(m, full_matrices=False)
    k = int((s > rtol * s.max().clamp_min(torch.finfo(m.dtype).tiny)).sum().item())
    if k == 0:
        raise ValueError(
            "the target map is zero; expected a nonzero V (the product at the minimum)."
        )
    return left[:, :k], s[:k], right[:k, :]


def _embedding(width: int, rank: int, like: Tensor) -> Tensor:
    """The representative semi-orthogonal ``[width, rank]`` matrix ``[I_rank; 0]``."""
    if width < rank:
        raise ValueError(
            f"hidden width {width} is smaller than rank(V) = {rank}; a product of rank {rank} "
            f"cannot pass through width {width}. Use a width ≥ {rank} or a lower-rank V."
        )
    return torch.eye(width, rank, dtype=like.dtype, device=like.device)

"""Anderson acceleration of a coupled block's sweeps, on its diagonal generators (issue 28).

In a coupled group whose rotations act on disjoint coordinates (the heads of one layer)
and are coupled only through one joint diagonal step (a rescaling sharing their
parameters), each sweep solves the rotations exactly for the current λ of the diagonal
generators, so a sweep is a map λ → Φ(λ) (the joint diagonal optimum given the rotations
at their optimum for λ), and the equilibrium is its fixed point. Block Gauss–Seidel
iterates Φ and converges linearly; Anderson mixing (type II, window ``m``) extrapolates
λ_{k+1} = Φ(λ_k) − ΔG γ with γ = argmin ‖f_k − ΔF γ‖, f = Φ(λ) − λ
(Walker & Ni 2011, eq. 2.1). The sweeps' stopping criterion is unchanged, so the solution
is the same equilibrium to the solver's tolerance. :func:`sweep_accelerator` says where a
block's sweeps are such a map; :func:`diagonal_point` reads λ from the totals and
:func:`split_point` cuts a move of λ back into one element per symmetry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor

from noetherflow.symmetry.base import DiagonalSymmetry, Symmetry

if TYPE_CHECKING:
    from noetherflow._sweep_plan import Step

__all__ = ["Anderson", "diagonal_point", "least_squares", "split_point", "sweep_accelerator"]


class Anderson:
    """Type-II Anderson mixing of a fixed-point map x → g(x) on vectors ``[n]`` (float64).

    :meth:`step` takes the last point and its image and returns the next point. The history
    is dropped (a plain step) when the residual grows, so a bad extrapolation costs one
    sweep.
    """

    def __init__(self, window: int = 5) -> None:
        self.window = window
        self._x: list[Tensor] = []
        self._g: list[Tensor] = []

    def step(self, x: Tensor, g: Tensor) -> Tensor:
        """The next point after ``x`` with image ``g`` (both ``[n]``). Has shape ``[n]``."""
        f = g - x
        if self._x and float(f.norm()) > float((self._g[-1] - self._x[-1]).norm()):
            self._x, self._g = [], []
        self._x.append(x)
        self._g.append(g)
        self._x, self._g = self._x[-self.window - 1 :], self._g[-self.window - 1 :]
        if len(self._x) < 2:
            return g
        fs = torch.stack([b - a for a, b in zip(self._x, self._g, strict=True)], 1)  # [n, k]
        gs = torch.stack(self._g, 1)
        df, dg = fs.diff(dim=1), gs.diff(dim=1)
        scale = df.norm(dim=0).clamp_min(1e-300)
        gamma = least_squares(df / scale, f)
        return g - dg @ (gamma / scale)


def least_squares(a: Tensor, b: Tensor, rcond: float = 1e-14) -> Tensor:
    """The minimum-norm argmin_γ ‖b − aγ‖ for a tall, thin ``a`` ``[n, k]``, ``b`` ``[n]``.

    Has shape ``[k]``. By the eigendecomposition of the k × k normal matrix aᵀa, dropping
    eigenvalues at most ``rcond`` times the largest (singular values below 1e-7 of the
    largest, by default). Not LAPACK's least squares: on the CPU's MKL its last bits change
    from call to call for the same inputs, and a solve's blocks must give the same numbers
    side by side as alone (``tests/test_solver_parallel.py``); the k × k eigendecomposition
    and the products here do not.
    """
    w, v = torch.linalg.eigh(a.mT @ a)
    keep = w > w.amax() * rcond
    inv = torch.where(keep, 1 / torch.where(keep, w, 1.0), 0.0)
    return v @ (inv * (v.mT @ (a.mT @ b)))


def sweep_accelerator(groups: list[Step]) -> Anderson | None:
    """Anderson mixing on the diagonal λ where a sweep is a map of λ alone (above).

    That is: one joint diagonal step first, then one run of rotations on disjoint coordinates
    (each solved exactly for the current λ).
    """
    if len(groups) != 2 or not groups[0].kernel.can_hold:
        return None
    rest = groups[1]
    return Anderson() if rest.disjoint or len(rest.members) == 1 else None


def diagonal_point(members: list[Symmetry], totals: Mapping[Symmetry, Any]) -> Tensor:
    """The diagonal generators' totals λ, concatenated. Has shape ``[Σ J]``."""
    return torch.cat([torch.as_tensor(totals[s]).reshape(-1) for s in members])


def split_point(members: list[Symmetry], delta: Tensor) -> list[tuple[Symmetry, Tensor]]:
    """``delta`` ``[Σ J]`` cut back into one element per symmetry (zero moves left out)."""
    out, at = [], 0
    for s in members:
        n = cast(DiagonalSymmetry, s).num_generators
        part = delta[at : at + n]
        at += n
        if bool(part.ne(0).any()):
            out.append((s, part))
    return out

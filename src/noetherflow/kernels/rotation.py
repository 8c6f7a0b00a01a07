"""The rotation kernel: a double rotation ℓ(UG, G^{-1}W) = ℓ(U, W) (paper §5.1, eq. 10).

Statistics: the two d×d moments M_W = E[∇W_f ∇W_fᵀ] and M_U = E[∇U_f ∇U_fᵀ] of the d-front
per-sample gradients (docs/concepts/equilibrium.md), from per-sample gradients or from the factors
of Linear-like layers. Noise term: Tr[B(M_U − M_W)] for every symmetric B, i.e. the matrix
M_U − M_W with M scaled by the time model. Solve: the matrix geometric mean
P = Y^{-1/2}(Y^{1/2} X Y^{1/2})^{1/2} Y^{-1/2} solves P Y P = X with X = M_U + κWWᵀ,
Y = M_W + κUᵀU, and G = P^{1/2}; directions outside the common range of X and Y have their
equilibrium at infinity. Distance: ‖log P‖_F with P = GGᵀ.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from typing_extensions import override

from noetherflow._checks import check_spd
from noetherflow._errors import StatisticsError
from noetherflow._threads import one_thread
from noetherflow.kernels.base import (
    GradSource,
    GroupSolve,
    InfinityReport,
    Kernel,
    SampleSource,
    StepOptions,
    register_kernel,
)
from noetherflow.kernels.noise import NoiseModel, cross_values
from noetherflow.stats.core import GradStats, Level, StatsBlock
from noetherflow.stats.sample_factors import HeldSamples
from noetherflow.symmetry.base import Symmetry
from noetherflow.symmetry.rotation import Block, DoubleRotation

__all__ = ["RotationKernel", "RotationStats", "geometric_mean"]


@dataclass
class RotationStats(StatsBlock):
    """Per rotation, (E[∇W_f ∇W_fᵀ], E[∇U_f ∇U_fᵀ]), each ``[d, d]``.

    These are M_W and M_U of docs/concepts/equilibrium.md before scaling by the time model.
    """

    key: ClassVar[str] = "rotation"
    side: dict[Symmetry, tuple[Tensor, Tensor]] = field(default_factory=dict)


def _block(stats: GradStats) -> RotationStats:
    b = stats.block(RotationStats.key)
    if not isinstance(b, RotationStats):
        raise StatisticsError(
            "These statistics hold no block for rotations; collect them with "
            "nf.collect_stats for the same symmetry set."
        )
    return b


def side_moment(blocks: Sequence[Block], src: GradSource) -> Tensor:
    """Σ over the blocks of one side of (1/N) Σ_n F_n F_nᵀ (d-front gradients). ``[d, d]``."""
    out: Tensor | None = None
    for b in blocks:
        m = src.front_moment(b.param, b.axis, b.start, b.stop)
        out = m if out is None else out + m
    assert out is not None
    return out


def _sym_fn(a: Tensor, fn: Any) -> Tensor:
    w, v = torch.linalg.eigh(a)
    return (v * fn(w)) @ v.T


def geometric_mean(X: Tensor, Y: Tensor) -> Tensor:
    """The SPD solution P of P Y P = X: P = Y^{-1/2}(Y^{1/2} X Y^{1/2})^{1/2} Y^{-1/2}.

    ``X``, ``Y``: symmetric positive definite ``[d, d]`` → ``[d, d]``.

    Raises:
        TypeError, ValueError: ``X`` or ``Y`` is not a finite symmetric positive definite
            matrix, or their shapes differ (P would be meaningless: NaN or not SPD).
    """
    X = check_spd(X, "X", "geometric_mean")
    Y = check_spd(Y, "Y", "geometric_mean")
    if X.shape != Y.shape:
        raise ValueError(
            f"geometric_mean: X has shape {tuple(X.shape)} but Y has {tuple(Y.shape)}; expected "
            "two d×d matrices of the same d."
        )
    return _geometric_mean(X, Y)


def _geometric_mean(X: Tensor, Y: Tensor, y_eigh: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """:func:`geometric_mean` without the checks (the solver's X, Y are SPD by construction).

    ``y_eigh``: the ``torch.linalg.eigh`` of ``Y`` when the caller has it (Y^{±1/2} from one
    decomposition).
    """
    w, v = torch.linalg.eigh(Y) if y_eigh is None else y_eigh
    yh = (v * torch.sqrt(w)) @ v.T
    yih = (v * (1 / torch.sqrt(w))) @ v.T
    z = yh @ X @ yh
    z = (z + z.T) / 2
    p = yih @ _sym_fn(z, lambda w: torch.sqrt(w.clamp(min=0))) @ yih
    return (p + p.T) / 2


def _common_range(rx: Tensor, ry: Tensor, tol: float = 1e-8) -> Tensor:
    """Orthonormal basis of range X ∩ range Y from orthonormal range bases ``[d, r]``.

    The directions of range X whose distance from range Y (the sine of the principal angle)
    is at most ``tol``: right singular vectors of (I − R_Y R_Yᵀ) R_X, O(d·r²) not O(d³).
    """
    d = rx.shape[0]
    if rx.shape[1] == 0 or ry.shape[1] == 0:
        return rx.new_zeros(d, 0)
    _, sv, vh = torch.linalg.svd(rx - ry @ (ry.T @ rx), full_matrices=False)
    return rx @ vh[sv <= tol].T


def _complement(q: Tensor) -> Tensor:
    """Orthonormal basis ``[d, d − k]`` of the orthogonal complement of orthonormal ``q``."""
    d, k = q.shape
    if k == 0:
        return torch.eye(d, dtype=q.dtype)
    full, _ = torch.linalg.qr(q, mode="complete")
    return full[:, k:]


def _solve_rotation(
    X: Tensor, Y: Tensor, *, rtol: float, ridge: float | None
) -> tuple[Tensor, Tensor | None, float, float]:
    """G = P^{1/2} with P Y P = X on the common range.

    Returns (G, basis of the directions at infinity or None, relative flow before, after), the
    flows measured on the finite directions only. With singular statistics the geometric mean
    is taken in a basis of the common range (k×k), and G is the identity on its complement.
    """
    d = X.shape[0]
    X = (X + X.T) / 2
    Y = (Y + Y.T) / 2
    eye = torch.eye(d, dtype=torch.float64)
    if ridge is not None:
        X, Y = X + ridge * eye, Y + ridge * eye
    ex, vx = torch.linalg.eigh(X)
    ey, vy = torch.linalg.eigh(Y)
    top = float(max(ex.max(), ey.max(), 0.0))
    if top == 0.0:
        return eye, eye, 0.0, 0.0
    cut = rtol * top
    q: Tensor | None = None
    nb: Tensor | None = None
    xs, ys = X, Y
    if bool((ex <= cut).any() or (ey <= cut).any()):
        q = _common_range(vx[:, ex > cut], vy[:, ey > cut])
        nb = _complement(q)
        if q.shape[1] == 0:
            return eye, nb, 0.0, 0.0
        xs, ys = q.T @ X @ q, q.T @ Y @ q
    w, v = torch.linalg.eigh(_geometric_mean(xs, ys, (ey, vy) if q is None else None))
    w = w.clamp(min=float(w.max()) * 1e-300)
    gr = (v * w.sqrt()) @ v.T
    gri = (v / w.sqrt()) @ v.T

    def rel(x: Tensor, y: Tensor) -> float:
        return float((x - y).norm() / (x.norm() + y.norm()).clamp_min(1e-300))

    before, after = rel(xs, ys), rel(gri @ xs @ gri, gr @ ys @ gr)
    if q is None:
        return gr, None, before, after
    return eye + q @ (gr - torch.eye(q.shape[1], dtype=gr.dtype)) @ q.T, nb, before, after


def _negative(x: Tensor, y: Tensor, rtol: float) -> bool:
    """Whether X or Y (``[d, d]``) has an eigenvalue below −rtol·(largest |eigenvalue|)."""
    ex = torch.linalg.eigvalsh((x + x.T) / 2)
    ey = torch.linalg.eigvalsh((y + y.T) / 2)
    top = float(max(ex.abs().max(), ey.abs().max()))
    return bool(min(float(ex.min()), float(ey.min())) < -rtol * top)


def _mixed_cross(
    s: DoubleRotation,
    values: Mapping[nn.Parameter, Tensor],
    stats: GradStats,
    nm: NoiseModel,
) -> tuple[float, Tensor, Tensor, Tensor, Tensor] | None:
    """(4η², U-front of Γθ, U-front of ḡ, W-front of Γθ, W-front of ḡ), float64 CPU.

    The parts of the decay cross term H = 4η²[sym(U_Γ Ḡ_Uᵀ) − sym(W_Γ Ḡ_Wᵀ)] (eq. PD4) of
    a rotation whose parameters have different γ in discrete time; None where it vanishes.
    """
    if nm.uniform(s.params) is not None:
        return None
    mix = nm.mixed_terms(s.params, "solve_equilibrium")
    if not mix.cross:
        return None
    gt = {p: values[p].to(torch.float64).cpu() * mix.gamma[p] for p in s.params}
    mean = {p: stats.mean[p].to(torch.float64).cpu() for p in s.params}
    side = DoubleRotation.side
    return (
        mix.cross,
        side(s.u_blocks, gt),
        side(s.u_blocks, mean),
        side(s.w_blocks, gt),
        side(s.w_blocks, mean),
    )


def _sym(a: Tensor) -> Tensor:
    return (a + a.T) / 2


def _solve_with_cross(
    x: Tensor,
    y: Tensor,
    cross: tuple[float, Tensor, Tensor, Tensor, Tensor],
    opts: RotationSettings,
) -> tuple[Tensor, Tensor | None, float, float]:
    """G with X(G) − Y(G) + H(G) = 0: a fixed point on the geometric mean (eq. PD7).

    At the total element G, X(G) = G⁻¹XG⁻ᵀ and Y(G) = GᵀYG (covariant), but H(G) =
    c[sym(GᵀU_Γ (G⁻¹Ḡ_U)ᵀ) − sym(G⁻¹W_Γ (GᵀḠ_W)ᵀ)] is not; each iteration solves
    P Y(G) P = X(G) + H(G) with H frozen and composes G ← G·P^{1/2}, until the flow's relative
    size is below ``opts.tol`` (H is O(η) against X, so each iteration gains that factor).
    Returns what :func:`_solve_rotation` does; the total G is not symmetric in general.
    """
    c, ug, gu, wg, gw = cross
    total = torch.eye(x.shape[0], dtype=torch.float64)
    first: float | None = None
    rel = 0.0
    nb: Tensor | None = None
    for _ in range(max(opts.max_iter, 1)):
        gi = torch.linalg.inv(total)
        xg = _sym(gi @ x @ gi.T)
        yg = _sym(total.T @ y @ total)
        hg = c * (_sym((total.T @ ug) @ (gi @ gu).T) - _sym((gi @ wg) @ (total.T @ gw).T))
        scale = float(xg.norm() + yg.norm() + hg.norm()) or 1.0
        rel = float((xg - yg + hg).norm()) / scale
        first = rel if first is None else first
        if rel <= opts.tol:
            break
        step, nb, _, _ = _solve_rotation(xg + hg, yg, rtol=opts.rtol_singular, ridge=opts.ridge)
        total = total @ step
        if nb is not None and nb.shape[1] > 0:
            break  # part at infinity: reported, the rest solved once
    return total, nb, float(first or 0.0), rel


@dataclass(frozen=True)
class RotationSettings:
    """What a rotation's solve reads (the fields of ``nf.SolveOptions`` it takes).

    Attributes:
        tol, max_iter: the fixed point on the geometric mean with per-parameter decay
            (:func:`_solve_with_cross`): its relative flow at which to stop, its iterations.
        rtol_singular: eigenvalues of X or Y below this fraction of the largest count as zero
            (hidden directions: equilibrium at infinity, reported).
        ridge: ``ridge·I`` added to X and Y instead (``None``: none).
    """

    tol: float = 1e-12
    max_iter: int = 100
    rtol_singular: float = 1e-10
    ridge: float | None = None


class RotationKernel(Kernel[DoubleRotation, RotationStats]):
    """Kernel of :class:`~noetherflow.symmetry.rotation.DoubleRotation`, one pair at a time."""

    name: ClassVar[str] = RotationStats.key
    block: ClassVar[type[StatsBlock]] = RotationStats
    matrix_valued: ClassVar[bool] = True
    # Γ is constant on each parameter and G acts on the rotated index within each block
    decay_commutes: ClassVar[bool] = True
    batchable: ClassVar[bool] = True
    factored: ClassVar[bool] = True
    settings: ClassVar[type[Any]] = RotationSettings

    def collect(
        self, syms: Sequence[DoubleRotation], src: GradSource, level: Level
    ) -> RotationStats:
        """(M_W, M_U) of each rotation (``level`` does not apply)."""
        if isinstance(src, SampleSource):  # per-sample gradients: batched Gram products
            from noetherflow.kernels.rotation_batch import sample_moments

            return RotationStats(side=sample_moments(syms, src))
        return RotationStats(
            side={s: (side_moment(s.w_blocks, src), side_moment(s.u_blocks, src)) for s in syms}
        )

    def moments(self, s: DoubleRotation, stats: GradStats, nm: NoiseModel) -> tuple[Tensor, Tensor]:
        """(M_W, M_U) of docs/concepts/equilibrium.md scaled by the time model, each ``[d, d]``."""
        sw, su = _block(stats).side[s]
        gw = DoubleRotation.side(s.w_blocks, stats.mean)
        gu = DoubleRotation.side(s.u_blocks, stats.mean)
        v = cross_values(stats, nm, s.params)  # the momentum cross term, sym(vḡᵀ) per side
        if v is None:
            return nm.matrix(gw @ gw.T, sw), nm.matrix(gu @ gu.T, su)
        vw, vu = DoubleRotation.side(s.w_blocks, v), DoubleRotation.side(s.u_blocks, v)
        return nm.matrix(gw @ gw.T, sw, vw @ gw.T), nm.matrix(gu @ gu.T, su, vu @ gu.T)

    def noise(self, s: DoubleRotation, stats: GradStats, nm: NoiseModel) -> Tensor:
        """M_U − M_W: Tr[B(M_U − M_W)] is the noise term of the generator B. ``[d, d]``."""
        mw, mu = self.moments(s, stats, nm)
        return mu - mw

    def xy(
        self,
        s: DoubleRotation,
        values: Mapping[nn.Parameter, Tensor],
        stats: GradStats,
        nm: NoiseModel,
    ) -> tuple[Tensor, Tensor]:
        """X = M_U + κWWᵀ and Y = M_W + κUᵀU (float64, CPU), each ``[d, d]``.

        With γ per parameter: X = M_U + W_κW_κᵀ and Y = M_W + U_κU_κᵀ, W_κ = √κ ⊙ W
        (docs/concepts/flow.md, eq. PD6).
        """
        sub = nm.uniform(s.params)
        if sub is None:
            mix = nm.mixed_terms(s.params, "solve_equilibrium")
            mw, mu = self.moments(s, stats, mix.noise)
            scaled = {p: values[p].to(torch.float64) * mix.kappa[p] ** 0.5 for p in s.params}
            uk = DoubleRotation.side(s.u_blocks, scaled)
            wk = DoubleRotation.side(s.w_blocks, scaled)
            x = mu.to(torch.float64) + wk @ wk.T
            y = mw.to(torch.float64) + uk @ uk.T
            return x.cpu(), y.cpu()
        nm = sub
        mw, mu = self.moments(s, stats, nm)
        uf = DoubleRotation.side(s.u_blocks, values).to(torch.float64)
        wf = DoubleRotation.side(s.w_blocks, values).to(torch.float64)
        x = mu.to(torch.float64) + nm.kappa * wf @ wf.T
        y = mw.to(torch.float64) + nm.kappa * uf @ uf.T
        return x.cpu(), y.cpu()

    def solve(
        self,
        syms: Sequence[DoubleRotation],
        values: Mapping[nn.Parameter, Tensor],
        stats: GradStats,
        nm: NoiseModel,
        names: Mapping[Symmetry, str],
        opts: StepOptions,
    ) -> GroupSolve:
        """G = P^{1/2}, P Y P = X on the common range of X and Y (one rotation).

        With γ per parameter in discrete time, the decay cross term H = 4η²Q(Γθ, ḡ) is not
        covariant, so G is found by a fixed point on the geometric mean (:func:`_mixed_cross`).
        """
        (s,) = syms
        own: RotationSettings = opts.of(self)
        with one_thread():  # d×d algebra: see noetherflow._threads
            x, y = self.xy(s, values, stats, nm)
            cross = _mixed_cross(s, values, stats, nm)
            if cross is not None:
                g, nb, pre, res = _solve_with_cross(x, y, cross, own)
            else:
                g, nb, pre, res = _solve_rotation(x, y, rtol=own.rtol_singular, ridge=own.ridge)
            negative = nb is not None and nb.shape[1] > 0 and _negative(x, y, own.rtol_singular)
        out = GroupSolve(progress=pre if opts.coupled else res, before=pre)
        if nb is not None and nb.shape[1] > 0:
            why = (
                "no gradient noise and no weight-decay term on one side: the width exceeds "
                "what the weights and data span"
            )
            if negative:
                why = (
                    "X or Y has negative eigenvalues: with the momentum cross term "
                    "c_cross·vᵀA∇L the noise term is negative along them, the buffer pushing "
                    "the charge faster than the noise restores it"
                )
            out.reports.append(
                InfinityReport(
                    names[s],
                    nb,
                    f"{nb.shape[1]} of {s.d} hidden directions lie outside the common range "
                    f"of X = M_U + κWWᵀ and Y = M_W + κUᵀU ({why}): their equilibrium is at "
                    "infinity; solved on the rest, those left unmoved",
                )
            )
        out.steps.append((s, g.to(s.params[0].device)))
        out.residual[s] = res
        return out

    @override
    def solve_disjoint(
        self,
        syms: Sequence[DoubleRotation],
        values: Mapping[nn.Parameter, Tensor],
        stats: GradStats,
        nm: NoiseModel,
        names: Mapping[Symmetry, str],
        opts: StepOptions,
        cache: dict[Any, Any] | None = None,
    ) -> GroupSolve:
        """The heads of one layer in one batched geometric mean (kernels/rotation_batch.py)."""
        from noetherflow.kernels.rotation_batch import solve_disjoint

        return solve_disjoint(self, syms, values, stats, nm, names, opts, cache)

    @override
    def act_disjoint_(
        self,
        moves: Sequence[tuple[DoubleRotation, Any]],
        values: Mapping[nn.Parameter, Tensor],
    ) -> None:
        """One batched product per parameter axis (kernels/rotation_batch.py)."""
        from noetherflow.kernels.rotation_batch import act_disjoint_

        act_disjoint_(moves, values)

    @override
    def transport_disjoint_(
        self,
        moves: Sequence[tuple[DoubleRotation, Any]],
        grads: Mapping[nn.Parameter, HeldSamples],
    ) -> None:
        """One batched product per parameter axis (kernels/rotation_batch.py)."""
        from noetherflow.kernels.rotation_batch import transport_disjoint_

        transport_disjoint_(moves, grads)

    @override
    def refresh_(
        self,
        members: Sequence[DoubleRotation],
        samples: Mapping[nn.Parameter, HeldSamples],
        stats: GradStats,
        stale: Mapping[Symmetry, Mapping[nn.Parameter, None]],
        cache: dict[Any, Any],
    ) -> None:
        """Only the stale blocks' moments from the samples (kernels/rotation_batch.py)."""
        from noetherflow.kernels.rotation_batch import refresh_

        refresh_(members, samples, stats, stale, cache)

    @override
    def move_stats_(
        self,
        moves: Sequence[tuple[DoubleRotation, Any]],
        stats: GradStats,
        cache: dict[Any, Any],
    ) -> bool:
        """M_W → GᵀM_WG, M_U → G⁻¹M_UG⁻ᵀ per block (kernels/rotation_batch.py)."""
        from noetherflow.kernels.rotation_batch import move_stats_

        return move_stats_(moves, stats, cache)

    @override
    def compose(self, total: Any, element: Any) -> Any:
        with one_thread():  # a d×d product: see noetherflow._threads
            return total @ element

    def distance(self, s: DoubleRotation, total: Any) -> Tensor:
        """‖log P‖_F with P = GGᵀ, from the eigenvalues alone (P is SPD)."""
        with one_thread():
            p = total @ total.T
            return torch.linalg.eigvalsh((p + p.T) / 2).log().norm()

    def record(self, value: Tensor) -> Tensor:
        """The Frobenius norm of the matrix charge (or flow)."""
        return value.norm()

    def mark_infinity(self, distance: Tensor, report: InfinityReport) -> tuple[Tensor, int]:
        """The distance stays (measured on the finite directions); k directions at infinity."""
        return distance, int(report.direction.shape[1])


register_kernel(DoubleRotation, RotationKernel())

"""The options of :func:`noetherflow.solve_equilibrium`, as one object.

The common call stays short (``solve_equilibrium(syms, stats, lr=η, batch_size=S,
weight_decay=γ)``); everything that tunes the solver goes in ``options=SolveOptions(...)``.
The old loose keywords (``tol=``, ``ridge=`` …) still work for now and warn
(:class:`FutureWarning`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from noetherflow._checks import check_nonnegative, check_positive_int, parse_enum
from noetherflow._deprecate import warn_renamed
from noetherflow.kernels._diag_newton import NewtonMethod

__all__ = ["SolveOptions", "kernel_settings", "resolve_options", "split_options"]


@dataclass(frozen=True)
class SolveOptions:
    """How :func:`noetherflow.solve_equilibrium` solves (defaults: the reference settings).

    Attributes:
        tol: relative flow (|flow| / gross magnitude of its terms) at which to stop.
        max_iter: Newton iterations of the joint diagonal solve (and of a rotation's
            fixed-point iteration with per-parameter decay).
        max_sweeps: block Gauss–Seidel sweeps when symmetries are coupled (chains).
        rtol_singular: eigenvalues of X or Y below this fraction of the largest count as zero;
            those hidden directions have their equilibrium at infinity and are reported.
        ridge: add ``ridge·I`` to X and Y instead (explicit regularisation, reported).
        solver: the linear systems of the joint diagonal Newton solve: ``"dense"`` (the
            Hessian over all generators, Cholesky: O(n²) memory, the reference), ``"cg"``
            (matrix-free preconditioned conjugate gradients on the block-sparse Hessian:
            memory linear in the number of generators) or ``"auto"`` (dense up to 512 free
            generators, else cg). Same stopping criterion, so the same λ* to ``tol``.
        fixed: generators of diagonal symmetries held at given values while the rest are
            solved: symmetry name → λ ``[num_generators]`` (a tensor or sequence), finite
            entries held there (measured from the current θ, like the solution's elements),
            NaN entries free. The flows then vanish on the free generators only (e.g. scale
            invariances clipped by :func:`noetherflow.solve_within_eps`).
        displacement: SGD with momentum: the ``torch.optim.SGD`` whose buffers to read (after
            ``backward``, before ``step``) or a mapping parameter → v = −lr·buffer, for the
            cross term c_cross·vᵀA∇L (docs/concepts/optimizers.md). Without it the term is 0,
            exact only when ⟨vᵀA∇L⟩ = 0.
        kernels: settings for one family alone, per kernel name, e.g.
            ``{"rotation": {"ridge": 1e-8}}`` or ``{"diagonal": {"solver": "cg"}}``: each
            kernel declares the settings its solve reads (``Kernel.solve_options``: diagonal
            tol, max_iter, solver; rotation tol, max_iter, rtol_singular, ridge); the others
            take the shared values above.

    Example:
        >>> import noetherflow as nf
        >>> opts = nf.SolveOptions(tol=1e-10, solver="cg")
        >>> opts.solver, opts.max_sweeps
        (<NewtonMethod.CG: 'cg'>, 200)
        >>> nf.SolveOptions(tol=-1.0)
        Traceback (most recent call last):
        ...
        ValueError: tol=-1.0 must be >= 0 (the solver's tolerance).
    """

    tol: float = 1e-12
    max_iter: int = 100
    max_sweeps: int = 200
    rtol_singular: float = 1e-10
    ridge: float | None = None
    solver: str | NewtonMethod = "auto"
    fixed: Mapping[str, Any] | None = None
    displacement: Any = None
    kernels: Mapping[str, Mapping[str, Any]] | None = None

    def __post_init__(self) -> None:
        put = object.__setattr__  # frozen: the checked values replace the given ones
        put(self, "tol", check_nonnegative(self.tol, "tol", "the solver's tolerance"))
        put(
            self,
            "rtol_singular",
            check_nonnegative(self.rtol_singular, "rtol_singular", "relative eigenvalue cut"),
        )
        put(self, "max_iter", check_positive_int(self.max_iter, "max_iter", "Newton iterations"))
        put(
            self,
            "max_sweeps",
            check_positive_int(self.max_sweeps, "max_sweeps", "block sweeps of coupled sets"),
        )
        if self.ridge is not None:
            put(self, "ridge", check_nonnegative(self.ridge, "ridge", "None or a Tikhonov ridge"))
        method = parse_enum(
            NewtonMethod,
            self.solver,
            "solver",
            "'auto' (by size), 'dense' (dense Hessian, Cholesky) or 'cg' (matrix-free conjugate "
            "gradients)",
        )
        put(self, "solver", method)
        if self.kernels is not None and not (
            isinstance(self.kernels, Mapping)
            and all(isinstance(v, Mapping) for v in self.kernels.values())
        ):
            raise TypeError(
                f"SolveOptions: kernels={self.kernels!r}; expected a mapping kernel name → "
                "its settings, e.g. {'rotation': {'ridge': 1e-8}}."
            )

    def replace(self, **changes: Any) -> SolveOptions:
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)


_NAMES = frozenset(f.name for f in dataclasses.fields(SolveOptions))


def resolve_options(
    options: SolveOptions | None, legacy: Mapping[str, Any], who: str
) -> SolveOptions:
    """``options``, or the old loose keywords ``legacy`` as options (with a FutureWarning).

    Raises:
        TypeError: an unknown keyword, ``options`` not a :class:`SolveOptions`, or both forms.
    """
    unknown = sorted(set(legacy) - _NAMES)
    if unknown:
        raise TypeError(
            f"{who}() got unexpected keyword arguments {unknown}; the solver's options are "
            f"the fields of nf.SolveOptions ({', '.join(sorted(_NAMES))})."
        )
    if options is not None and not isinstance(options, SolveOptions):
        raise TypeError(
            f"{who}: options is a {type(options).__name__}; expected nf.SolveOptions(...) "
            "(e.g. options=nf.SolveOptions(tol=1e-10, solver='cg'))."
        )
    if not legacy:
        return SolveOptions() if options is None else options
    given = ", ".join(f"{k}=..." for k in legacy)
    if options is not None:
        raise TypeError(
            f"{who}: got both options= and the keywords {given}; put them in options "
            f"(options.replace({given}))."
        )
    warn_renamed(f"{who}({given})", f"pass options=nf.SolveOptions({given})", stacklevel=3)
    return SolveOptions(**legacy)


def split_options(
    kwargs: Mapping[str, Any], who: str, *, warn: bool = False
) -> tuple[dict[str, Any], SolveOptions]:
    """Keyword arguments of :func:`~noetherflow.solve_equilibrium` → (the others, options).

    For the tools that forward a mapping of them (the teleporter's ``solver_kwargs``, the
    monitor's solver options, :func:`~noetherflow.solve_within_eps`): ``options=`` and the
    option names are taken out; ``warn``: the loose option names warn as in
    :func:`resolve_options` (a public call's keywords), else they are the tool's own spelling.
    """
    rest = dict(kwargs)
    options = rest.pop("options", None)
    legacy = {k: rest.pop(k) for k in list(rest) if k in _NAMES}
    if legacy and options is None and not warn:
        return rest, SolveOptions(**legacy)
    return rest, resolve_options(options, legacy, who)  # both forms: a TypeError


def kernel_settings(options: SolveOptions, kernels: Sequence[Any]) -> dict[str, Any]:
    """Each kernel's own settings in a solve with ``options``: kernel name → its settings.

    An instance of the kernel's ``settings`` class (``Kernel.settings``) per kernel of the
    solve: the shared values of ``options`` for its fields, ``options.kernels[name]`` over
    them (checked as the shared ones are).

    Raises:
        ValueError: a kernel name that solves no symmetry of the set, or a bad value.
        TypeError: a setting the kernel does not read (its ``solve_options``).
    """
    by_name = {k.name: k for k in kernels}
    own = dict(options.kernels or {})
    for name, given in own.items():
        k = by_name.get(name)
        if k is None:
            raise ValueError(
                f"SolveOptions(kernels=...): no symmetry of this set is solved by the kernel "
                f"{name!r}; the kernels here are {sorted(by_name)}."
            )
        extra = sorted(set(given) - set(k.solve_options))
        if extra:
            raise TypeError(
                f"SolveOptions(kernels={{{name!r}: ...}}): {extra} are not settings of the "
                f"{name} kernel; it reads {sorted(k.solve_options)}."
            )
    out: dict[str, Any] = {}
    for name, k in by_name.items():
        given = own.get(name, {})
        checked = SolveOptions(**given)  # the values checked as the shared ones are
        out[name] = k.settings(
            **{f: getattr(checked if f in given else options, f) for f in k.solve_options}
        )
    return out

"""The monitor's options and their checks (one place for the error messages)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from enum import Enum
from typing import Any

from noetherflow._checks import check_nonnegative_int
from noetherflow._deprecate import warn_renamed
from noetherflow.monitor.history import FORMATS
from noetherflow.solve_options import SolveOptions, split_options

__all__ = [
    "DistanceMode",
    "DistanceOptions",
    "LogOptions",
    "SharpnessOptions",
    "check_sweeps",
    "monitor_options",
    "multiple",
    "take_options",
]


@dataclass(frozen=True)
class SharpnessOptions:
    """Sharpness measured by the monitor (see :func:`noetherflow.sharpness.sharpness`).

    Attributes:
        n_samples: Rademacher vectors of the Hutchinson trace.
        max_iter, tol: power iteration budget and relative tolerance on the eigenvalue.
        seed: seed of the random vectors (the same at every record: common random numbers).
        every: measure every this many steps (a multiple of the monitor's ``every``);
            ``None`` measures at every record.
        method: ``"auto"``, ``"fwd-rev"`` or ``"rev-rev"`` Hessian-vector products.
    """

    n_samples: int = 10
    max_iter: int = 20
    tol: float = 1e-3
    seed: int = 0
    every: int | None = None
    method: str = "auto"


class DistanceMode(str, Enum):
    """How the monitor obtains ``distance/*`` between full solves.

    ``"track"``: a full solve every ``solve_every`` steps (and whenever the update below
    leaves its range), a first-order update from the last full solve at the other distance
    records (:mod:`noetherflow.monitor.first_order`). ``"solve"``: a full (warm-started) solve
    at every distance record.
    """

    TRACK = "track"
    SOLVE = "solve"


def parse_distance_mode(value: str | DistanceMode) -> DistanceMode:
    """The :class:`DistanceMode` of ``value``; a clear error for anything else."""
    try:
        return DistanceMode(value)
    except ValueError:
        raise ValueError(
            f"distance_mode={value!r} is not supported; expected one of "
            f"{[m.value for m in DistanceMode]}."
        ) from None


def multiple(name: str, value: int | None, every: int) -> int:
    """``value`` checked to be a positive multiple of ``every`` (``None``: ``every`` itself)."""
    if value is None:
        return every
    if int(value) != value or value < 1 or value % every:
        raise ValueError(
            f"{name}={value!r} must be a positive multiple of every={every} (records happen "
            "only every `every` steps)."
        )
    return int(value)


@dataclass(frozen=True)
class DistanceOptions:
    """How the monitor records ``distance/*`` (``NoetherMonitor(distance=DistanceOptions(...))``).

    Attributes:
        every: record the distance every this many steps (a multiple of the monitor's
            ``every``; default 10·``every``); in between the ``distance/*`` entries are NaN.
        mode: ``"track"`` (default): a full solve every ``solve_every`` steps and an
            incremental solve from it at the other distance records (scaled chord steps with
            the last full solve's factored Hessian, until the correction is at most ``tol``;
            ``distance_exact`` is 0 on those rows; :mod:`noetherflow.monitor.first_order`);
            ``"solve"``: a full solve every time (:class:`DistanceMode`).
        solve_every: steps between full solves in ``"track"`` mode (a multiple of ``every``;
            default 10·``every``). A full solve also happens when η or γ moved by more than 5%,
            or when the incremental solve does not converge in 8 steps.
        tol: the chord correction (in units of λ, ‖δλ‖∞) at which the incremental solve stops.
        solver: the :class:`~noetherflow.SolveOptions` of the full solves.
        warm_start: start each full solve from the last converged one (same answer, fewer
            Newton iterations); ``False`` solves from the identity every time.
        sweeps: coupled sweeps (e.g. attention rotations) per distance record (``None``:
            until converged); ``distance_converged`` = 0 marks provisional rows.
    """

    every: int | None = None
    mode: str | DistanceMode = "track"
    solve_every: int | None = None
    tol: float = 1e-4
    solver: SolveOptions | None = None
    warm_start: bool = True
    sweeps: int | None = 1
    # further settings of the solves between full solves go here

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", parse_distance_mode(self.mode))
        check_sweeps(self.sweeps)
        if not (float(self.tol) >= 0):
            raise ValueError(f"DistanceOptions: tol={self.tol!r} must be a number >= 0.")
        if self.solver is not None and not isinstance(self.solver, SolveOptions):
            raise TypeError(
                f"DistanceOptions: solver is a {type(self.solver).__name__}; expected "
                "nf.SolveOptions(...) (the options of the full solves)."
            )


@dataclass(frozen=True)
class LogOptions:
    """Where the monitor writes (``NoetherMonitor(logging=LogOptions(...))``).

    Attributes:
        log_dir: directory for ``history.csv``/``history.jsonl``/``monitor.json`` (and
            TensorBoard); ``None`` keeps the history in memory only. Existing history files
            there are replaced.
        formats: which of ``"csv"``, ``"jsonl"`` to write.
        tensorboard: ``None`` (use it when installed and ``log_dir`` is set), ``False``,
            ``True`` (required), or a writer object with ``add_scalar``/``add_histogram``.
        progress: ``None`` (a rich progress bar when stdout is a terminal), ``True``, ``False``.
        total: number of steps, for the progress bar.
    """

    log_dir: str | os.PathLike[str] | None = None
    formats: Sequence[str] = FORMATS
    tensorboard: Any = None
    progress: bool | None = None
    total: int | None = None

    def __post_init__(self) -> None:
        if self.log_dir is not None and not isinstance(self.log_dir, str | os.PathLike):
            raise TypeError(
                f"LogOptions: log_dir={self.log_dir!r} is a {type(self.log_dir).__name__}; "
                "expected a directory path (str or pathlib.Path) or None (in memory only)."
            )
        tb = self.tensorboard
        if not (tb is None or isinstance(tb, bool) or callable(getattr(tb, "add_scalar", None))):
            raise TypeError(
                f"LogOptions: tensorboard={tb!r}; expected None (when installed and log_dir is "
                "set), True, False, or a writer object with add_scalar/add_histogram (e.g. a "
                "torch.utils.tensorboard.SummaryWriter)."
            )
        if self.progress is not None and not isinstance(self.progress, bool):
            raise TypeError(
                f"LogOptions: progress={self.progress!r}; expected True, False or None (a bar "
                "when stdout is a terminal)."
            )
        if self.total is not None:
            check_nonnegative_int(self.total, "total", "steps, for the progress bar")
        bad = [f for f in self.formats if f not in FORMATS]
        if bad:
            raise ValueError(
                f"formats={list(self.formats)!r}: unknown {bad}; expected a subset of {FORMATS}."
            )
        object.__setattr__(self, "formats", tuple(self.formats))


# the monitor's old loose keywords → (option object, field)
_OLD = {
    "distance_every": ("distance", "every"),
    "distance_mode": ("distance", "mode"),
    "solve_every": ("distance", "solve_every"),
    "distance_tol": ("distance", "tol"),
    "distance_sweeps": ("distance", "sweeps"),
    "solver_options": ("distance", "solver"),
    **{f.name: ("logging", f.name) for f in fields(LogOptions)},
}
_LOG_FIELDS = frozenset(f.name for f in fields(LogOptions))


def monitor_options(
    distance: bool | DistanceOptions,
    logging: LogOptions | None,
    old: Mapping[str, Any],
    who: str = "NoetherMonitor",
    *,
    stacklevel: int = 3,
) -> tuple[DistanceOptions | None, LogOptions]:
    """The monitor's distance options (``None``: off) and log options.

    ``old``: the loose keywords of before the option objects (``distance_every=``,
    ``log_dir=``, ``progress=`` …), still accepted as the fields they name, with a
    :class:`FutureWarning` naming the new spelling (at ``stacklevel`` from this function's
    caller); given beside the option object they belong to, or unknown, they are a
    ``TypeError`` naming the field.
    """
    unknown = sorted(set(old) - set(_OLD))
    if unknown:
        raise TypeError(
            f"{who}() got unexpected keyword arguments {unknown}; the distance "
            "settings are fields of distance=nf.DistanceOptions(...), the output ones of "
            "logging=nf.LogOptions(...)."
        )
    if not isinstance(distance, bool | DistanceOptions):
        raise TypeError(
            f"{who}: distance={distance!r}; expected True, False or nf.DistanceOptions(...)."
        )
    if logging is not None and not isinstance(logging, LogOptions):
        raise TypeError(
            f"{who}: logging is a {type(logging).__name__}; expected nf.LogOptions(...)."
        )
    moved: dict[str, dict[str, Any]] = {"distance": {}, "logging": {}}
    for name, value in old.items():
        where, field = _OLD[name]
        given = distance if where == "distance" else logging
        if isinstance(given, DistanceOptions | LogOptions):
            kind = type(given).__name__
            raise TypeError(
                f"{who}: {name}= given beside {where}={kind}(...); set it there: "
                f"{where}={kind}({field}=...)."
            )
        if name == "solver_options":
            value, warm = _solve_options(value)
            if not warm:
                moved[where]["warm_start"] = False
        moved[where][field] = value
    if old:
        warn_renamed(f"{who}({_given(old)})", f"pass {_new_spelling(old)}", stacklevel=stacklevel)
    dist = distance if isinstance(distance, DistanceOptions) else DistanceOptions()
    if moved["distance"]:
        dist = replace(dist, **moved["distance"])
    log = logging if logging is not None else LogOptions(**moved["logging"])
    return (None if distance is False else dist), log


def take_options(kw: dict[str, Any], who: str) -> tuple[DistanceOptions | bool, LogOptions]:
    """Take ``distance=``, ``logging=`` and the old loose keywords out of ``kw``.

    For the integrations, which fill in the log settings they own (the progress bar, the
    total, TensorBoard) before they build the monitor; called in their ``__init__``, so that
    the old keywords warn (as the monitor's do) at the line that built the callback.
    Returns ``(distance, logging)`` to pass on to :class:`~noetherflow.NoetherMonitor`.
    """
    old = {k: kw.pop(k) for k in list(kw) if k in _OLD}
    dist, log = monitor_options(
        kw.pop("distance", True), kw.pop("logging", None), old, who, stacklevel=4
    )
    return (False if dist is None else dist), log


def _given(old: Mapping[str, Any]) -> str:
    """The old keywords as written in the call: ``"distance_every=..., progress=..."``."""
    return ", ".join(f"{k}=..." for k in old)


def _new_spelling(old: Mapping[str, Any]) -> str:
    """The option objects that replace the old keywords ``old`` (for the FutureWarning)."""
    parts = []
    for where, kind in (("distance", "DistanceOptions"), ("logging", "LogOptions")):
        names = [_OLD[k][1] for k in old if _OLD[k][0] == where]
        if names:
            inner = ", ".join(
                "solver=nf.SolveOptions(...)" if n == "solver" else f"{n}=..." for n in names
            )
            parts.append(f"{where}=nf.{kind}({inner})")
    return ", ".join(parts)


def _solve_options(value: Any) -> tuple[SolveOptions | None, bool]:
    """The old ``solver_options`` mapping as (SolveOptions, warm start)."""
    if value is None or isinstance(value, SolveOptions):
        return value, True
    rest, opts = split_options(value, "NoetherMonitor(solver_options=...)")
    warm = rest.pop("init", True) is not None
    if rest:
        raise TypeError(
            f"NoetherMonitor(solver_options=...): {sorted(rest)} are not solver options; "
            "expected fields of nf.SolveOptions."
        )
    return opts, warm


def check_sweeps(value: int | None) -> int | None:
    """``distance_sweeps`` checked: a positive integer, or ``None`` (sweep until converged)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"distance_sweeps={value!r} must be a positive integer (coupled sweeps per distance "
            "record) or None (sweep until converged)."
        )
    return value

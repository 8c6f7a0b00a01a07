"""The experiment contract: claims, the module protocol, running, parallelism, seeding.

An experiment is a module (or any object with the same attributes) exposing

``Config``
    a dataclass holding every setting, with defaults reproducing the paper, and a
    ``quick()`` classmethod returning shrunk sizes (or, alternatively, a ``quick: bool``
    field). Its docstring states the choices and why.
``run(cfg, seed, out_dir) -> dict``
    does the work; returns a dict with a ``"series"`` entry (the numbers behind each plot)
    plus any raw results (everything returned is written to metrics.json, so keep it small).
``claims(results, cfg) -> list[Claim]``
    measures the paper's quantitative statements on ``results``.
``plot(results, cfg, out_dir) -> list[Path]``
    writes PNG figure(s) into ``out_dir`` (use :func:`save_figure`) and returns their paths.

and optionally ``DESCRIPTION: str`` (otherwise the first docstring line is used).

:func:`run_experiment` runs one experiment, never raises for an experiment's failure
(the traceback is recorded in metrics.json), and writes metrics.json atomically.
:func:`run_experiments` runs several, optionally in parallel worker processes.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import enum
import hashlib
import importlib
import math
import multiprocessing
import platform
import random
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import numpy as np

from noetherflow._io import atomic_write_bytes, atomic_write_json, to_jsonable

__all__ = [
    "METRICS_FILE",
    "Claim",
    "Divergence",
    "ExperimentModule",
    "Op",
    "Status",
    "default_jobs",
    "derive_seed",
    "evaluate",
    "find_divergence",
    "load_target",
    "make_config",
    "parallel_map",
    "run_experiment",
    "run_experiments",
    "save_figure",
    "seed_everything",
]

METRICS_FILE = "metrics.json"

T = TypeVar("T")
R = TypeVar("R")


# --------------------------------------------------------------------------------------
# Claims
# --------------------------------------------------------------------------------------


class Op(str, enum.Enum):
    """Comparison of a claim: ``value <op> threshold``; ``abs<`` compares ``|value|``."""

    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    EQ = "=="
    NE = "!="
    ABS_LT = "abs<"
    ABS_LE = "abs<="

    @classmethod
    def parse(cls, op: Op | str) -> Op:
        try:
            return cls(op)
        except ValueError:
            valid = ", ".join(repr(o.value) for o in cls)
            raise ValueError(
                f"unknown claim op {op!r}; expected one of {valid} (e.g. op='<')"
            ) from None


def _as_float(value: Any) -> float:
    if value is None:
        return math.nan
    if isinstance(value, str):  # "inf" / "-inf" as written by to_jsonable
        try:
            return float(value)
        except ValueError:
            return math.nan
    return float(value)


def evaluate(value: Any, op: Op | str, threshold: Any) -> bool:
    """Whether ``value <op> threshold`` holds. A missing or NaN value never holds."""
    o = Op.parse(op)
    v, t = _as_float(value), _as_float(threshold)
    if math.isnan(v) or math.isnan(t):
        return False
    if o is Op.LT:
        return v < t
    if o is Op.LE:
        return v <= t
    if o is Op.GT:
        return v > t
    if o is Op.GE:
        return v >= t
    if o is Op.EQ:
        return v == t
    if o is Op.NE:
        return v != t
    if o is Op.ABS_LT:
        return abs(v) < t
    return abs(v) <= t  # Op.ABS_LE


@dataclass(frozen=True)
class Claim:
    """A quantitative statement of the paper, measured: ``value <op> threshold``.

    ``holds`` is computed from value, op and threshold; it cannot be passed in.
    Thresholds come from the paper or the issue, never tuned after the fact; a failing
    claim is reported as failing, not removed. ``note`` carries context (e.g. divergence).
    """

    id: str
    statement: str
    value: float | int | bool | None
    op: Op | str  # a str is parsed into Op; after construction it is always an Op
    threshold: float | int | bool
    note: str = ""
    holds: bool = field(init=False)

    def __post_init__(self) -> None:
        op = Op.parse(self.op)
        value = self.value
        if value is not None and not isinstance(value, bool | int | float):
            value = float(value)  # numpy / torch scalars
        elif isinstance(value, float) and not isinstance(value, bool):
            value = float(value)
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "holds", evaluate(value, op, self.threshold))

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "statement": self.statement,
            "value": to_jsonable(self.value),
            "op": Op.parse(self.op).value,
            "threshold": to_jsonable(self.threshold),
            "holds": self.holds,
            "note": self.note,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Claim:
        """Rebuild a claim from metrics.json (``holds`` is recomputed)."""
        value = d.get("value")
        return cls(
            id=str(d["id"]),
            statement=str(d.get("statement", "")),
            value=None if value is None else _as_float(value),
            op=Op.parse(d["op"]),
            threshold=_as_float(d["threshold"]),
            note=str(d.get("note", "")),
        )


# --------------------------------------------------------------------------------------
# Module protocol, config, loading
# --------------------------------------------------------------------------------------


class ExperimentModule(Protocol):
    """What an experiment module exposes (see the module docstring)."""

    Config: type[Any]

    def run(self, cfg: Any, seed: int, out_dir: Path) -> dict[str, Any]: ...

    def claims(self, results: dict[str, Any], cfg: Any) -> list[Claim]: ...

    def plot(self, results: dict[str, Any], cfg: Any, out_dir: Path) -> list[Path]: ...


_REQUIRED = ("Config", "run", "claims", "plot")


def load_target(target: str) -> ExperimentModule:
    """Import ``"pkg.module"`` or ``"pkg.module:attr"`` and check it implements the contract."""
    mod_name, _, attr = target.partition(":")
    obj: Any = importlib.import_module(mod_name)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    missing = [name for name in _REQUIRED if not hasattr(obj, name)]
    if missing:
        raise TypeError(
            f"experiment {target!r} lacks {', '.join(missing)}; an experiment must expose "
            f"Config, run(cfg, seed, out_dir), claims(results, cfg) and "
            f"plot(results, cfg, out_dir) (see noetherflow.experiments._base)"
        )
    return cast(ExperimentModule, obj)


def describe_target(obj: Any) -> str:
    """One-line description: ``DESCRIPTION`` or the first line of the docstring."""
    desc = getattr(obj, "DESCRIPTION", None)
    if not desc:
        doc = (getattr(obj, "__doc__", None) or "").strip()
        desc = doc.splitlines()[0] if doc else ""
    return str(desc).strip()


def make_config(exp: ExperimentModule, *, quick: bool) -> Any:
    """``Config.quick()`` / ``Config(quick=True)`` when ``quick``, else ``Config()``."""
    cfg_cls = exp.Config
    names = (
        {f.name for f in dataclasses.fields(cfg_cls)}
        if dataclasses.is_dataclass(cfg_cls)
        else set()
    )
    if "quick" in names:
        return cfg_cls(quick=quick)
    if quick:
        factory = getattr(cfg_cls, "quick", None)
        if not callable(factory):
            raise TypeError(
                f"{cfg_cls.__qualname__} has neither a quick() classmethod nor a `quick` field; "
                f"add `@classmethod def quick(cls): return cls(<shrunk sizes>)`"
            )
        return factory()
    return cfg_cls()


# --------------------------------------------------------------------------------------
# Seeding, divergence, figures
# --------------------------------------------------------------------------------------


def derive_seed(seed: int, *keys: object) -> int:
    """A deterministic 63-bit child seed from ``seed`` and any keys (e.g. sweep values)."""
    h = hashlib.blake2b(repr((int(seed), *keys)).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little") >> 1


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global generators."""
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 - seeding the legacy global state on purpose
    torch.manual_seed(seed)


@contextmanager
def _preserved_global_rng() -> Iterator[None]:
    import torch

    py, npy, th = random.getstate(), np.random.get_state(), torch.get_rng_state()  # noqa: NPY002
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)  # noqa: NPY002
        torch.set_rng_state(th)


@contextmanager
def _torch_threads(n: int | None) -> Iterator[None]:
    import torch

    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


@dataclass(frozen=True)
class Divergence:
    """Where a series first became non-finite. ``diverged`` is False if it never did."""

    diverged: bool
    step: int | None
    last_finite_step: int | None
    last_finite_value: float | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def find_divergence(values: Sequence[float] | np.ndarray, *, limit: float = math.inf) -> Divergence:
    """First index where ``values`` is NaN/inf or ``|value| > limit`` (a diverging run is data).

    Training loops should stop at that step and record this (step, last finite loss) in
    their results rather than raise.
    """
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    bad = ~np.isfinite(arr) | (np.abs(arr) > limit)
    if not bad.any():
        last = len(arr) - 1 if len(arr) else None
        return Divergence(False, None, last, None if last is None else float(arr[last]))
    step = int(np.argmax(bad))
    last_step = step - 1 if step > 0 else None
    return Divergence(True, step, last_step, None if last_step is None else float(arr[last_step]))


def save_figure(fig: Any, path: str | Path, *, dpi: int = 120) -> Path:
    """Save a matplotlib figure as PNG atomically; returns the path.

    Create figures with ``matplotlib.figure.Figure(...)`` (no pyplot, no global backend
    state, safe in worker processes).
    """
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return atomic_write_bytes(path, buf.getvalue())


# --------------------------------------------------------------------------------------
# Parallelism
# --------------------------------------------------------------------------------------

_DEFAULT_JOBS = 1
_BASE_SEED = 0
_TORCH_THREADS = 1


def default_jobs() -> int:
    """Worker count parallel_map uses when ``jobs`` is not given (set by the harness)."""
    return _DEFAULT_JOBS


def _configure_process(*, jobs: int, seed: int, torch_threads: int) -> None:
    global _DEFAULT_JOBS, _BASE_SEED, _TORCH_THREADS
    _DEFAULT_JOBS, _BASE_SEED, _TORCH_THREADS = max(1, jobs), seed, max(1, torch_threads)


def _init_worker(jobs: int, seed: int, torch_threads: int) -> None:
    import torch

    torch.set_num_threads(max(1, torch_threads))
    _configure_process(jobs=jobs, seed=seed, torch_threads=torch_threads)


def _call_seeded(fn: Callable[[T], R], item: T, seed: int) -> R:
    seed_everything(seed)
    return fn(item)


def parallel_map(
    fn: Callable[[T], R],
    items: Iterable[T],
    *,
    jobs: int | None = None,
    seed: int | None = None,
) -> list[R]:
    """``[fn(x) for x in items]``, in order, optionally in spawned worker processes.

    ``fn`` must be picklable (a module-level function; use ``functools.partial`` to bind
    the config). Each call runs with the global RNGs of Python, numpy and torch seeded by
    ``derive_seed(seed, index)`` (``seed`` defaults to the experiment's seed), in both
    the sequential and the parallel path, and each worker uses the harness's torch thread
    count (1 by default), so the results do not depend on ``jobs``. ``jobs`` defaults to
    the budget the harness gives the experiment (``--jobs``); ``jobs=1`` runs in-process
    and leaves the caller's global RNG state untouched. Prefer explicit generators seeded
    from the item over the global RNG.
    """
    seq = list(items)
    n_jobs = default_jobs() if jobs is None else int(jobs)
    if n_jobs < 1:
        raise ValueError(f"parallel_map: jobs={jobs!r}; expected an int >= 1 (or None)")
    base = _BASE_SEED if seed is None else int(seed)
    seeds = [derive_seed(base, "parallel_map", i) for i in range(len(seq))]
    if n_jobs == 1 or len(seq) <= 1:
        out: list[R] = []
        with _preserved_global_rng(), _torch_threads(_TORCH_THREADS):
            for item, s in zip(seq, seeds, strict=True):
                out.append(_call_seeded(fn, item, s))
        return out
    ctx = multiprocessing.get_context("spawn")
    workers = min(n_jobs, len(seq))
    with cf.ProcessPoolExecutor(
        max_workers=workers,
        mp_context=ctx,
        initializer=_init_worker,
        initargs=(1, base, _TORCH_THREADS),
    ) as ex:
        futures = [ex.submit(_call_seeded, fn, item, s) for item, s in zip(seq, seeds, strict=True)]
        return [f.result() for f in futures]


# --------------------------------------------------------------------------------------
# Running experiments
# --------------------------------------------------------------------------------------


class Status(str, enum.Enum):
    OK = "ok"
    ERROR = "error"


def _error_record(stage: str, exc: BaseException) -> dict[str, Any]:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return {
        "stage": stage,
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(tb[-12:]),
    }


def _environment(*, jobs: int, torch_threads: int) -> dict[str, Any]:
    import torch

    from noetherflow import __name__ as pkg

    try:
        from importlib.metadata import version

        nf_version = version(pkg)
    except Exception:  # pragma: no cover - not installed
        nf_version = "unknown"
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "noetherflow": nf_version,
        "jobs": jobs,
        "torch_threads": torch_threads,
    }


def run_experiment(
    exp_id: str,
    target: str,
    *,
    quick: bool = False,
    seed: int = 0,
    out_dir: str | Path,
    jobs: int = 1,
    torch_threads: int = 1,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run one experiment into ``out_dir/<exp_id>/`` and return its metrics dict.

    ``overrides`` replaces Config fields by name where the experiment's Config has them
    (e.g. ``{"mnist_dir": ...}``); other experiments ignore them.

    Never raises for a failure inside the experiment: the traceback summary is stored
    under ``"error"`` (with the stage: load/config/run/claims/plot) and ``status`` is
    ``"error"``; whatever was computed before the failure is kept. ``jobs`` is the budget
    :func:`parallel_map` uses inside the experiment.
    """
    exp_dir = Path(out_dir) / exp_id
    exp_dir.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {
        "experiment": exp_id,
        "description": "",
        "target": target,
        "quick": bool(quick),
        "seed": int(seed),
        "status": Status.OK.value,
        "elapsed_s": 0.0,
        "config": {},
        "claims": [],
        "series": {},
        "results": {},
        "figures": [],
        "error": None,
        "environment": _environment(jobs=jobs, torch_threads=torch_threads),
    }
    _configure_process(jobs=jobs, seed=seed, torch_threads=torch_threads)
    t0 = time.perf_counter()
    stage = "load"
    try:
        with _torch_threads(torch_threads):
            exp = load_target(target)
            record["description"] = describe_target(exp)
            stage = "config"
            cfg = make_config(exp, quick=quick)
            if overrides and dataclasses.is_dataclass(cfg):
                names = {f.name for f in dataclasses.fields(cfg)}
                keep = {k: v for k, v in overrides.items() if k in names}
                cfg = dataclasses.replace(cfg, **keep)  # type: ignore[type-var]
            record["config"] = to_jsonable(cfg)
            stage = "run"
            seed_everything(seed)
            results = exp.run(cfg, seed, exp_dir)
            if not isinstance(results, dict):
                raise TypeError(
                    f"run() returned {type(results).__name__}; expected a dict with a "
                    f"'series' entry and raw results"
                )
            record["series"] = to_jsonable(results.get("series", {}))
            record["results"] = to_jsonable({k: v for k, v in results.items() if k != "series"})
            stage = "claims"
            claims = list(exp.claims(results, cfg))
            for c in claims:
                if not isinstance(c, Claim):
                    raise TypeError(f"claims() returned {type(c).__name__}; expected Claim")
            ids = [c.id for c in claims]
            dup = sorted({i for i in ids if ids.count(i) > 1})
            if dup:
                raise ValueError(f"duplicate claim ids {dup}; claim ids must be unique")
            record["claims"] = [c.to_dict() for c in claims]
            stage = "plot"
            paths = exp.plot(results, cfg, exp_dir) or []
            record["figures"] = [_relative_figure(p, exp_dir) for p in paths]
    except Exception as exc:
        record["status"] = Status.ERROR.value
        record["error"] = _error_record(stage, exc)
    record["elapsed_s"] = round(time.perf_counter() - t0, 4)
    atomic_write_json(exp_dir / METRICS_FILE, record)
    return record


def _relative_figure(p: str | Path, exp_dir: Path) -> str:
    # plot() receives exp_dir as given (possibly relative to the working directory), so a
    # relative path it returns is usually exp_dir/name already; a bare name is taken relative
    # to exp_dir. Joining exp_dir twice lost every figure of `--out results`.
    path = Path(p)
    root = exp_dir.resolve()
    if not path.is_absolute():
        as_written = path.resolve()
        path = as_written if as_written.is_relative_to(root) else exp_dir / path
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        raise ValueError(
            f"plot() returned {str(p)!r}, outside the experiment directory {str(exp_dir)!r}; "
            f"write figures into the out_dir passed to plot()"
        ) from None


def _crash_record(
    exp_id: str, target: str, *, quick: bool, seed: int, exc: BaseException
) -> dict[str, Any]:
    rec = {
        "experiment": exp_id,
        "description": "",
        "target": target,
        "quick": quick,
        "seed": seed,
        "status": Status.ERROR.value,
        "elapsed_s": 0.0,
        "config": {},
        "claims": [],
        "series": {},
        "results": {},
        "figures": [],
        "error": _error_record("worker", exc),
    }
    return rec


def run_experiments(
    specs: Sequence[tuple[str, str]],
    *,
    quick: bool = False,
    seed: int = 0,
    out_dir: str | Path,
    jobs: int = 1,
    torch_threads: int = 1,
    on_start: Callable[[str], None] | None = None,
    on_done: Callable[[str, dict[str, Any]], None] | None = None,
    overrides: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Run ``specs`` = [(id, import target), ...]; returns metrics dicts in the given order.

    With ``jobs > 1`` experiments run in ``min(jobs, len(specs))`` spawned worker
    processes, and each experiment gets ``jobs // workers`` for its own parallel_map.
    A worker that dies is recorded as an error for its experiment; the others still run.
    """
    if jobs < 1:
        raise ValueError(f"jobs={jobs!r}; expected an int >= 1 (e.g. --jobs 4)")
    if torch_threads < 1:
        raise ValueError(f"torch_threads={torch_threads!r}; expected an int >= 1")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    outer = min(jobs, len(specs)) if specs else 1
    inner = max(1, jobs // outer)
    if outer <= 1:
        for exp_id, target in specs:
            if on_start:
                on_start(exp_id)
            rec = run_experiment(
                exp_id, target, quick=quick, seed=seed, out_dir=out, jobs=inner,
                torch_threads=torch_threads, overrides=overrides,
            )  # fmt: skip
            results[exp_id] = rec
            if on_done:
                on_done(exp_id, rec)
        return [results[e] for e, _ in specs]
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(
        max_workers=outer,
        mp_context=ctx,
        initializer=_init_worker,
        initargs=(inner, seed, torch_threads),
    ) as ex:
        futures: dict[cf.Future[dict[str, Any]], tuple[str, str]] = {}
        for exp_id, target in specs:
            fut = ex.submit(
                run_experiment, exp_id, target, quick=quick, seed=seed, out_dir=out,
                jobs=inner, torch_threads=torch_threads, overrides=overrides,
            )  # fmt: skip
            futures[fut] = (exp_id, target)
            if on_start:
                on_start(exp_id)
        for fut in cf.as_completed(futures):
            exp_id, target = futures[fut]
            try:
                rec = fut.result()
            except Exception as exc:  # worker died (e.g. killed, out of memory)
                rec = _crash_record(exp_id, target, quick=quick, seed=seed, exc=exc)
                atomic_write_json(out / exp_id / METRICS_FILE, rec)
            results[exp_id] = rec
            if on_done:
                on_done(exp_id, rec)
    return [results[e] for e, _ in specs]

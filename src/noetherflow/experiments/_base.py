"""The experiment contract and the runner.

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

and optionally, for the reproduction report:

``DESCRIPTION: str``
    one line (otherwise the first docstring line is used);
``PAPER: str``
    the paper's statement this experiment checks, with its section/figure/equation;
``KIND: str``
    the :class:`~noetherflow.experiments._claims.Kind` of the claims that name none
    (``"beyond"`` for an experiment beyond the paper; default ``"paper"``);
``PAPER_ORDER: float``
    its position in the paper (2.0 for Fig. 2, 5.4 for Thm 5.4); the report is sorted by it
    (experiments without it go last, then by id);
``NOTES: str``
    honest history: the settings tried and what they gave, rendered in the report. The
    built-in experiments keep it as data beside the module, ``notes/<module>.md`` (package
    data, read by :func:`notes_of`), not as a string in code;
``setup(cfg) -> list[dict]``
    one row ``{"quantity", "paper", "ours", "why"}`` (all str) per deviation from the paper's
    setup (η, S, γ, sizes, data, steps, schedule, loss convention, seeds), stored as
    ``metrics.json["setup"]``.

:func:`run_experiment` runs one experiment, never raises for an experiment's failure (the
stage and traceback are recorded in metrics.json), and writes metrics.json atomically from
one :class:`Record`. :func:`run_experiments` runs several, optionally in worker processes.
Claims live in :mod:`._claims`, seeding and the process pool in :mod:`._parallel`, the
figure helper in :mod:`._helpers`; divergence is :mod:`noetherflow._divergence`.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import enum
import importlib
import math
import multiprocessing
import os
import platform
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np

from noetherflow._io import atomic_write_json, to_jsonable
from noetherflow.experiments._claims import Claim, Kind, Op, evaluate
from noetherflow.experiments._helpers import save_figure
from noetherflow.experiments._parallel import (
    RunContext,
    default_jobs,
    derive_seed,
    init_worker,
    parallel_map,
    seed_everything,
    use_context,
)

__all__ = [
    "METRICS_FILE",
    "NOTES_DIR",
    "SETUP_KEYS",
    "Claim",
    "ExperimentModule",
    "Kind",
    "Op",
    "Record",
    "RunContext",
    "Status",
    "default_jobs",
    "derive_seed",
    "describe_target",
    "evaluate",
    "load_target",
    "make_config",
    "notes_file",
    "notes_of",
    "parallel_map",
    "run_experiment",
    "run_experiments",
    "save_figure",
    "seed_everything",
]

METRICS_FILE = "metrics.json"

#: The keys of one row of an experiment's ``setup(cfg)``, in display order.
SETUP_KEYS = ("quantity", "paper", "ours", "why")


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


def _optional_str(obj: Any, name: str) -> str:
    value = getattr(obj, name, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TypeError(
            f"{name} is a {type(value).__name__}; expected a str (the experiment's optional "
            f"{name} attribute, see noetherflow.experiments._base)"
        )
    return value.strip()


#: Folder (beside the experiment modules) of the run histories, one ``<module>.md`` each.
NOTES_DIR = "notes"


def notes_file(obj: Any) -> Path | None:
    """``notes/<module>.md`` beside a module experiment ``obj``, or None for other objects."""
    file = getattr(obj, "__file__", None)
    if not isinstance(file, str):
        return None
    path = Path(file)
    return path.parent / NOTES_DIR / f"{path.stem}.md"


def notes_of(obj: Any) -> str:
    """An experiment's run history: its ``NOTES`` attribute, else its ``notes/<module>.md``.

    Empty when it has neither (the history is optional for experiments outside the package).
    """
    if getattr(obj, "NOTES", None) is not None:
        return _optional_str(obj, "NOTES")
    path = notes_file(obj)
    if path is None or not path.is_file():
        return ""
    return path.read_text(encoding="utf-8").strip()


def _claim_kind(obj: Any) -> Kind:
    """The experiment's ``KIND`` (default ``"paper"``): the kind of claims that name none."""
    value = getattr(obj, "KIND", None)
    return Kind.PAPER if value is None else Kind.parse(value)


def _paper_order(obj: Any) -> float | None:
    value = getattr(obj, "PAPER_ORDER", None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(
            f"PAPER_ORDER={value!r}; expected a finite number giving the position in the "
            f"paper, e.g. 2.0 for Fig. 2 or 5.4 for Thm 5.4"
        )
    return float(value)


def _setup_rows(rows: Any) -> list[dict[str, str]]:
    """Validate what ``setup(cfg)`` returned: a list of ``{quantity, paper, ours, why}`` str."""
    if not isinstance(rows, list | tuple):
        raise TypeError(
            f"setup() returned {type(rows).__name__}; expected a list of dicts with keys "
            f"{', '.join(SETUP_KEYS)}"
        )
    out: list[dict[str, str]] = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or set(row) != set(SETUP_KEYS):
            keys = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise TypeError(
                f"setup() row {i} is {keys!r}; expected a dict with exactly the keys "
                f"{', '.join(SETUP_KEYS)}, e.g. {{'quantity': 'η', 'paper': '0.1', "
                f"'ours': '0.05', 'why': 'diverges with the summed loss'}}"
            )
        bad = [k for k in SETUP_KEYS if not isinstance(row[k], str)]
        if bad:
            raise TypeError(
                f"setup() row {i} ({row.get('quantity')!r}): {', '.join(bad)} not str; "
                f"write every cell as text, e.g. 'ours': '0.05'"
            )
        out.append({k: row[k] for k in SETUP_KEYS})
    return out


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
# The record written to metrics.json
# --------------------------------------------------------------------------------------


class Status(str, enum.Enum):
    OK = "ok"
    ERROR = "error"


@dataclass
class Record:
    """Everything metrics.json holds for one experiment run (:meth:`to_dict` is the file).

    ``elapsed_s`` is the wall time, ``cpu_s`` the CPU time of the process that ran it (its
    worker processes, with ``jobs > 1``, are not included).

    ``error`` is ``None`` or ``{"stage", "type", "message", "traceback"}``; stages are
    load, config, setup, run, claims, plot (and worker, for a worker process that died).
    """

    experiment: str
    target: str
    quick: bool
    seed: int
    description: str = ""
    paper: str = ""
    paper_order: float | None = None
    status: Status = Status.OK
    elapsed_s: float = 0.0
    cpu_s: float = 0.0
    config: Any = field(default_factory=dict)
    setup: list[dict[str, str]] = field(default_factory=list)
    claims: list[dict[str, Any]] = field(default_factory=list)
    series: Any = field(default_factory=dict)
    results: Any = field(default_factory=dict)
    figures: list[str] = field(default_factory=list)
    notes: str = ""
    error: dict[str, str] | None = None
    environment: dict[str, Any] = field(default_factory=dict)

    def fail(self, stage: str, exc: BaseException) -> None:
        """Record ``exc`` raised in ``stage`` (keeps whatever was computed before)."""
        tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
        self.status = Status.ERROR
        self.error = {
            "stage": stage,
            "type": type(exc).__name__,
            "message": str(exc),
            "traceback": "".join(tb[-12:]),
        }

    def to_dict(self) -> dict[str, Any]:
        """The metrics.json object (strict-JSON-able; ``status`` as its string value)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["quick"] = bool(self.quick)
        out["seed"] = int(self.seed)
        out["status"] = self.status.value
        return out


def _context(*, jobs: Any, seed: Any, torch_threads: Any) -> RunContext:
    """The run's :class:`RunContext`; numpy integers accepted, a float or bool refused."""
    values = {"jobs": jobs, "seed": seed, "torch_threads": torch_threads}
    for name, value in values.items():
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise ValueError(f"{name}={value!r}; expected an int (e.g. {name}=1)")
    return RunContext(jobs=int(jobs), seed=int(seed), torch_threads=int(torch_threads))


def _environment(ctx: RunContext) -> dict[str, Any]:
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
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "jobs": ctx.jobs,
        "torch_threads": ctx.torch_threads,
    }


# --------------------------------------------------------------------------------------
# Running experiments
# --------------------------------------------------------------------------------------


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
    under ``"error"`` (with the stage: load/config/setup/run/claims/plot) and ``status`` is
    ``"error"``; whatever was computed before the failure is kept. ``jobs`` is the budget
    :func:`parallel_map` uses inside the experiment (bound as a :class:`RunContext`).
    """
    ctx = _context(jobs=jobs, seed=seed, torch_threads=torch_threads)
    seed = ctx.seed  # a plain int from here on (numpy integers accepted above)
    exp_dir = Path(out_dir) / exp_id
    exp_dir.mkdir(parents=True, exist_ok=True)
    rec = Record(
        experiment=exp_id,
        target=target,
        quick=bool(quick),
        seed=int(seed),
        environment=_environment(ctx),
    )
    t0, c0 = time.perf_counter(), time.process_time()
    stage = "load"
    try:
        with use_context(ctx):
            exp = load_target(target)
            rec.description = describe_target(exp)
            rec.paper = _optional_str(exp, "PAPER")
            rec.paper_order = _paper_order(exp)
            rec.notes = notes_of(exp)
            stage = "config"
            cfg = make_config(exp, quick=quick)
            if overrides and dataclasses.is_dataclass(cfg):
                names = {f.name for f in dataclasses.fields(cfg)}
                keep = {k: v for k, v in overrides.items() if k in names}
                cfg = dataclasses.replace(cfg, **keep)  # type: ignore[type-var]
            rec.config = to_jsonable(cfg)
            setup = getattr(exp, "setup", None)
            if setup is not None:
                stage = "setup"
                rec.setup = _setup_rows(setup(cfg))
            stage = "run"
            seed_everything(seed)
            results = exp.run(cfg, seed, exp_dir)
            if not isinstance(results, dict):
                raise TypeError(
                    f"run() returned {type(results).__name__}; expected a dict with a "
                    f"'series' entry and raw results"
                )
            rec.series = to_jsonable(results.get("series", {}))
            rec.results = to_jsonable({k: v for k, v in results.items() if k != "series"})
            stage = "claims"
            claims = list(exp.claims(results, cfg))
            for c in claims:
                if not isinstance(c, Claim):
                    raise TypeError(f"claims() returned {type(c).__name__}; expected Claim")
            ids = [c.id for c in claims]
            dup = sorted({i for i in ids if ids.count(i) > 1})
            if dup:
                raise ValueError(f"duplicate claim ids {dup}; claim ids must be unique")
            kind = _claim_kind(exp)
            rec.claims = [c.with_kind(kind).to_dict() for c in claims]
            stage = "plot"
            paths = exp.plot(results, cfg, exp_dir) or []
            rec.figures = [_relative_figure(p, exp_dir) for p in paths]
    except Exception as exc:
        rec.fail(stage, exc)
    rec.elapsed_s = round(time.perf_counter() - t0, 4)
    rec.cpu_s = round(time.process_time() - c0, 4)  # this process (jobs = 1: all of it)
    data = rec.to_dict()
    atomic_write_json(exp_dir / METRICS_FILE, data)
    return cast(dict[str, Any], to_jsonable(data))


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
    _context(jobs=jobs, seed=seed, torch_threads=torch_threads)  # validates, before any run
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    outer = min(jobs, len(specs)) if specs else 1
    inner = max(1, jobs // outer)
    options: dict[str, Any] = {
        "quick": quick,
        "seed": seed,
        "out_dir": out,
        "jobs": inner,
        "torch_threads": torch_threads,
        "overrides": overrides,
    }
    if outer <= 1:
        for exp_id, target in specs:
            if on_start:
                on_start(exp_id)
            rec = run_experiment(exp_id, target, **options)
            results[exp_id] = rec
            if on_done:
                on_done(exp_id, rec)
        return [results[e] for e, _ in specs]
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(
        max_workers=outer,
        mp_context=ctx,
        initializer=init_worker,
        initargs=(torch_threads,),
    ) as ex:
        futures: dict[cf.Future[dict[str, Any]], tuple[str, str]] = {}
        for exp_id, target in specs:
            fut = ex.submit(run_experiment, exp_id, target, **options)
            futures[fut] = (exp_id, target)
            if on_start:
                on_start(exp_id)
        for fut in cf.as_completed(futures):
            exp_id, target = futures[fut]
            try:
                rec = fut.result()
            except Exception as exc:  # worker died (e.g. killed, out of memory)
                crashed = Record(experiment=exp_id, target=target, quick=quick, seed=seed)
                crashed.fail("worker", exc)
                rec = cast(dict[str, Any], to_jsonable(crashed.to_dict()))
                atomic_write_json(out / exp_id / METRICS_FILE, rec)
            results[exp_id] = rec
            if on_done:
                on_done(exp_id, rec)
    return [results[e] for e, _ in specs]

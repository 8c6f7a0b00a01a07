"""Seeding and the process pool experiments use for their sweeps (:func:`parallel_map`).

The budget an experiment may use is a :class:`RunContext` (worker count, base seed, torch
threads). The runner binds it for the duration of one experiment with :func:`use_context`;
:func:`parallel_map` and :func:`default_jobs` read it with :func:`current_context`. The
binding is a :class:`contextvars.ContextVar`, set and reset around the run, so no module
global is mutated and nothing leaks from one run (or test) into the next. The experiment
contract ``run(cfg, seed, out_dir)`` therefore needs no extra argument, and a caller outside
the harness may pass ``context=`` explicitly.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextvars
import hashlib
import multiprocessing
import random
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

__all__ = [
    "RunContext",
    "current_context",
    "default_jobs",
    "derive_seed",
    "parallel_map",
    "seed_everything",
    "use_context",
]

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class RunContext:
    """The budget of one experiment run: what :func:`parallel_map` uses by default.

    ``jobs``: worker processes for sweeps (``--jobs``; 1 runs in-process); ``seed``: the base
    seed of the per-item seeds; ``torch_threads``: torch intra-op threads in every worker
    (fixed, default 1, so that results do not depend on ``jobs``).
    """

    jobs: int = 1
    seed: int = 0
    torch_threads: int = 1

    def __post_init__(self) -> None:
        for name in ("jobs", "torch_threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RunContext {name}={value!r}; expected an int >= 1 (e.g. 1)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"RunContext seed={self.seed!r}; expected an int >= 0 (e.g. 0)")


_OUTSIDE_A_RUN = RunContext()
_CONTEXT: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar(
    "noetherflow_run_context", default=None
)


def current_context() -> RunContext:
    """The :class:`RunContext` bound by the harness (``RunContext()`` outside a run)."""
    ctx = _CONTEXT.get()
    return _OUTSIDE_A_RUN if ctx is None else ctx


@contextmanager
def use_context(ctx: RunContext) -> Iterator[RunContext]:
    """Bind ``ctx`` (and its torch thread count) for the ``with`` block; restored after."""
    token = _CONTEXT.set(ctx)
    try:
        with _torch_threads(ctx.torch_threads):
            yield ctx
    finally:
        _CONTEXT.reset(token)


def default_jobs() -> int:
    """Worker count :func:`parallel_map` uses when ``jobs`` is not given (the run's budget)."""
    return current_context().jobs


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
def _torch_threads(n: int) -> Iterator[None]:
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def init_worker(torch_threads: int) -> None:
    """Initializer of a spawned worker: its torch thread count (the context comes per call)."""
    import torch

    torch.set_num_threads(max(1, torch_threads))


def _call_seeded(fn: Callable[[T], R], item: T, seed: int, ctx: RunContext) -> R:
    with use_context(ctx):
        seed_everything(seed)
        return fn(item)


def parallel_map(
    fn: Callable[[T], R],
    items: Iterable[T],
    *,
    jobs: int | None = None,
    seed: int | None = None,
    context: RunContext | None = None,
) -> list[R]:
    """``[fn(x) for x in items]``, in order, optionally in spawned worker processes.

    ``fn`` must be picklable (a module-level function; use ``functools.partial`` to bind
    the config). Each call runs with the global RNGs of Python, numpy and torch seeded by
    ``derive_seed(seed, "parallel_map", index)`` (``seed`` defaults to the context's seed,
    the experiment's), in both the sequential and the parallel path, and each worker uses the
    context's torch thread count, so the results do not depend on ``jobs``. ``jobs`` defaults
    to the context's budget (``--jobs``); ``jobs=1`` runs in-process and leaves the caller's
    global RNG state untouched. ``context`` defaults to :func:`current_context`. Prefer
    explicit generators seeded from the item over the global RNG. Inside a spawned worker, a nested
    ``parallel_map`` runs in-process (the worker's context has ``jobs=1``).
    """
    ctx = current_context() if context is None else context
    seq = list(items)
    n_jobs = ctx.jobs if jobs is None else int(jobs)
    if n_jobs < 1:
        raise ValueError(f"parallel_map: jobs={jobs!r}; expected an int >= 1 (or None)")
    base = ctx.seed if seed is None else int(seed)
    if base < 0:
        raise ValueError(f"parallel_map: seed={seed!r}; expected an int >= 0 (or None)")
    seeds = [derive_seed(base, "parallel_map", i) for i in range(len(seq))]
    if n_jobs == 1 or len(seq) <= 1:  # in-process: nested calls keep this context
        with _preserved_global_rng():
            return [_call_seeded(fn, item, s, ctx) for item, s in zip(seq, seeds, strict=True)]
    inner = RunContext(jobs=1, seed=base, torch_threads=ctx.torch_threads)
    mp_ctx = multiprocessing.get_context("spawn")
    workers = min(n_jobs, len(seq))
    with cf.ProcessPoolExecutor(
        max_workers=workers,
        mp_context=mp_ctx,
        initializer=init_worker,
        initargs=(ctx.torch_threads,),
    ) as ex:
        futures = [
            ex.submit(_call_seeded, fn, item, s, inner) for item, s in zip(seq, seeds, strict=True)
        ]
        return [f.result() for f in futures]

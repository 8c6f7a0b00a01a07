"""Experiments reproducing the paper's figures, one module per figure.

The contract every experiment module keeps (``Config``, ``run``, ``claims``, ``plot``) and
the helpers they use (:class:`Claim`, :class:`Op`, :func:`parallel_map`, :func:`derive_seed`,
:func:`find_divergence`, :func:`save_figure`) are defined in
:mod:`noetherflow.experiments._base`; ids are the module names (see :mod:`.registry`).
"""

from noetherflow.experiments._base import (
    METRICS_FILE,
    Claim,
    Divergence,
    ExperimentModule,
    Op,
    Status,
    default_jobs,
    derive_seed,
    evaluate,
    find_divergence,
    make_config,
    parallel_map,
    run_experiment,
    run_experiments,
    save_figure,
    seed_everything,
)

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
    "make_config",
    "parallel_map",
    "run_experiment",
    "run_experiments",
    "save_figure",
    "seed_everything",
]

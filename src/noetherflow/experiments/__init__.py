"""Experiments reproducing the paper's figures, one module per figure.

The contract every experiment module keeps (``Config``, ``run``, ``claims``, ``plot`` and the
optional ``DESCRIPTION``, ``PAPER``, ``PAPER_ORDER``, ``NOTES``, ``setup``) and the runner are in
:mod:`noetherflow.experiments._base`; claims in :mod:`._claims`; seeding and the process pool
(:func:`parallel_map`, :class:`RunContext`) in :mod:`._parallel`; :func:`save_figure` in
:mod:`._helpers`; :func:`find_divergence` is the package's one divergence helper
(:mod:`noetherflow._divergence`, re-exported here); the paper's corrections shown in the report in
:mod:`.corrections`. Ids are the module names (see :mod:`.registry`).
"""

from noetherflow._divergence import Divergence, find_divergence
from noetherflow.experiments._base import (
    METRICS_FILE,
    SETUP_KEYS,
    ExperimentModule,
    Record,
    Status,
    describe_target,
    load_target,
    make_config,
    run_experiment,
    run_experiments,
)
from noetherflow.experiments._claims import Claim, Op, evaluate
from noetherflow.experiments._helpers import save_figure
from noetherflow.experiments._parallel import (
    RunContext,
    current_context,
    default_jobs,
    derive_seed,
    parallel_map,
    seed_everything,
    use_context,
)

__all__ = [
    "METRICS_FILE",
    "SETUP_KEYS",
    "Claim",
    "Divergence",
    "ExperimentModule",
    "Op",
    "Record",
    "RunContext",
    "Status",
    "current_context",
    "default_jobs",
    "derive_seed",
    "describe_target",
    "evaluate",
    "find_divergence",
    "load_target",
    "make_config",
    "parallel_map",
    "run_experiment",
    "run_experiments",
    "save_figure",
    "seed_everything",
    "use_context",
]

"""Shared fixtures.

``reproduce``: a module-scoped factory that runs ``noetherflow reproduce IDS --quick`` once per
argument set through :func:`noetherflow.cli.main` and returns the results directory; an
experiment test module wraps it in its own fixture::

    @pytest.fixture(scope="module")
    def quick_run(reproduce: Reproduce) -> Path:
        return reproduce("fig2", "fig8", jobs=2)

``metrics``: the function ``metrics(out, exp_id)`` that reads one experiment's metrics.json and
fails the test if the experiment errored.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import pytest
from hypothesis import settings

from noetherflow import cli
from noetherflow.experiments import METRICS_FILE

# CI runs the same examples every time (a property failure is reproducible, not a flake);
# HYPOTHESIS_PROFILE=explore draws new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


class Reproduce(Protocol):
    """``reproduce(*ids, jobs=1, strict=False) -> Path`` (see the module docstring)."""

    def __call__(self, *ids: str, jobs: int = 1, strict: bool = False) -> Path: ...


def read_metrics(out: Path, exp_id: str) -> dict[str, Any]:
    """The metrics of ``exp_id`` under ``out``; fails the test if the experiment errored."""
    data: dict[str, Any] = json.loads((out / exp_id / METRICS_FILE).read_text(encoding="utf-8"))
    assert data["status"] == "ok", data.get("error")
    return data


@pytest.fixture(scope="module")
def reproduce(tmp_path_factory: pytest.TempPathFactory) -> Reproduce:
    """Run ``noetherflow reproduce IDS --quick [--jobs N] [--strict]`` once per module and
    argument set; the run must exit 0 (no experiment error; under ``strict`` every claim holds).
    """
    runs: dict[tuple[tuple[str, ...], int, bool], Path] = {}

    def run(*ids: str, jobs: int = 1, strict: bool = False) -> Path:
        key = (ids, jobs, strict)
        if key not in runs:
            out = tmp_path_factory.mktemp("_".join(ids).replace("-", "_") or "run")
            argv = ["reproduce", *ids, "--quick", "--jobs", str(jobs), "--out", str(out)]
            code = cli.main([*argv, "--strict"] if strict else argv)
            assert code == cli.ExitCode.OK, f"`noetherflow {' '.join(argv)}` exited {code!r}"
            runs[key] = out
        return runs[key]

    return run


@pytest.fixture(scope="session")
def metrics() -> Callable[[Path, str], dict[str, Any]]:
    """:func:`read_metrics`: ``metrics(out, exp_id)`` (fails the test if the experiment errored)."""
    return read_metrics

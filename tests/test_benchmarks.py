"""Smoke test of benchmarks/bench_stats.py: it runs at toy sizes and reports finite ratios.

No timing assertions: the point is that the benchmark keeps working as the API evolves.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_stats.py"


def _load(name: str) -> ModuleType:
    """The script ``benchmarks/<name>.py`` as a module (registered under ``name``)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPT.parent / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return _load("bench_stats")


def test_bench_stats_quick_tiny_finite_ratios(bench: ModuleType) -> None:
    res = bench.main(["--quick", "--tiny", "--reps", "1", "--no-memory"])
    assert set(res["workloads"]) == {"mlp", "linear", "token", "mlp_full"}
    for w in res["workloads"].values():
        assert all(math.isfinite(v) and v > 0 for v in w["ratio_to_plain"].values())
        assert math.isfinite(w["ref_over_hooks"]) and w["ref_over_hooks"] > 0
        assert w["hooks_levels"]
    assert "M_W" in res["workloads"]["linear"]["hooks_levels"]
    assert "diag" in res["workloads"]["mlp"]["hooks_levels"]
    assert "M_W" in res["workloads"]["mlp_full"]["hooks_levels"]
    assert len(res["targets"]) == 5


def test_bench_stats_memory_cell(bench: ModuleType) -> None:
    delta = bench.memory_cell("linear", "hooks", quick=True, tiny=True, threads=None)
    assert math.isfinite(delta) and delta >= 0


def test_bench_monitor_tiny_runs() -> None:
    """benchmarks/bench_monitor.py keeps working with every configuration (toy sizes)."""
    mod = _load("bench_monitor")
    argv = ["--tiny", "--every", "2", "--steps", "20", "--blocks", "1", "--max-ratio", "1e9"]
    assert mod.main([*argv, "--configs", "default,no-distance,solve,every-record"]) == 0


def test_bench_hf_trainer_tiny_runs() -> None:
    """benchmarks/bench_hf_trainer.py at toy sizes: finite positive ratios (no timing claim)."""
    pytest.importorskip("transformers")
    mod = _load("bench_hf_trainer")
    res = mod.main(["--tiny", "--reps", "1", "--steps", "2", "--every", "1"])
    assert set(res) == {"adamw", "sgd"}
    assert all(math.isfinite(r["ratio"]) and r["ratio"] > 0 for r in res.values())


def test_gpt2_124m_quick_runs() -> None:
    """benchmarks/gpt2_124m.py keeps working: every phase at the quick size, finite figures."""
    mod = _load("gpt2_124m")
    with pytest.warns(UserWarning, match="AdamW"):  # the monitor says AdamW has no distances
        res = mod.main(
            ["--quick", "--threads", "1", "--steps", "10", "--reps", "1", "--solve-reps", "2"]
        )
    assert res["detect"]["symmetries"] > 0 and res["detect"]["seconds"] > 0
    assert math.isfinite(res["stats"]["ratio_solve"]) and res["stats"]["ratio_solve"] > 0
    assert res["solve"]["converged"]
    (again,) = res["solve"]["again"]  # --solve-reps 2: one more solve after the first
    assert again["seconds"] > 0 and again["user_cpu"] >= 0 and again["minor_faults"] >= 0
    for kind in ("sgdm", "adamw"):
        mon = res["monitor"][kind]
        assert math.isfinite(mon["ratio"]) and mon["ratio"] > 0 and mon["first_record_s"] > 0


def test_bench_blas_shapes_run() -> None:
    """benchmarks/bench_blas.py keeps working: both libraries' times for every shape."""
    mod = _load("bench_blas")
    res = mod.main(["--reps", "1", "--solve-layers", "0"])
    assert len(res["shapes"]) == 6 and "solve" not in res
    for row in res["shapes"]:
        assert row["torch_ms"] > 0 and row["numpy_ms"] > 0 and math.isfinite(row["ratio"])

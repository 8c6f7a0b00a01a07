"""benchmarks/compare_verdicts.py and compare_bench_stats.py on hand-made inputs (no runs).

The verdict comparison pairs claims by (experiment, id), computes the relative change and
flags moved values, changed verdicts and changed rules; one-sided claims and crashed
experiments are listed apart. The benchmark driver's interleaving and ratios are checked with
fake workers (no subprocess, no timing).
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def cv() -> ModuleType:
    return _load("compare_verdicts")


@pytest.fixture(scope="module")
def cb() -> ModuleType:
    return _load("compare_bench_stats")


def _run_dir(root: Path, experiments: dict[str, list[dict[str, Any]]], error: str = "") -> Path:
    for exp, claims in experiments.items():
        (root / exp).mkdir(parents=True)
        rec = {"experiment": exp, "claims": claims, "error": error or None}
        (root / exp / "metrics.json").write_text(json.dumps(rec), encoding="utf-8")
    return root


def _c(cid: str, value: Any, op: str = "<", thr: float = 0.1, holds: Any = None) -> dict:
    h = holds if holds is not None else (value < thr if op == "<" else value >= thr)
    return {"id": cid, "value": value, "op": op, "threshold": thr, "holds": h}


def test_pairs_flags_and_one_sided_claims(cv: ModuleType, tmp_path: Path) -> None:
    before = _run_dir(
        tmp_path / "b",
        {
            "fig2": [_c("a", 0.05), _c("b", 0.050), _c("gone", 0.2)],
            "fig5": [_c("norms", 0.0666), _c("zero", 0.0)],
        },
    )
    after = _run_dir(
        tmp_path / "a",
        {
            "fig2": [_c("a", 0.0504), _c("b", 0.0525), _c("new", 0.3)],
            "fig5": [_c("norms", 0.29), _c("zero", 0.0, thr=0.2)],
        },
    )
    b, _ = cv.load(before)
    a, _ = cv.load(after)
    cmp = cv.compare(b, a, tol=0.01)
    rows = {(r.after.experiment, r.after.id): r for r in cmp.rows}
    assert set(rows) == {("fig2", "a"), ("fig2", "b"), ("fig5", "norms"), ("fig5", "zero")}
    assert rows["fig2", "a"].rel_change == pytest.approx(0.008, rel=1e-12)
    assert not rows["fig2", "a"].moved  # 0.8% < 1%
    assert rows["fig2", "b"].moved and rows["fig2", "b"].rel_change == pytest.approx(0.05)
    assert rows["fig5", "norms"].verdict_changed and rows["fig5", "norms"].moved
    assert rows["fig5", "zero"].rel_change == 0.0 and rows["fig5", "zero"].rule_changed
    assert [c.id for c in cmp.only_before] == ["gone"]
    assert [c.id for c in cmp.only_after] == ["new"]
    text = cv.markdown(cmp, ("before", "after"))
    assert "holds → FAILS" in text and "VERDICT" in text and "< 0.1 → < 0.2" in text
    assert "total 4/5 → 3/5" in text  # fig5 'norms' fails after; 'gone' / 'new' counted


def test_rel_change_edge_cases(cv: ModuleType) -> None:
    assert cv.rel_change(None, 1.0) is None
    assert cv.rel_change(0.0, 1e-3) is None  # undefined: flagged as moved by compare
    assert cv.rel_change(math.inf, math.inf) == 0.0
    assert cv.rel_change(-0.02241, 0.04234) == pytest.approx((0.04234 + 0.02241) / 0.02241)


def test_recorded_file_and_derived_verdict(cv: ModuleType, tmp_path: Path) -> None:
    rec = {
        "_comment": "ignored",
        "fig8": {"all_converge": {"value": 0.063, "op": "<", "threshold": 0.1, "source": "doc"}},
    }
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(rec), encoding="utf-8")
    claims, crashed = cv.load(path)
    (c,) = claims.values()
    assert c.holds is True and c.source == "doc" and crashed == {}


def test_crashed_experiment_and_bad_inputs(cv: ModuleType, tmp_path: Path, capsys) -> None:
    run = _run_dir(tmp_path / "r", {"fig9": []}, error="RuntimeError: boom\ntrace")
    claims, crashed = cv.load_run(run)
    assert claims == {} and crashed == {"fig9": "RuntimeError: boom"}
    with pytest.raises(FileNotFoundError, match=r"metrics\.json"):
        cv.load_run(tmp_path / "empty")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"fig1": [1, 2]}), encoding="utf-8")
    with pytest.raises(ValueError, match="fig1"):
        cv.load_recorded(bad)
    with pytest.raises(ValueError, match="'id'"):
        cv.claim_from_dict("fig1", {"value": 1.0})
    assert cv.main([str(tmp_path / "nowhere"), str(run)]) == 2
    assert "neither" in capsys.readouterr().err


class _FakeWorker:
    def __init__(self, name: str, log: list[tuple[str, str, str]], scale: float) -> None:
        self.name, self.log, self.scale = name, log, scale
        self.workloads = ["mlp", "linear"]

    def time(self, key: str, method: str) -> float:
        self.log.append((self.name, key, method))
        return self.scale * (1 + len(self.log) % 3)


def test_interleaving_alternates_versions(cb: ModuleType) -> None:
    log: list[tuple[str, str, str]] = []
    workers = {"before": _FakeWorker("before", log, 1.0), "after": _FakeWorker("after", log, 2.0)}
    methods = ("plain", "hooks", "reference")
    times = cb.interleaved(workers, reps=4, ref_reps=1, methods=methods)
    assert len(times["before"]["mlp"]["plain"]) == 4
    assert len(times["after"]["linear"]["reference"]) == 1
    pairs = [log[i : i + 2] for i in range(0, len(log), 2)]
    assert all({p[0][0], p[1][0]} == {"before", "after"} and p[0][1:] == p[1][1:] for p in pairs)
    firsts = [p[0][0] for p in pairs]
    assert firsts.count("before") == pytest.approx(len(firsts) / 2, abs=1)


def test_ratios(cb: ModuleType) -> None:
    r = cb.ratios([1.0, 2.0, 3.0], [2.0, 2.0, 6.0])
    assert r["ratio_median"] == 1.0 and r["ratio_paired"] == 2.0 and r["ratio_min"] == 2.0
    assert r["reps"] == 3


def test_interleaving_restricted_to_workloads(cb: ModuleType) -> None:
    log: list[tuple[str, str, str]] = []
    workers = {"before": _FakeWorker("before", log, 1.0), "after": _FakeWorker("after", log, 1.0)}
    times = cb.interleaved(workers, reps=2, ref_reps=0, methods=("plain",), only=("linear",))
    assert list(times["before"]) == ["linear"] and {k for _, k, _ in log} == {"linear"}

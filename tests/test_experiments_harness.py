"""Tests of the experiment harness: claims, metrics.json, atomic writes, errors, report, CLI,
parallelism and determinism. Fake experiments are classes of this module, referenced as
``"<this module>:<Class>"`` so spawned worker processes can import them too."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from noetherflow import _divergence, _io, cli, report
from noetherflow.experiments import (
    METRICS_FILE,
    Claim,
    Op,
    Record,
    RunContext,
    current_context,
    default_jobs,
    derive_seed,
    evaluate,
    find_divergence,
    parallel_map,
    registry,
    run_experiment,
    run_experiments,
    save_figure,
    use_context,
)

# --------------------------------------------------------------------------------------
# fake experiments
# --------------------------------------------------------------------------------------


def _noisy_sum(item: int, *, scale: float) -> float:
    """Uses the global torch RNG, which parallel_map seeds per item."""
    return float(scale * item + torch.randn(()).item())


class GoodExp:
    """A fake experiment with one holding, one failing and one NaN claim."""

    @dataclass(frozen=True)
    class Config:
        """n: length of the random series; quick shrinks it."""

        n: int = 40
        scale: float = 0.5

        @classmethod
        def quick(cls) -> GoodExp.Config:
            return cls(n=8)

    @staticmethod
    def run(cfg: Any, seed: int, out_dir: Path) -> dict[str, Any]:
        x = torch.randn(cfg.n, dtype=torch.float64).numpy()  # global RNG, seeded by harness
        sweep = parallel_map(partial(_noisy_sum, scale=cfg.scale), range(4))
        return {
            "series": {"x": x, "special": np.array([np.nan, np.inf, -np.inf, 1.0])},
            "sweep": sweep,
            "mean": float(x.mean()),
            "count": np.int64(3),
        }

    @staticmethod
    def claims(results: dict[str, Any], cfg: Any) -> list[Claim]:
        return [
            Claim(
                id="count_is_3",
                statement="three | things",
                value=results["count"],
                op="==",
                threshold=3,
            ),
            Claim(
                id="mean_huge",
                statement="mean exceeds 100",
                value=results["mean"],
                op=Op.GT,
                threshold=100,
            ),
            Claim(
                id="nan_claim",
                statement="a NaN never holds",
                value=math.nan,
                op="abs<",
                threshold=1,
            ),
        ]

    @staticmethod
    def plot(results: dict[str, Any], cfg: Any, out_dir: Path) -> list[Path]:
        from matplotlib.figure import Figure

        fig = Figure(figsize=(2, 2))
        fig.subplots().plot(results["series"]["x"])
        return [save_figure(fig, out_dir / "good.png")]


class BoomExp:
    """A fake experiment whose run raises."""

    Config = GoodExp.Config

    @staticmethod
    def run(cfg: Any, seed: int, out_dir: Path) -> dict[str, Any]:
        raise ValueError("boom 42")

    claims = GoodExp.claims
    plot = GoodExp.plot


class BadPlotExp(GoodExp):
    """A fake experiment whose plot raises (claims must survive)."""

    @staticmethod
    def plot(results: dict[str, Any], cfg: Any, out_dir: Path) -> list[Path]:
        raise RuntimeError("no canvas")


class QuickFieldExp(GoodExp):
    """Config with a `quick: bool` field instead of a classmethod."""

    @dataclass(frozen=True)
    class Config:
        quick: bool = False

        @property
        def n(self) -> int:
            return 5 if self.quick else 50

        scale: float = 1.0


def _target(cls: type) -> str:
    return f"{__name__}:{cls.__name__}"


@pytest.fixture
def fakes() -> Iterator[dict[str, str]]:
    ids = {
        "fake_good": GoodExp,
        "fake_boom": BoomExp,
        "fake_badplot": BadPlotExp,
        "fake_good2": GoodExp,
    }
    for i, cls in ids.items():
        registry.register(i, _target(cls))
    yield {i: _target(c) for i, c in ids.items()}
    for i in ids:
        registry.unregister(i)


def _strict_json(path: Path) -> dict[str, Any]:
    def no_constant(name: str) -> Any:
        raise AssertionError(f"invalid JSON constant {name} in {path}")

    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"), parse_constant=no_constant)
    return data


def _comparable(rec: dict[str, Any]) -> dict[str, Any]:
    return {
        k: rec[k] for k in ("experiment", "seed", "quick", "config", "claims", "series", "results")
    }


# --------------------------------------------------------------------------------------
# claims
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "op", "threshold", "expected"),
    [
        (1, "<", 2, True),
        (2, "<", 2, False),
        (2, "<=", 2, True),
        (3, ">", 2, True),
        (2, ">=", 3, False),
        (0, "==", 0, True),
        (1, "==", 0, False),
        (1, "!=", 0, True),
        (-0.5, "abs<", 1, True),
        (-1.5, "abs<", 1, False),
        (-1.0, "abs<=", 1, True),
        (math.nan, "<", 1, False),
        (None, ">", 0, False),
        ("inf", ">", 1e300, True),
        (np.float64(1e-12), "<", 1e-10, True),
    ],
)
def test_claim_evaluation(value: Any, op: str, threshold: float, expected: bool) -> None:
    assert evaluate(value, op, threshold) is expected
    c = Claim(id="c", statement="s", value=value, op=op, threshold=threshold)
    assert c.holds is expected
    assert c.op is Op(op)
    d = c.to_dict()
    json.dumps(d, allow_nan=False)
    assert Claim.from_dict(d).holds is expected


def test_claim_holds_is_computed_not_passed() -> None:
    with pytest.raises(TypeError):
        Claim(id="c", statement="s", value=1, op=Op.LT, threshold=2, holds=True)  # type: ignore[call-arg]


def test_unknown_op_names_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown claim op '=<'.*'<='"):
        Claim(id="c", statement="s", value=1, op="=<", threshold=2)


def test_find_divergence_and_derive_seed() -> None:
    d = find_divergence([3.0, 2.0, 1.5, math.inf, math.nan])
    assert (d.diverged, d.step, d.last_finite_step, d.last_finite_value) == (True, 3, 2, 1.5)
    assert not find_divergence([1.0, 2.0]).diverged
    assert find_divergence([1.0, 1e9], limit=1e6).step == 1
    assert find_divergence([1.0, -1e9], limit=1e6).last_finite_value == 1.0
    assert not find_divergence([]).diverged
    assert find_divergence is _divergence.find_divergence  # the package's one helper


def test_diverged_mask_per_run_limit() -> None:
    # one row per run; a per-run bound broadcasts over the last axis (as in teleport-mlp)
    vals = np.array([[1.0, 5.0], [math.nan, 0.5], [2.0, 30.0]])
    got = _divergence.diverged_mask(vals, np.array([[10.0], [10.0], [20.0]]))
    assert got.tolist() == [[False, False], [True, False], [False, True]]
    assert _divergence.diverged_mask([math.inf, -math.inf, 0.0]).tolist() == [True, True, False]
    assert derive_seed(0, "a") == derive_seed(0, "a") != derive_seed(1, "a")


# --------------------------------------------------------------------------------------
# io
# --------------------------------------------------------------------------------------


def test_to_jsonable_handles_arrays_tensors_and_nonfinite() -> None:
    obj = {
        "a": np.array([1.0, np.nan, np.inf, -np.inf]),
        "t": torch.tensor([[1, 2]]),
        "s": np.float32(0.5),
        "i": np.int64(7),
        "b": np.bool_(True),
        "p": Path("x/y"),
        "e": Op.LT,
        1: (1, 2),
    }
    out = _io.to_jsonable(obj)
    text = json.dumps(out, allow_nan=False)
    assert json.loads(text) == {
        "a": [1.0, None, "inf", "-inf"],
        "t": [[1, 2]],
        "s": 0.5,
        "i": 7,
        "b": True,
        "p": "x/y",
        "e": "<",
        "1": [1, 2],
    }


def test_atomic_write_leaves_no_temp_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "sub" / "m.json"
    _io.atomic_write_json(target, {"x": np.arange(3)})
    _io.atomic_write_json(target, {"x": 1})
    assert _strict_json(target) == {"x": 1}
    assert sorted(p.name for p in target.parent.iterdir()) == ["m.json"]

    def failing_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        _io.atomic_write_json(target, {"x": 2})
    assert _strict_json(target) == {"x": 1}  # old content intact
    assert sorted(p.name for p in target.parent.iterdir()) == ["m.json"]  # no temp left
    assert os.stat(target).st_mode & 0o777 == _io._FILE_MODE  # umask mode, not mkstemp's 0600


# --------------------------------------------------------------------------------------
# run_experiment
# --------------------------------------------------------------------------------------


def test_metrics_schema(tmp_path: Path) -> None:
    rec = run_experiment("fake_good", _target(GoodExp), quick=True, seed=3, out_dir=tmp_path)
    data = _strict_json(tmp_path / "fake_good" / METRICS_FILE)
    assert data == json.loads(json.dumps(rec))
    for key in (
        "experiment",
        "quick",
        "seed",
        "elapsed_s",
        "config",
        "claims",
        "series",
        "status",
        "error",
    ):
        assert key in data, key
    assert data["experiment"] == "fake_good" and data["quick"] is True and data["seed"] == 3
    assert data["status"] == "ok" and data["error"] is None
    assert data["config"] == {"n": 8, "scale": 0.5}
    assert len(data["series"]["x"]) == 8
    assert data["series"]["special"] == [None, "inf", "-inf", 1.0]
    assert data["results"]["count"] == 3 and len(data["results"]["sweep"]) == 4
    assert [c["holds"] for c in data["claims"]] == [True, False, False]
    assert set(data["claims"][0]) >= {"id", "statement", "value", "op", "threshold", "holds"}
    assert data["figures"] == ["good.png"]
    assert (tmp_path / "fake_good" / "good.png").read_bytes()[:4] == b"\x89PNG"
    assert data["description"].startswith("A fake experiment")
    assert not [p for p in (tmp_path / "fake_good").iterdir() if p.name.endswith(".tmp")]


def test_relative_out_dir_keeps_figures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--out results` (relative, as in the README): figures are recorded and rendered."""
    monkeypatch.chdir(tmp_path)
    rec = run_experiment("fake_good", _target(GoodExp), quick=True, seed=3, out_dir="results")
    assert rec["status"] == "ok", rec["error"]
    assert rec["figures"] == ["good.png"]
    md_path, html_path = report.write_report([rec], "results")
    assert "missing figure" not in html_path.read_text()
    assert "data:image/png;base64," in html_path.read_text()
    assert "](fake_good/good.png)" in md_path.read_text()
    assert (tmp_path / "results" / "fake_good" / "good.png").is_file()


def test_quick_field_config(tmp_path: Path) -> None:
    rec = run_experiment("qf", _target(QuickFieldExp), quick=True, seed=0, out_dir=tmp_path)
    assert rec["status"] == "ok", rec["error"]
    assert rec["config"] == {"quick": True, "scale": 1.0}
    assert len(rec["series"]["x"]) == 5


def test_errors_are_recorded_not_raised(tmp_path: Path) -> None:
    rec = run_experiment("fake_boom", _target(BoomExp), quick=True, seed=0, out_dir=tmp_path)
    data = _strict_json(tmp_path / "fake_boom" / METRICS_FILE)
    assert rec["status"] == data["status"] == "error"
    assert data["error"]["stage"] == "run" and data["error"]["type"] == "ValueError"
    assert "boom 42" in data["error"]["message"] and "boom 42" in data["error"]["traceback"]

    rec = run_experiment("bp", _target(BadPlotExp), quick=True, seed=0, out_dir=tmp_path)
    assert rec["error"]["stage"] == "plot" and len(rec["claims"]) == 3

    rec = run_experiment("missing", "no_such_module_xyz", quick=True, seed=0, out_dir=tmp_path)
    assert rec["error"]["stage"] == "load" and rec["error"]["type"] == "ModuleNotFoundError"


def test_determinism_for_a_seed(tmp_path: Path) -> None:
    a = run_experiment("fake_good", _target(GoodExp), quick=True, seed=11, out_dir=tmp_path / "a")
    b = run_experiment("fake_good", _target(GoodExp), quick=True, seed=11, out_dir=tmp_path / "b")
    c = run_experiment("fake_good", _target(GoodExp), quick=True, seed=12, out_dir=tmp_path / "c")
    assert _comparable(a) == _comparable(b)
    assert a["series"]["x"] != c["series"]["x"]


def test_parallel_map_seeding_and_validation() -> None:
    """jobs=2 equality is checked end to end in test_cli_jobs_2_equals_jobs_1 (one pool
    start-up is several seconds, so it is not repeated here)."""
    fn = partial(_noisy_sum, scale=2.0)
    one = parallel_map(fn, range(5), jobs=1, seed=7)
    assert one == parallel_map(fn, range(5), jobs=1, seed=7)
    assert one != parallel_map(fn, range(5), jobs=1, seed=8)
    state = torch.get_rng_state()
    parallel_map(fn, range(2), jobs=1, seed=7)
    assert torch.equal(state, torch.get_rng_state())  # caller's RNG untouched
    with pytest.raises(ValueError, match="jobs=0"):
        parallel_map(fn, range(2), jobs=0)


# --------------------------------------------------------------------------------------
# registry and CLI
# --------------------------------------------------------------------------------------


def test_registry_unknown_id_lists_valid(fakes: dict[str, str]) -> None:
    assert "fig1" in registry.experiment_ids() and "fake_good" in registry.experiment_ids()
    assert registry.resolve_ids(["fake_good", "fake_good"]) == ["fake_good"]
    assert "fig1" in registry.resolve_ids(["all"])
    with pytest.raises(registry.UnknownExperimentError, match=r"'nope'.*fig1.*'all'"):
        registry.resolve_ids(["nope"])
    with pytest.raises(ValueError, match="invalid experiment id"):
        registry.register("all", "x")


def test_cli_unknown_id_is_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli.main(["reproduce", "nope", "--out", str(tmp_path)]) == cli.ExitCode.USAGE
    err = capsys.readouterr().err
    assert "unknown experiment id 'nope'" in err and "fig1" in err


def test_cli_list(fakes: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "fig1" in out and "fake_good" in out and "A fake experiment" in out


def test_cli_reproduce_report_and_exit_codes(
    fakes: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r"
    # a crash in one experiment: the others still run, report shows it, exit code non-zero
    code = cli.main(["reproduce", "fake_good", "fake_boom", "--quick", "--out", str(out)])
    assert code == cli.ExitCode.EXPERIMENT_ERROR
    assert _strict_json(out / "fake_good" / METRICS_FILE)["status"] == "ok"
    assert _strict_json(out / "fake_boom" / METRICS_FILE)["error"]["message"] == "boom 42"
    md = (out / "report.md").read_text(encoding="utf-8")
    page = (out / "report.html").read_text(encoding="utf-8")
    good = _strict_json(out / "fake_good" / METRICS_FILE)
    for c in good["claims"]:
        assert c["id"] in md and c["id"] in page
    assert "three \\| things" in md and "mean exceeds 100" in page
    assert (
        report.HOLDS in md and report.FAILS in md and report.HOLDS in page and report.FAILS in page
    )
    assert "boom 42" in md and "boom 42" in page
    assert "![fake_good: good.png](fake_good/good.png)" in md
    assert page.count("data:image/png;base64,") == 1
    assert 'src="http' not in page and 'src="fake_good' not in page
    assert '"n": 8' in md  # config
    term = capsys.readouterr().out
    assert "fake_good" in term and "fake_boom" in term

    # failing claims are reported, not gating, unless --strict
    assert cli.main(["reproduce", "fake_good", "--quick", "--out", str(out)]) == cli.ExitCode.OK
    code = cli.main(["reproduce", "fake_good", "--quick", "--strict", "--out", str(out)])
    assert code == cli.ExitCode.CLAIMS_FAILED
    # report re-rendered from the directory
    (out / "report.md").unlink()
    assert cli.main(["report", str(out)]) == cli.ExitCode.EXPERIMENT_ERROR  # fake_boom is there
    assert "fake_boom" in (out / "report.md").read_text(encoding="utf-8")
    leftovers = [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    assert not leftovers


def test_cli_jobs_2_equals_jobs_1(fakes: dict[str, str], tmp_path: Path) -> None:
    ids = ["fake_good", "fake_good2", "fake_boom"]
    for jobs in ("1", "2"):
        code = cli.main(
            [
                "reproduce",
                *ids,
                "--quick",
                "--seed",
                "5",
                "--jobs",
                jobs,
                "--out",
                str(tmp_path / jobs),
            ]
        )
        assert code == cli.ExitCode.EXPERIMENT_ERROR
    for i in ids:
        one = _strict_json(tmp_path / "1" / i / METRICS_FILE)
        two = _strict_json(tmp_path / "2" / i / METRICS_FILE)
        if i == "fake_boom":
            assert one["error"]["message"] == two["error"]["message"] == "boom 42"
        else:
            assert _comparable(one) == _comparable(two)
    # one experiment with --jobs 2: its parallel_map sweep runs in 2 spawned workers and
    # gives the same numbers as the in-process sweep of --jobs 1
    cli.main(
        [
            "reproduce",
            "fake_good",
            "--quick",
            "--seed",
            "5",
            "--jobs",
            "2",
            "--out",
            str(tmp_path / "i"),
        ]
    )
    inner = _strict_json(tmp_path / "i" / "fake_good" / METRICS_FILE)
    assert inner["environment"]["jobs"] == 2
    assert _comparable(inner) == _comparable(
        _strict_json(tmp_path / "1" / "fake_good" / METRICS_FILE)
    )


def test_console_script_installed() -> None:
    exe = shutil.which("noetherflow")
    if exe is None:
        pytest.skip("console script not on PATH (package not installed)")
    proc = subprocess.run([exe, "list"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "fig1" in proc.stdout


def test_mnist_flag_validates_directory(tmp_path: Path) -> None:
    from noetherflow.cli import main

    assert (
        main(
            [
                "reproduce",
                "fig1",
                "--quick",
                "--out",
                str(tmp_path),
                "--mnist",
                str(tmp_path / "nope"),
            ]
        )
        == 2
    )


def test_overrides_reach_only_configs_that_have_the_field(tmp_path: Path) -> None:
    from noetherflow.experiments import registry, run_experiment

    rec = run_experiment(
        "fig1",
        registry.target("fig1"),
        quick=True,
        out_dir=tmp_path,
        overrides={"mnist_dir": "/x", "n_steps": 20},
    )
    assert rec["config"]["n_steps"] == 20 and "mnist_dir" not in rec["config"]


# --------------------------------------------------------------------------------------
# run context (no module-global state) and the record
# --------------------------------------------------------------------------------------


class JobsSeenExp(GoodExp):
    """Records the worker budget the experiment saw through default_jobs()."""

    @staticmethod
    def run(cfg: Any, seed: int, out_dir: Path) -> dict[str, Any]:
        ctx = current_context()
        return {"series": {}, "jobs": default_jobs(), "ctx_seed": ctx.seed}

    @staticmethod
    def claims(results: dict[str, Any], cfg: Any) -> list[Claim]:
        return []

    @staticmethod
    def plot(results: dict[str, Any], cfg: Any, out_dir: Path) -> list[Path]:
        return []


def test_run_context_is_scoped_to_the_run(tmp_path: Path) -> None:
    """The budget reaches the experiment and does not leak into the caller afterwards
    (the old harness set module globals that stayed set after run_experiment)."""
    assert default_jobs() == 1 and current_context() == RunContext()
    rec = run_experiment("js", _target(JobsSeenExp), seed=9, out_dir=tmp_path, jobs=3)
    assert rec["status"] == "ok", rec["error"]
    assert rec["results"] == {"jobs": 3, "ctx_seed": 9}
    assert default_jobs() == 1 and current_context() == RunContext()
    with use_context(RunContext(jobs=2, seed=4)):
        assert default_jobs() == 2 and current_context().seed == 4
    assert default_jobs() == 1
    for bad in ({"jobs": 0}, {"torch_threads": 0}, {"seed": -1}, {"jobs": True}):
        with pytest.raises(ValueError, match="expected an int"):
            RunContext(**bad)


def test_parallel_map_explicit_context_and_seed_validation() -> None:
    fn = partial(_noisy_sum, scale=2.0)
    via_ctx = parallel_map(fn, range(3), context=RunContext(jobs=1, seed=7))
    assert via_ctx == parallel_map(fn, range(3), jobs=1, seed=7)
    with pytest.raises(ValueError, match="seed=-2"):
        parallel_map(fn, range(2), seed=-2)


def test_record_keys_are_the_metrics_schema(tmp_path: Path) -> None:
    """One Record type writes both the normal and the crash record: same keys."""
    ok = run_experiment("fake_good", _target(GoodExp), quick=True, seed=3, out_dir=tmp_path)
    crashed = Record(experiment="x", target="t", quick=True, seed=0)
    crashed.fail("worker", RuntimeError("killed"))
    d = crashed.to_dict()
    assert set(d) == set(ok)
    assert d["status"] == "error" and d["error"]["stage"] == "worker"
    assert d["error"]["message"] == "killed" and "RuntimeError" in d["error"]["traceback"]
    json.dumps(d, allow_nan=False)


# --------------------------------------------------------------------------------------
# the reproduction-report contract: setup(cfg), PAPER, PAPER_ORDER, NOTES
# --------------------------------------------------------------------------------------


class PaperExp(GoodExp):
    """A fake experiment that states the paper's claim, its deviations and its history."""

    PAPER = "Fig. 9 (§5.1): the charge converges to its equilibrium value (eq. 15)."
    PAPER_ORDER = 5.1
    NOTES = "Tried η = 0.1: diverged in 2/3 seeds; η = 0.05 kept."

    @staticmethod
    def setup(cfg: Any) -> list[dict[str, str]]:
        return [
            {"quantity": "η", "paper": "0.1", "ours": "0.05", "why": "diverges at 0.1"},
            {"quantity": "steps", "paper": "10⁵", "ours": str(cfg.n), "why": "quick sizes"},
        ]


class BadSetupExp(PaperExp):
    """setup() raises."""

    @staticmethod
    def setup(cfg: Any) -> list[dict[str, str]]:
        raise KeyError("eta")


class WrongRowsExp(PaperExp):
    """setup() returns a row with a missing key."""

    @staticmethod
    def setup(cfg: Any) -> list[dict[str, str]]:
        return [{"quantity": "η", "paper": "0.1", "ours": "0.05"}]


class NonStrCellExp(PaperExp):
    """setup() returns a number where text is expected."""

    @staticmethod
    def setup(cfg: Any) -> list[dict[str, str]]:
        return [{"quantity": "η", "paper": "0.1", "ours": 0.05, "why": "x"}]  # type: ignore[dict-item]


class BadOrderExp(GoodExp):
    """PAPER_ORDER is not a number."""

    PAPER_ORDER = "Fig. 2"


def test_setup_paper_notes_are_recorded(tmp_path: Path) -> None:
    rec = run_experiment("paper", _target(PaperExp), quick=True, seed=0, out_dir=tmp_path)
    data = _strict_json(tmp_path / "paper" / METRICS_FILE)
    assert data == json.loads(json.dumps(rec))
    assert data["status"] == "ok", data["error"]
    assert data["paper"] == PaperExp.PAPER and data["paper_order"] == 5.1
    assert data["notes"] == PaperExp.NOTES
    assert data["setup"] == [
        {"quantity": "η", "paper": "0.1", "ours": "0.05", "why": "diverges at 0.1"},
        {"quantity": "steps", "paper": "10⁵", "ours": "8", "why": "quick sizes"},
    ]
    assert len(data["claims"]) == 3 and data["figures"] == ["good.png"]
    # an experiment without the optional attributes: empty defaults, not missing keys
    plain = run_experiment("plain", _target(GoodExp), quick=True, seed=0, out_dir=tmp_path)
    assert plain["setup"] == [] and plain["paper"] == "" and plain["notes"] == ""
    assert plain["paper_order"] is None


@pytest.mark.parametrize(
    ("cls", "stage", "match"),
    [
        (BadSetupExp, "setup", "eta"),
        (WrongRowsExp, "setup", "exactly the keys quantity, paper, ours, why"),
        (NonStrCellExp, "setup", "ours not str"),
        (BadOrderExp, "load", "PAPER_ORDER='Fig. 2'; expected a finite number"),
    ],
)
def test_setup_failures_are_recorded_like_any_stage(
    tmp_path: Path, cls: type, stage: str, match: str
) -> None:
    rec = run_experiment("x", _target(cls), quick=True, seed=0, out_dir=tmp_path)
    assert rec["status"] == "error" and rec["error"]["stage"] == stage
    assert match in rec["error"]["message"]
    assert rec["claims"] == []  # the run did not start


def test_runner_validates_its_budget_before_running(tmp_path: Path) -> None:
    """Invalid budgets are refused before any experiment starts (none is written); numpy
    integers are accepted as ints."""
    spec = [("fake_good", _target(GoodExp))]
    for bad in ({"seed": -1}, {"jobs": 0}, {"torch_threads": 0}, {"seed": 1.5}):
        with pytest.raises(ValueError, match="expected an int"):
            run_experiments(spec, quick=True, out_dir=tmp_path / "bad", **bad)
    assert not (tmp_path / "bad").exists()
    rec = run_experiment("g", _target(GoodExp), quick=True, seed=np.int64(3), out_dir=tmp_path)
    assert rec["status"] == "ok" and rec["seed"] == 3

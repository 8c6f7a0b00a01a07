"""Issue #30's contract: every claim has a kind (paper / printed / beyond) and every failing
claim a why; run histories are data beside the experiments (notes/<module>.md), not code."""

from __future__ import annotations

import ast
import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from noetherflow.experiments import registry
from noetherflow.experiments._base import (
    METRICS_FILE,
    NOTES_DIR,
    notes_file,
    notes_of,
    run_experiment,
)
from noetherflow.experiments._claims import KINDS, Claim, Kind

ROOT = Path(__file__).resolve().parents[1]


def test_kind_parse_and_errors() -> None:
    assert Claim("a", "s", 1.0, "<", 2.0).kind is None
    assert Claim("a", "s", 1.0, "<", 2.0, kind="printed").kind is Kind.PRINTED
    with pytest.raises(ValueError, match="unknown claim kind 'ours'; expected one of"):
        Claim("a", "s", 1.0, "<", 2.0, kind="ours")
    with pytest.raises(TypeError, match="why=3; expected a str"):
        Claim("a", "s", 1.0, "<", 2.0, why=3)  # type: ignore[arg-type]
    c = Claim("a", "s", 3.0, "<", 2.0, kind="beyond", why="3 > 2 because of x")
    back = Claim.from_dict(json.loads(json.dumps(c.to_dict())))
    assert back == c and back.with_kind("paper").kind is Kind.BEYOND  # explicit kind kept
    assert KINDS == ("paper", "printed", "beyond")


class _Exp:
    @dataclass(frozen=True)
    class Config:
        n: int = 1

        @classmethod
        def quick(cls) -> Any:
            return cls()

    KIND = "beyond"

    @staticmethod
    def run(cfg: Any, seed: int, out_dir: Path) -> dict[str, Any]:
        return {"series": {}}

    @staticmethod
    def claims(results: dict[str, Any], cfg: Any) -> list[Claim]:
        return [
            Claim("default", "s", 1.0, "<", 2.0),
            Claim("printed", "s", 3.0, "<", 2.0, kind=Kind.PRINTED, why="3 is the printed form"),
        ]

    @staticmethod
    def plot(results: dict[str, Any], cfg: Any, out_dir: Path) -> list[Path]:
        return []


class _PaperExp(_Exp):
    KIND = None


def test_runner_fills_the_experiment_kind(tmp_path: Path) -> None:
    rec = run_experiment("k", f"{__name__}:_Exp", out_dir=tmp_path)
    kinds = {c["id"]: c["kind"] for c in rec["claims"]}
    assert kinds == {"default": "beyond", "printed": "printed"}
    assert rec["claims"][1]["why"] == "3 is the printed form"
    on_disk = json.loads((tmp_path / "k" / METRICS_FILE).read_text())
    assert on_disk["claims"] == rec["claims"] and on_disk["cpu_s"] >= 0
    assert {"platform", "torch", "numpy", "python"} <= set(on_disk["environment"])
    plain = run_experiment("p", f"{__name__}:_PaperExp", out_dir=tmp_path)
    assert plain["claims"][0]["kind"] == "paper"


@pytest.mark.parametrize("exp_id", registry.experiment_ids())
def test_history_is_data_beside_the_experiment(exp_id: str) -> None:
    mod = registry.load(exp_id)
    path = notes_file(mod)
    assert path is not None and path.parent.name == NOTES_DIR and path.is_file(), exp_id
    assert len(notes_of(mod)) > 80
    tree = ast.parse(inspect.getsource(mod))
    assigns = [n for n in tree.body if isinstance(n, ast.Assign)]
    names = {t.id for n in assigns for t in n.targets if isinstance(t, ast.Name)}
    assert "NOTES" not in names, f"{exp_id}: the history belongs in {path.name}, not in code"
    kind = getattr(mod, "KIND", None)
    assert kind is None or Kind(kind)


def test_notes_and_templates_are_package_data() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python ≥ 3.11
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = data["tool"]["setuptools"]["package-data"]["noetherflow"]
    assert "experiments/notes/*.md" in globs and "report/templates/*.j2" in globs
    deps = " ".join(data["project"]["dependencies"])
    assert "jinja2" in deps and "mlxtend" in deps


def failing_without_why(out_dir: Path) -> list[str]:
    """``experiment/claim`` of every failing claim without a why in a results directory."""
    missing = []
    for path in sorted(out_dir.glob(f"*/{METRICS_FILE}")):
        rec = json.loads(path.read_text())
        for c in rec.get("claims", []):
            if not c.get("holds") and not c.get("why"):
                missing.append(f"{rec['experiment']}/{c['id']}")
    return missing


def test_every_failing_claim_of_a_run_says_why(reproduce: Any, metrics: Any) -> None:
    """A real quick run of cheap experiments with failing claims (teleport-fig4 fails three,
    eq15 two printed forms): each failing claim carries its measured cause."""
    out = reproduce("teleport-fig4", "eq15", "thm-d1")
    assert failing_without_why(out) == []
    ids = ("teleport-fig4", "eq15", "thm-d1")
    fails = [c for i in ids for c in metrics(out, i)["claims"] if not c["holds"]]
    assert fails and all(c["kind"] in KINDS for c in fails)

"""The README's main command: the demo lands at the equilibrium with outputs unchanged."""

from rich.console import Console

from noetherflow.cli import main
from noetherflow.demo import run_demo


def test_demo_flow_vanishes_and_outputs_unchanged() -> None:
    res = run_demo(seed=1, batch=128, console=Console(quiet=True))
    assert res["flow_before"] > 1e-8
    assert res["flow_after"] < 1e-10 * res["flow_before"] * 1e3
    assert res["output_change"] < 1e-12


def test_demo_cli_exit_code() -> None:
    assert main(["demo", "--seed", "0"]) == 0

"""The README's example runs as written and lands at the equilibrium."""

from __future__ import annotations

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs_and_flows_vanish(capsys: object) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    example = next(b for b in blocks if "nf.solve_equilibrium" in b)
    ns: dict[str, object] = {}
    exec(compile(example, "README.md", "exec"), ns)
    nf = ns["nf"]
    model, syms, x, y, hyper = ns["model"], ns["syms"], ns["x"], ns["y"], ns["hyper"]
    # after handle.undo() the model is back: teleport again with the example's solution
    stats = nf.collect_stats(model, syms, ns["loss_fn"], x, y)  # type: ignore[attr-defined]
    before = nf.noether_flow(syms, stats, **hyper)  # type: ignore[attr-defined]
    nf.teleport(model, ns["sol"])  # type: ignore[attr-defined]
    stats = nf.collect_stats(model, syms, ns["loss_fn"], x, y)  # type: ignore[attr-defined]
    after = nf.noether_flow(syms, stats, **hyper)  # type: ignore[attr-defined]
    for k in before:
        assert float(torch.as_tensor(after[k]).norm()) < 1e-8 * float(before[k].norm())

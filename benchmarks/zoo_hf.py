"""Detection over Hugging Face model types, every claim checked independently (issue 26).

```
OMP_NUM_THREADS=1 python benchmarks/zoo_hf.py [--only NAME ...] [--markdown]
```

For each model of ``tests/hf_zoo.py`` (tiny configs, random init, float64), in eval and in
train mode: ``find_symmetries`` on one batch, then every claimed symmetry is applied with a
random element of size 0.5 to the model and the outputs compared on two batches detection
has not seen (:func:`hf_zoo.independent_change`, written apart from the library's checker;
scale invariances with every eps set to ~0, where they are exact). Columns:

* ``found``: claimed symmetries (by family); ``verified``: marked verified;
* ``hold``: claims whose independent change is ≤ 1e-8 in the mode they were found in, on
  both unseen batches (a claim that fails is a false claim and is listed);
* ``params``: parameters (tensors) with a symmetry / all trainable;
* ``not analysed``: parameters with no symmetry, by the first reason of the coverage report
  (a parameter without a symmetry and without a reason is listed as NO REASON GIVEN).

``--markdown`` prints the table for docs/concepts/detection.md.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import hf_zoo as Z

from noetherflow import find_symmetries

HOLD = 1e-8


def run(name: str) -> dict[str, object]:
    torch.manual_seed(0)
    model, make = Z.MODELS[name]()
    model = model.to(torch.float64)
    row: dict[str, object] = {"model": name, "false": []}
    t0 = time.perf_counter()
    for train in (False, True):
        model.train(train)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            syms = find_symmetries(model, make(0))
        mode = "train" if train else "eval"
        fam = Counter(s.family.value for s in syms)
        ok = 0
        for s in syms:
            zero = s.family.value == "scale"
            worst = max(Z.independent_change(model, s, make(k), train, zero) for k in (1, 2))
            if worst <= HOLD:
                ok += 1
            else:
                row["false"].append(f"{mode} {s.label} ({worst:.2g})")  # type: ignore[union-attr]
        cov = syms.coverage(model)
        with_sym = sum(1 for p in cov.params if p.symmetries)
        row.setdefault("no reason", []).extend(  # type: ignore[union-attr]
            f"{mode} {p.name}" for p in cov.params if not p.symmetries and not p.reasons
        )
        reasons = Counter(
            (p.reasons[0].split(":")[0][:60] if p.reasons else "?")
            for p in cov.params
            if not p.symmetries
        )
        row[mode] = {
            "found": len(syms),
            "families": dict(fam),
            "verified": sum(1 for r in syms.verification.values() if r.verified),
            "hold": ok,
            "params": f"{with_sym}/{len(cov.params)}",
            "reasons": reasons.most_common(2),
        }
    row["seconds"] = time.perf_counter() - t0
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", help="model names of tests/hf_zoo.py")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    names = args.only or list(Z.MODELS)
    rows = [run(n) for n in names]
    if args.markdown:
        print(
            "| model | eval: found / verified / hold | train: found / verified / hold | "
            "params with a symmetry (eval) |"
        )
        print("|---|---|---|---|")
    total_false = 0
    for r in rows:
        e, t = r["eval"], r["train"]  # type: ignore[index]
        total_false += len(r["false"])  # type: ignore[arg-type]
        if args.markdown:
            print(
                f"| {r['model']} | {e['found']} / {e['verified']} / {e['hold']} | "
                f"{t['found']} / {t['verified']} / {t['hold']} | {e['params']} |"
            )
        else:
            print(
                f"{r['model']:12s} eval {e['found']:3d} {e['families']} verified "
                f"{e['verified']} hold {e['hold']} params {e['params']} | train "
                f"{t['found']:3d} verified {t['verified']} hold {t['hold']} | "
                f"{r['seconds']:.1f}s"
            )
            print(f"{'':12s} not analysed (eval): {e['reasons']}")
        for f in r["false"]:  # type: ignore[union-attr]
            print(f"  FALSE CLAIM: {f}")
        for f in r["no reason"]:  # type: ignore[union-attr]
            print(f"  NO REASON GIVEN: {f}")
    print(f"{len(rows)} models, {total_false} false claims")
    return 1 if total_false else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Which keys a monitor records and the shape of each (fixed for the whole run)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from noetherflow.flow import charges
from noetherflow.kernels import kernel_for
from noetherflow.symmetry.set import SymmetrySet

__all__ = ["STEP_PARTS", "UNDEFINED", "build_schema"]

STEP_PARTS = ("decay", "drift", "noise")  # keys step_<part>/<sym> (optim.decompose)

#: The ``undefined`` entry of a row: why its flows and distances are NaN (0: they are defined
#: or not recorded at all). Written to ``monitor.json`` as ``undefined_codes``.
UNDEFINED = {
    0: "defined",
    1: "lr is 0 (a warmup from 0 or a schedule that reached 0): no SGD noise, the flows' "
    "time model and the equilibrium are undefined",
    2: "fewer than 2 samples in the step: the gradient covariance is undefined",
    3: "non-finite gradient statistics (NaN/Inf: the run diverged or overflowed)",
    4: "no forward/backward inside mon.track() on this record step: no statistics",
}


def build_schema(
    syms: SymmetrySet,
    keys: Mapping[str, str],
    *,
    full_matrices: bool,
    flows: bool,
    distance: bool,
    sharpness: bool,
    steps: bool,
    adamw: Sequence[str] = (),
) -> dict[str, tuple[int, ...]]:
    """``key → shape`` of every recorded entry (see :mod:`noetherflow.monitor`).

    ``flows``: flow columns; ``distance``: distance columns; ``steps``: the step
    decomposition; ``adamw``: names of the symmetries with AdamW's prediction.
    """
    sch: dict[str, tuple[int, ...]] = {
        "step": (),
        "time": (),
        "monitor_time": (),
        "loss": (),
        "lr": (),
        "weight_decay": (),
    }
    if flows:
        sch["undefined"] = ()
    ch = charges(syms)
    kinds = ["charge"] + (["flow"] if flows else []) + [f"step_{p}" for p in STEP_PARTS if steps]
    for kind in kinds:
        for name, s in syms.items():
            shape, key = tuple(ch[name].shape), keys[name]
            matrix = kernel_for(s).matrix_valued
            sch[f"{kind}/{key}"] = () if matrix else shape
            if matrix and full_matrices:
                sch[f"{kind}_matrix/{key}"] = shape
    if distance:
        for name, s in syms.items():
            key = keys[name]
            sch[f"distance/{key}"] = kernel_for(s).distance_shape(s)
            sch[f"at_infinity/{key}"] = ()
        for k in ("distance_exact", "distance_converged", "distance_residual", "distance_sweeps"):
            sch[k] = ()
    for name in adamw:
        for kind in ("adamw_noise", "adamw_charge", "adamw_distance"):
            sch[f"{kind}/{keys[name]}"] = tuple(ch[name].shape)
    if sharpness:
        for k in ("trace", "trace_se", "top_eigenvalue"):
            sch[f"sharpness/{k}"] = ()
    return sch

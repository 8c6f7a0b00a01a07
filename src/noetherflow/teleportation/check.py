"""A teleport that checks itself: the outputs on a probe batch before and after (issue 26).

A teleport moves the parameters along symmetry orbits, so the model's function must not
change. Whatever could make it change — a normalisation whose eps detection never saw (a
functional or unregistered norm), a BatchNorm whose eval-mode statistics a train-mode
invariance does not preserve, a symmetry that holds only on the branch of the example —
:func:`check_teleport` measures it: the model's outputs on the probe batch, in training and
in eval mode, in the model's own dtype, before and after the teleport.

Which change is allowed:

* a solution kept within an eps tolerance τ (:func:`noetherflow.solve_within_eps`): the
  relative change may reach ``max(10·τ, round-off)``;
* an unchecked solution that moves scale invariances before a known normalisation (the
  teleport warns with :class:`~noetherflow.EpsWarning`): those normalisations' eps is set to
  ~0 for the comparison, so only the change eps does *not* explain counts;
* otherwise the round-off of the dtype (:data:`ROUND_OFF`).

Beyond it, the symmetries responsible are found by applying each step alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from noetherflow._errors import TeleportError
from noetherflow._inputs import Probe
from noetherflow.symmetry._fx.capture import flat_outputs

__all__ = ["ROUND_OFF", "FunctionChangedError", "check_teleport"]

# Default relative change allowed, by the model's dtype (round-off of a teleport).
ROUND_OFF = {torch.float64: 1e-8, torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}
CHECKS = ("raise", "warn", "off")


class FunctionChangedError(ValueError):
    """A teleport changed the model's outputs on the probe batch beyond the tolerance.

    The teleport has been undone (parameters and buffers restored) when this is raised.
    """


def model_dtype(model: nn.Module) -> torch.dtype:
    p = next((p for p in model.parameters() if p.is_floating_point()), None)
    return torch.float32 if p is None else p.dtype


def default_tolerance(model: nn.Module, eps_tolerance: float | None) -> float:
    """The relative change allowed (module docstring)."""
    tol = ROUND_OFF.get(model_dtype(model), 1e-4)
    return max(tol, 10 * eps_tolerance) if eps_tolerance is not None else tol


@contextmanager
def _zero_eps(norms: Sequence[nn.Module]) -> Iterator[None]:
    """The eps of ``norms`` set to ~0 (the smallest positive float: BatchNorm refuses 0)."""
    saved = []
    for m in norms:
        for attr in ("eps", "variance_epsilon"):
            v = getattr(m, attr, None)
            if isinstance(v, float) and v != 0:
                saved.append((m, attr, v))
                setattr(m, attr, torch.finfo(torch.float64).tiny)
    try:
        yield
    finally:
        for m, attr, v in saved:
            setattr(m, attr, v)


def _outputs(
    model: nn.Module, probe: Probe, seed: int, zero_eps_of: Sequence[nn.Module] = ()
) -> dict[bool, Tensor]:
    """Outputs in train and eval mode; mode, buffers and RNG state restored afterwards.

    The eps of ``zero_eps_of`` is set to ~0 for the forward passes: in training mode all of
    them, in eval mode those without running statistics (a BatchNorm's eval function is kept
    exactly with its own eps, since the teleport moves its running variance + eps).
    """
    was = model.training
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    batch = [m for m in zero_eps_of if getattr(m, "running_var", None) is None]
    out: dict[bool, Tensor] = {}
    try:
        for train in (True, False):
            model.train(train)
            with (
                _zero_eps(zero_eps_of if train else batch),
                torch.random.fork_rng(devices=[]),
                torch.no_grad(),
            ):
                torch.manual_seed(seed)
                out[train] = flat_outputs(probe.inputs(model)).detach().to(torch.float64)
            with torch.no_grad():
                for b, v in buffers:
                    b.copy_(v)
    finally:
        model.train(was)
    return out


def _rel(after: dict[bool, Tensor], before: dict[bool, Tensor]) -> dict[bool, float]:
    out = {}
    for k, b in before.items():
        a = after[k]
        if a.shape != b.shape:
            out[k] = math.inf
            continue
        d = float((a - b).norm() / b.norm().clamp_min(1e-300))
        out[k] = d if d == d else math.inf
    return out


def check_teleport(
    model: nn.Module,
    probe: Probe,
    apply: Callable[[Sequence[int] | None], None],
    restore: Callable[[], None],
    names: Sequence[str],
    *,
    tolerance: float,
    zero_eps_of: Sequence[nn.Module] = (),
    on_change: str = "raise",
    seed: int = 0,
) -> dict[bool, float]:
    """Apply a teleport and check that the outputs on ``probe`` do not change.

    Args:
        model: the model being teleported.
        probe: the inputs compared on.
        apply: ``apply(None)`` applies every step; ``apply([k])`` step ``k`` only.
        restore: puts the parameters and buffers back as before (the undo).
        names: the name of each step's symmetry.
        tolerance: largest relative change of the outputs allowed, per mode.
        zero_eps_of: normalisations whose eps is known to change the outputs (their eps is
            set to ~0 for the comparison).
        on_change: ``"raise"`` (undo, :class:`FunctionChangedError`), ``"warn"`` (keep the
            teleport, :class:`UserWarning`).
        seed: seeds dropout in the forward passes.

    Returns:
        The relative change per mode (``{True: train, False: eval}``), teleport applied.
    """
    # eps is zeroed for the forward passes only: a teleport applied meanwhile would move a
    # BatchNorm's running variance with the zeroed eps
    try:
        before = _outputs(model, probe, seed, zero_eps_of)
    except (RuntimeError, TypeError) as e:  # nothing applied yet: the model is unchanged
        first = (str(e).strip().splitlines() or [""])[0]
        raise TeleportError(
            f"teleport: the model cannot run on the probe ({probe.inputs.describe()}; the "
            f"model computes in {str(model_dtype(model)).removeprefix('torch.')}): "
            f"{type(e).__name__}: {first}. Nothing was moved. Expected inputs the model takes, "
            "as in training; pass probe= a batch of them, or check='off' to skip the check."
        ) from e
    if not all(bool(torch.isfinite(v).all()) for v in before.values()):
        apply(None)  # the probe does not give finite outputs: nothing to compare
        return {True: math.nan, False: math.nan}
    apply(None)
    rel = _rel(_outputs(model, probe, seed, zero_eps_of), before)
    if all(r <= tolerance for r in rel.values()):
        return rel
    restore()
    culprits = []
    for k, name in enumerate(names):
        apply([k])
        alone = _rel(_outputs(model, probe, seed, zero_eps_of), before)
        restore()
        worst = max(alone.values())
        if worst > tolerance:
            culprits.append((worst, name))
    culprits.sort(reverse=True)
    who = (
        ", ".join(f"{n} ({c:.2g})" for c, n in culprits[:5])
        + (f" and {len(culprits) - 5} more" if len(culprits) > 5 else "")
        if culprits
        else "none alone (their composition)"
    )
    msg = (
        f"teleport changed the model's outputs on the probe batch by {rel[True]:.2g} (train "
        f"mode) and {rel[False]:.2g} (eval mode), relative, beyond the tolerance "
        f"{tolerance:.2g}; symmetries responsible (change when applied alone): {who}. A "
        "teleport must not change the function: the symmetry may hold only on the example "
        "inputs or in the other mode, or a normalisation's eps that noetherflow does not know "
        "(a functional or unregistered norm) moved. Detect the symmetries again in the mode "
        "you train in, drop these from the set (syms.subset), or keep them within an eps "
        "tolerance (nf.solve_within_eps). check='warn' keeps such a teleport."
    )
    if on_change == "raise":
        raise FunctionChangedError("teleport undone: " + msg)
    apply(None)
    import warnings

    warnings.warn(msg, UserWarning, stacklevel=3)
    return rel

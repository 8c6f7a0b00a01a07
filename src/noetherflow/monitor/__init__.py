"""Watch Noether charges, their noise-driven flows and the distance to the noise equilibrium.

:class:`NoetherMonitor` rides on the caller's own forward/backward pass (``nf.capture``, or
another estimator): on a record step (every ``every`` steps) it collects the gradient
statistics of the batch, and :meth:`NoetherMonitor.step` turns them into a row. Keys use the
symmetry's ASCII key ``<sym>`` (:func:`symmetry_key`):

* ``loss`` (the global-batch mean under DDP), ``lr`` and ``weight_decay`` (the η, γ used);
* ``charge/<sym>`` — C = θᵀAθ per generator (eq. 6); a rotation's ``[d, d]`` matrix charge is
  logged as its Frobenius norm, the matrix itself as ``charge_matrix/<sym>`` on request;
* ``flow/<sym>`` — the flow −κC + Tr[A·M] of :func:`noetherflow.noether_flow` (same shapes);
* ``distance/<sym>`` — the distance to the noise equilibrium of
  :func:`noetherflow.solve_equilibrium`: |λ*| per generator (diagonal), ‖log P‖_F (rotation),
  |λ*| (dense); ``inf`` at infinity, with the number of such directions in
  ``at_infinity/<sym>``; ``distance_exact`` says whether this row's distances come from a
  converged full solve (1) or not (0: the first-order update between full solves, or a
  provisional row), ``distance_converged`` whether they are converged (0: the first estimate
  or a coupled solve spread over records, not converged yet; ``distance_residual`` its
  largest relative flow, ``distance_sweeps`` its sweeps so far);
* ``step_decay/<sym>``, ``step_drift/<sym>``, ``step_noise/<sym>`` — the exact decomposition
  of the optimizer step that led to this row's charges (``optimizer=`` only);
* ``adamw_charge/<sym>``, ``adamw_noise/<sym>`` — AdamW's random-walk equilibrium charge and
  the measured E[nᵀAn] behind it (AdamW, scale-invariant symmetries);
* ``sharpness/trace``, ``sharpness/trace_se``, ``sharpness/top_eigenvalue`` — optional;
* ``step``, ``time`` (seconds since the start) and ``monitor_time`` (this row's overhead).

Rooms, one job each: :mod:`.core` (the training-loop API), :mod:`.schema` (which keys, what
shapes), :mod:`.rows` (filling a row), :mod:`.distance` (when to solve, the first-order update
in between, the coupled solve spread over records), :mod:`.first_order` (the math of that
update), :mod:`.estimate` (the first estimate for coupled sets), :mod:`.steps` (the optimizer-step
decomposition and AdamW's prediction), :mod:`.options` (options and their checks).
"""

from noetherflow.monitor.core import NoetherMonitor
from noetherflow.monitor.history import flat_record, load_history, symmetry_key
from noetherflow.monitor.options import DistanceOptions, LogOptions, SharpnessOptions
from noetherflow.plotting import plot_history

__all__ = [
    "DistanceOptions",
    "LogOptions",
    "NoetherMonitor",
    "SharpnessOptions",
    "flat_record",
    "load_history",
    "plot_history",
    "symmetry_key",
]

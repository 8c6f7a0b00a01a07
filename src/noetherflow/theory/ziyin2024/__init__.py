"""Closed-form predictions of Ziyin et al. (2024), in noetherflow's conventions.

The paper is "Parameter Symmetry and Noise Equilibrium of Stochastic Gradient Descent"; the
conventions are those of the docs' Concepts pages (docs/concepts/flow.md).

Conventions (they override the paper where the two differ):

* per-sample loss ``ℓ_i``; the minibatch loss is the mean over ``S`` samples drawn with
  replacement; weight decay is ``γ‖θ‖²`` added to the loss (gradient ``2γθ``);
* discrete SGD: ``θ' = (1 − 2ηγ)θ − ηg``. For a symmetry generator ``A`` and charge
  ``C = θᵀAθ`` the expected flow is ``E[ΔC] = −κC + η² Tr[A(ḡḡᵀ + Σ/S)]`` with
  ``κ = 4ηγ(1 − ηγ)``, ``ḡ`` the full-batch gradient of the data loss and ``Σ`` the per-sample
  gradient covariance;
* continuous time (SGF, Itô, ``σ² = η/(2S)``, time ``t = η · steps``):
  ``dC/dt = −4γC + (η/S) Tr[ΣA] = −4γC + 2σ² Tr[ΣA]``. The paper's eq. (7) (and
  appendix eqs. 27, 31) writes ``σ² Tr[ΣA]``; Itô's lemma applied to its own eq. (1) gives
  ``2σ²``.

The two-layer linear net is ``f(x) = UWx`` with ``U`` of shape ``[d_y, d]`` and ``W`` of shape
``[d, d_x]``; the per-sample loss is the paper's eq. (12), ``ℓ = ‖UWx − y‖²`` (sum over
outputs) unless a function takes a ``reduction`` argument. Second moments are
``Σ_x = E[xxᵀ]`` and ``Σ_ε = E[εεᵀ]``.

Every function is pure. Matrix functions take and return ``torch.Tensor`` (use float64);
scalar formulas take and return Python floats.

The functions live in one submodule per topic (``charge_dynamics``: eqs. 7, 9 and §4.2;
``two_layer``: Thm 5.2; ``sharpness``: Prop 5.3 and eq. 15; ``scale_invariance``: eq. 24;
``deep_linear``: Thm 5.4; ``rank_one``: Prop 5.1; ``approximate_symmetry``: §5.4) and are all
re-exported here. Like the rest of :mod:`noetherflow.theory` they import nothing from the
library: they are the oracle its measurements are checked against.
"""

from noetherflow.theory.ziyin2024._common import (
    InitScheme,
    LossScaling,
    TimeScale,
)
from noetherflow.theory.ziyin2024.approximate_symmetry import (
    approximate_symmetry_charge_shift_large_zeta,
    approximate_symmetry_charge_shift_small_zeta,
    approximate_symmetry_displacement,
    approximate_symmetry_flow,
)
from noetherflow.theory.ziyin2024.charge_dynamics import (
    charge_relaxation_rate,
    equilibration_time,
    equilibrium_charge,
    kappa,
)
from noetherflow.theory.ziyin2024.deep_linear import (
    DeepLinearSolution,
    deep_linear_balance_gaps,
    deep_linear_intermediate_norm_sq,
    deep_linear_sgd_solution,
    paper_eq19_norm_sq,
)
from noetherflow.theory.ziyin2024.rank_one import (
    rank_one_balance_decay_rate,
    rank_one_balance_factor,
    rank_one_gradient_moments,
)
from noetherflow.theory.ziyin2024.scale_invariance import (
    scale_invariant_equilibrium_norm_sq,
    scale_invariant_norm_sq,
)
from noetherflow.theory.ziyin2024.sharpness import (
    init_variances,
    sharpness_at_end_autoencoder,
    sharpness_at_init,
    two_layer_hessian_trace,
    two_layer_sgd_sharpness,
)
from noetherflow.theory.ziyin2024.two_layer import (
    TwoLayerSolution,
    two_layer_balanced_solution,
    two_layer_charge_flow,
    two_layer_equilibrium_gap,
    two_layer_gammas_at_minimum,
    two_layer_noise_equilibrium,
    two_layer_noise_factors,
    two_layer_sgd_solution,
    weight_decay_ridge,
)

__all__ = [
    "DeepLinearSolution",
    "InitScheme",
    "LossScaling",
    "TimeScale",
    "TwoLayerSolution",
    "approximate_symmetry_charge_shift_large_zeta",
    "approximate_symmetry_charge_shift_small_zeta",
    "approximate_symmetry_displacement",
    "approximate_symmetry_flow",
    "charge_relaxation_rate",
    "deep_linear_balance_gaps",
    "deep_linear_intermediate_norm_sq",
    "deep_linear_sgd_solution",
    "equilibration_time",
    "equilibrium_charge",
    "init_variances",
    "kappa",
    "paper_eq19_norm_sq",
    "rank_one_balance_decay_rate",
    "rank_one_balance_factor",
    "rank_one_gradient_moments",
    "scale_invariant_equilibrium_norm_sq",
    "scale_invariant_norm_sq",
    "sharpness_at_end_autoencoder",
    "sharpness_at_init",
    "two_layer_balanced_solution",
    "two_layer_charge_flow",
    "two_layer_equilibrium_gap",
    "two_layer_gammas_at_minimum",
    "two_layer_hessian_trace",
    "two_layer_noise_equilibrium",
    "two_layer_noise_factors",
    "two_layer_sgd_sharpness",
    "two_layer_sgd_solution",
    "weight_decay_ridge",
]

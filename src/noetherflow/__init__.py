"""noetherflow: parameter symmetries, Noether charges and the noise equilibrium of SGD.

Implements "Parameter Symmetry and Noise Equilibrium of Stochastic Gradient Descent"
(Ziyin et al.). Conventions (weight decay γ‖θ‖², the continuous-time factor η/S) are those
of the docs' Concepts pages (docs/concepts/flow.md says where they differ from the paper).
"""

import lazy_loader as _lazy

__version__ = "0.1.0"

# The public names and their modules are those of __init__.pyi; each is imported on first use.
__getattr__, __dir__, __all__ = _lazy.attach_stub(__name__, __file__)

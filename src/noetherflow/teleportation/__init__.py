"""Teleportation: move a model along its symmetry orbits to the noise equilibrium.

One job per module: :mod:`.apply` (``teleport``: apply a solution, undo it, the fingerprint
check), :mod:`.check` (the outputs on a probe batch before and after), :mod:`.eps` (the
equilibrium within a normalisation's eps: ``clip_to_eps``, ``solve_within_eps``),
:mod:`.optimizer_state` (``.grad`` and optimizer state carried along the orbit) and
:mod:`.tool` (the training tool: ``EquilibriumTeleport``, ``TeleportingOptimizer``).

The public names are those of :mod:`noetherflow` (``nf.teleport``, ``nf.EquilibriumTeleport``,
…); this package is named ``teleportation`` so that no module shadows the function
``noetherflow.teleport``.
"""

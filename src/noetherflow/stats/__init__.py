"""Gradient statistics: estimators (hooks, reference, micro-batch), layer registry, DDP."""

from noetherflow.stats.registry import LayerHandler, register_layer, registered_layers

__all__ = ["LayerHandler", "register_layer", "registered_layers"]

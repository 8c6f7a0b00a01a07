"""Modules that a model calls without owning them: Hugging Face hub-kernel wrappers.

With the ``kernels`` package installed, ``transformers`` turns some plain functions into
``nn.Module`` instances (``@use_kernel_forward_from_hub`` on a function, e.g. Llama's
``apply_rotary_pos_emb``) and gives every attention module a private copy of them kept
outside the module tree (``@use_kernelized_func``). torch.fx refuses to call a module that is
not a submodule of the root ("module is not installed as a submodule"), so the tracers call
:func:`out_of_tree_call` instead: the function a wrapper stands for becomes a
``call_function`` node (the engine knows ``apply_rotary_pos_emb`` by name), and any other
module outside the tree is traced through as the code it runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torch import nn

__all__ = ["out_of_tree_call", "wrapped_function"]


def wrapped_function(m: nn.Module) -> Callable[..., Any] | None:
    """The plain function a hub-kernel function module ``m`` stands for, else None.

    ``kernels`` builds such a module from a closure over the function (its class defines
    ``forward`` inside the decorator, with the function as the free variable ``func``) and
    marks the class with ``kernel_layer_name``. Nothing else is assumed of the package.
    """
    cls = type(m)
    if not hasattr(cls, "kernel_layer_name"):
        return None
    forward = cls.__dict__.get("forward")
    if forward is None or not inspect.isfunction(forward):
        return None
    try:
        fn = inspect.getclosurevars(forward).nonlocals.get("func")
    except (TypeError, ValueError):
        return None
    return fn if inspect.isfunction(fn) else None


def out_of_tree_call(
    tracer: Any,
    m: nn.Module,
    forward: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    leaf_functions: frozenset[str],
) -> Any:
    """What ``tracer.call_module`` does for a module ``m`` outside the root's tree.

    A hub-kernel wrapper of a function named in ``leaf_functions`` becomes one
    ``call_function`` node of that function; a wrapper of another function is traced through
    that function; any other module through its ``forward``. A wrapper is traced as the
    plain function it wraps (the eager path ``transformers`` runs without ``kernelize``),
    never as a kernel: detection is about the function the model computes.
    """
    fn = wrapped_function(m)
    if fn is None:
        return forward(*args, **kwargs)
    if fn.__name__ in leaf_functions:
        return tracer.create_proxy("call_function", fn, args, kwargs)
    return fn(*args, **kwargs)

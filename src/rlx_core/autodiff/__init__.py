"""Automatic differentiation and batching as IR transformations.

Every transform takes a :class:`~rlx_core.ir.graph.Graph` and returns a new graph that any
backend compiles like any other::

    from rlx_core.autodiff import grad
    g = grad(model, "loss", ["w1", "w2"], params_to_inputs=True)
    Session("cpu").compile(g).run(x=..., w1=..., w2=...)   # -> loss, grad_w1, grad_w2

* :func:`grad`, :func:`value_and_grad`, :func:`vjp` (reverse mode), :func:`jvp` (forward mode),
  :func:`hvp` (forward-over-reverse), :func:`vmap` (batching), :func:`params_as_inputs`;
* rules: :func:`register_vjp`, :func:`register_jvp`, :func:`register_batch_rule` — every MIR op and
  the HIR ops have them (``rules.py``, ``hir_rules.py``, ``batching.py``); an op without a rule is
  differentiated/batched through its decomposition.
"""

from __future__ import annotations

from . import hir_rules as _hir_rules  # noqa: F401  (registers the HIR rules)
from . import rules as _rules  # noqa: F401  (registers the MIR rules)
from .batching import batch_node, vmap
from .registry import (
    BATCH_RULES,
    JVP_RULES,
    VJP_RULES,
    get_batch_rule,
    get_jvp,
    get_vjp,
    register_batch_rule,
    register_jvp,
    register_vjp,
)
from .transforms import Trace, grad, hvp, jvp, params_as_inputs, prune, value_and_grad, vjp

__all__ = ["BATCH_RULES", "JVP_RULES", "VJP_RULES", "Trace", "batch_node", "get_batch_rule", "get_jvp",
           "get_vjp", "grad", "hvp", "jvp", "params_as_inputs", "prune", "register_batch_rule",
           "register_jvp", "register_vjp", "value_and_grad", "vjp", "vmap"]

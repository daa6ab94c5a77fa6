"""The kernel cost model: a roofline default that a plugin overrides per kernel.

time(kernel) = launch_overhead + max(flops / peak_flops[dtype], bytes / mem_bandwidth)
time(graph)  = sum of kernel times + bytes moved over the host link / host_link_bandwidth

Below the runtime, which prices every dispatch with it; ranking whole devices by running the
planner is :mod:`rlx_core.cost`, above the runtime.
"""

from __future__ import annotations

from typing import Any

from .errors import PluginError
from .ir.schema import REGISTRY
from .records import DeviceCaps, KernelClaim, NodeVariant


def roofline(v: NodeVariant, caps: DeviceCaps) -> float:
    schema = REGISTRY.get(v.op)
    flops = schema.flops(v.in_types, v.out_types, v.attrs)
    nbytes = sum(t.nbytes() for t in v.in_types) + sum(t.nbytes() for t in v.out_types)
    dt = v.out_types[0].dtype if v.out_types else v.in_types[0].dtype
    return caps.launch_overhead + max(flops / caps.peak(dt), nbytes / caps.mem_bandwidth)


def kernel_cost(backend: Any, claim: KernelClaim, v: NodeVariant, caps: DeviceCaps) -> float:
    """Claim's own cost model, then the plugin's ``rlx_kernel_cost`` hook, then the roofline."""
    if claim.cost is not None:
        c = claim.cost(v, caps)
    else:
        c = backend.call("rlx_kernel_cost", claim=claim, variant=v, caps=caps)
    if c is None:
        return roofline(v, caps)
    if not isinstance(c, (int, float)) or c <= 0 or c != c:
        raise PluginError(f"backend {backend.name!r} estimated cost {c!r} for {v.describe()}",
                          fix="a kernel cost is a positive number of seconds")
    return float(c)


def transfer_cost(nbytes: int, caps: DeviceCaps) -> float:
    if caps.host_link_bandwidth is None:
        return 0.0
    return caps.launch_overhead + nbytes / caps.host_link_bandwidth

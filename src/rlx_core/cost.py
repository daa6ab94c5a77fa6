"""The kernel cost model: a roofline default that a plugin overrides per kernel.

time(kernel) = launch_overhead + max(flops / peak_flops[dtype], bytes / mem_bandwidth)
time(graph)  = sum of kernel times + bytes moved over the host link / host_link_bandwidth
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import BackendNotFoundError, DispatchError, PluginError
from .ir.graph import Graph
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


@dataclass(frozen=True)
class DeviceEstimate:
    device: str
    seconds: float | None
    kernels: float = 0.0
    transfers: float = 0.0
    error: str = ""


def estimate(graph: Graph, device: str, *, hub: Any = None) -> DeviceEstimate:
    """Estimated seconds to run ``graph`` once on ``device`` (kernels + host transfers)."""
    from .runtime import Session

    try:
        sess = Session(device, hub=hub, use_cache=False)
        report = sess.plan(graph)
    except (DispatchError, BackendNotFoundError, PluginError) as e:
        return DeviceEstimate(device, None, error=e.what.splitlines()[0])
    return DeviceEstimate(device, report.total_seconds, report.kernel_seconds, report.transfer_seconds)


def rank_devices(graph: Graph, candidates: Sequence[str] | None = None, *, hub: Any = None
                 ) -> list[DeviceEstimate]:
    from .hub import hub as get_hub

    h = hub or get_hub()
    names = list(candidates) if candidates is not None else h.names()
    ests = [estimate(graph, n, hub=h) for n in names]
    return sorted(ests, key=lambda e: (e.seconds is None, e.seconds or 0.0))


def fastest_device(graph: Graph, candidates: Sequence[str] | None = None, *, hub: Any = None) -> str:
    """The available device with the lowest estimated total time, transfers included."""
    ranked = rank_devices(graph, candidates, hub=hub)
    if not ranked or ranked[0].seconds is None:
        why = "; ".join(f"{e.device}: {e.error}" for e in ranked) or "no backends installed"
        raise BackendNotFoundError(f"no installed backend can run graph {graph.name!r} ({why})",
                                   fix="run `rlx doctor`; install rlx-cpu for the default backend")
    return ranked[0].device

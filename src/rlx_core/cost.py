"""Ranking devices by estimated time: each candidate plans the graph with the cost model.

time(kernel) = launch_overhead + max(flops / peak_flops[dtype], bytes / mem_bandwidth)
time(graph)  = sum of kernel times + bytes moved over the host link / host_link_bandwidth

The per-kernel model lives in :mod:`rlx_core.costmodel` (below the runtime, which prices every
dispatch with it) and is re-exported here; this module plans through a :class:`Session`, so it
sits above the runtime.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._hub import hub as get_hub
from .costmodel import kernel_cost, roofline, transfer_cost
from .errors import BackendNotFoundError, DispatchError, PluginError
from .ir.graph import Graph
from .runtime import Session

__all__ = ["DeviceEstimate", "choose_device", "estimate", "fastest_device", "kernel_cost", "rank_devices",
           "roofline", "transfer_cost"]


@dataclass(frozen=True)
class DeviceEstimate:
    device: str
    seconds: float | None
    kernels: float = 0.0
    transfers: float = 0.0
    error: str = ""
    #: The device's figures are known to be off (``DeviceCaps.unreliable``): why, or "".
    unreliable: str = ""


def estimate(graph: Graph, device: str, *, hub: Any = None) -> DeviceEstimate:
    """Estimated seconds to run ``graph`` once on ``device`` (kernels + host transfers)."""
    try:
        sess = Session(device, hub=hub, use_cache=False)
        report = sess.plan(graph)
    except (DispatchError, BackendNotFoundError, PluginError) as e:
        return DeviceEstimate(device, None, error=e.what.splitlines()[0])
    return DeviceEstimate(device, report.total_seconds, report.kernel_seconds, report.transfer_seconds,
                          unreliable=sess.device.caps.unreliable)


def rank_devices(graph: Graph, candidates: Sequence[str] | None = None, *, hub: Any = None
                 ) -> list[DeviceEstimate]:
    h = hub or get_hub()
    names = list(candidates) if candidates is not None else h.names()
    ests = [estimate(graph, n, hub=h) for n in names]
    return sorted(ests, key=lambda e: (e.seconds is None, e.seconds or 0.0))


def fastest_device(graph: Graph, candidates: Sequence[str] | None = None, *, hub: Any = None) -> str:
    """The available device with the lowest estimated total time, transfers included.

    A device whose figures are flagged unreliable (a software Vulkan device on plugin guesses, a
    calibration stored with --force) is chosen only when no other device can run the graph: an
    estimate known to be off must not send the first run to a device 10x slower than the next.
    """
    return choose_device(rank_devices(graph, candidates, hub=hub), graph.name)


def choose_device(ranked: Sequence[DeviceEstimate], graph_name: str = "graph") -> str:
    """The pick among ``rank_devices``' estimates (see :func:`fastest_device`)."""
    runnable = [e for e in ranked if e.seconds is not None]
    if not runnable:
        why = "; ".join(f"{e.device}: {e.error}" for e in ranked) or "no backends installed"
        raise BackendNotFoundError(f"no installed backend can run graph {graph_name!r} ({why})",
                                   fix="run `rlx doctor`; install rlx-cpu for the default backend")
    trusted = [e for e in runnable if not e.unreliable]
    return (trusted or runnable)[0].device

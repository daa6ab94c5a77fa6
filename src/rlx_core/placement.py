"""Placement over several devices, only when the user names several (``Session("cuda,cpu")``).

Each node goes to the first named device that can run it (native, common_ir or rewritten);
consecutive nodes on one device form a segment compiled by that device's backend. Every value
that crosses from one device to another is a transfer in the report. Nothing is placed on a
device the user did not name.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .costmodel import transfer_cost
from .dispatch import Illegal, Plan, variant_of
from .errors import DispatchError
from .execution import DEFAULT_MAX_SPECIALIZATIONS, SpecCache, bind_inputs, report_entry
from .ir.graph import Graph, Node, Value
from .report import DispatchReport, TransferEntry


@dataclass
class Segment:
    device_index: int
    graph: Graph
    #: value -> device name it comes from ("host" for graph inputs)
    sources: dict[str, str]


@dataclass
class Placement:
    segments: list[Segment]
    report: DispatchReport


def place(session: Any, graph: Graph, bindings: Mapping[str, int]) -> Placement:
    g = graph.specialize(dict(bindings)) if graph.symbols else graph
    devices = session.devices
    where: dict[str, int] = {}
    illegal: list[Illegal] = []
    for node in g.nodes:
        v = variant_of(g, node)
        tried: list[str] = []
        for i, (backend, device) in enumerate(devices):
            p = session.dispatcher(backend, device).plan(v)
            if isinstance(p, Plan):
                where[node.name] = i
                break
            tried += [f"[{device.name}] {t}" for t in p]
        else:
            illegal.append(Illegal(node.name, v, ",".join(d.name for _, d in devices), tuple(tried)))
    if illegal:
        names = ", ".join(d.name for _, d in devices)
        raise DispatchError(f"cannot place graph {g.name!r} on {names}: {len(illegal)} node(s) run on none "
                            "of them\n" + "\n".join(i.describe() for i in illegal), illegal=illegal,
                            where=f"devices {names}",
                            fix="add a device that supports these variants, or cast to supported dtypes")
    # Cut into segments of consecutive nodes on one device.
    groups: list[tuple[int, list[Node]]] = []
    for node in g.nodes:
        d = where[node.name]
        if groups and groups[-1][0] == d:
            groups[-1][1].append(node)
        else:
            groups.append((d, [node]))
    producer_dev: dict[str, str] = {v.name: "host" for v in g.inputs}
    params = {p.name for p in g.params}
    later_uses: list[set[str]] = []
    needed_after: set[str] = set(g.outputs)
    for _, nodes in reversed(groups):
        later_uses.append(set(needed_after))
        for n in nodes:
            needed_after.update(n.inputs)
    later_uses.reverse()
    segments: list[Segment] = []
    transfers: list[TransferEntry] = []
    entries = []
    for k, (d, nodes) in enumerate(groups):
        backend, device = devices[d]
        defined = {o for n in nodes for o in n.outputs}
        ext = [i for n in nodes for i in n.inputs if i not in defined and i not in params]
        ext = list(dict.fromkeys(ext))
        used_params = list(dict.fromkeys(i for n in nodes for i in n.inputs if i in params))
        outs = [o for n in nodes for o in n.outputs if o in later_uses[k]]
        sub = Graph(f"{g.name}#{k}@{device.name}", tuple(Value(x, g.types[x]) for x in ext),
                    tuple(Value(p, g.types[p]) for p in used_params), tuple(nodes), tuple(outs),
                    {p: g.weights[p] for p in used_params})
        sources = {x: producer_dev[x] for x in ext}
        for x, src in sources.items():
            if src != device.name and not (src == "host" and device.host_memory):
                nbytes = g.types[x].nbytes()
                transfers.append(TransferEntry(x, src, device.name, nbytes,
                                               transfer_cost(nbytes, device.caps)))
        for o in outs:
            producer_dev[o] = device.name
        segments.append(Segment(d, sub, sources))
        disp = session.dispatcher(backend, device)
        for n in nodes:
            p = disp.plan(variant_of(g, n))
            assert isinstance(p, Plan)
            entries.append(report_entry(n.name, p, device.name))
    for o in g.outputs:
        src = producer_dev.get(o, "host")
        dev = next((dv for _, dv in devices if dv.name == src), None)
        if dev is not None and not dev.host_memory:
            nbytes = g.types[o].nbytes()
            transfers.append(TransferEntry(o, src, "host", nbytes, transfer_cost(nbytes, dev.caps)))
    names = ",".join(d.name for _, d in devices)
    backends = ",".join(b.name for b, _ in devices)
    versions = ",".join(b.info.version for b, _ in devices)
    report = DispatchReport(g.name, backends, versions, names, entries, transfers, None, None,
                            dict(bindings))
    return Placement(segments, report)


class MultiDeviceExecutable:
    """Runs the segments in order, handing values between devices through host arrays."""

    def __init__(self, session: Any, graph: Graph, subsession: Callable[[str], Any]) -> None:
        """``subsession(device_name)``: a one-device session (the caller's kind) that compiles the
        segments placed on that device."""
        self.session = session
        self.graph = graph
        self.report: DispatchReport | None = None
        self._subsessions = [subsession(d.name) for _, d in session.devices]
        # Bounded like Executable's: each entry holds one compiled executable per segment.
        self._specs = SpecCache(getattr(session, "max_specializations", DEFAULT_MAX_SPECIALIZATIONS))
        self._lock = threading.Lock()
        if not graph.symbols:
            self._specialise({})
        else:
            self.report = place(session, graph, session._hints(graph)).report

    def _specialise(self, bindings: dict[str, int]) -> list[tuple[Segment, Any]]:
        key = tuple(sorted(bindings.items()))
        with self._lock:
            hit = self._specs.get_recent(key)
            if hit is None:
                placement = place(self.session, self.graph, bindings)
                self.report = placement.report
                hit = [(s, self._subsessions[s.device_index].compile(s.graph)) for s in placement.segments]
                self._specs.put(key, hit)
            return hit

    def run(self, inputs: Mapping[str, Any] | None = None, **kw: Any) -> dict[str, np.ndarray]:
        feed = dict(inputs or {})
        feed.update(kw)
        arrays, bindings = bind_inputs(self.graph, feed, f"graph {self.graph.name!r}")
        env: dict[str, Any] = dict(arrays)
        for seg, exe in self._specialise(bindings):
            env.update(exe.run({v.name: env[v.name] for v in seg.graph.inputs}))
        for p in self.graph.params:
            env.setdefault(p.name, np.asarray(self.graph.weights[p.name]))
        return {o: env[o] for o in self.graph.outputs}

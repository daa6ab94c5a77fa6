"""The dispatch report: per node the op, variant, path, kernels, device and estimated cost."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class ReportEntry:
    node: str
    op: str
    variant: str
    path: str
    via: str
    kernels: tuple[str, ...]
    device: str
    seconds: float


@dataclass(frozen=True)
class TransferEntry:
    value: str
    src: str
    dst: str
    nbytes: int
    seconds: float


@dataclass
class DispatchReport:
    graph: str
    backend: str
    backend_version: str
    device: str
    entries: list[ReportEntry]
    transfers: list[TransferEntry] = field(default_factory=list)
    arena_bytes: int | None = None
    naive_bytes: int | None = None
    bindings: dict[str, int] = field(default_factory=dict)
    from_cache: bool = False
    #: fused groups: each the list of original node names now run as one fused kernel
    fused: list[list[str]] = field(default_factory=list)

    @property
    def kernel_seconds(self) -> float:
        return sum(e.seconds for e in self.entries)

    @property
    def transfer_seconds(self) -> float:
        return sum(t.seconds for t in self.transfers)

    @property
    def total_seconds(self) -> float:
        return self.kernel_seconds + self.transfer_seconds

    def counts(self) -> dict[str, int]:
        out = {"native": 0, "common_ir": 0, "rewritten": 0}
        for e in self.entries:
            out[e.path] = out.get(e.path, 0) + 1
        return out

    def by_op(self) -> dict[str, dict[str, int]]:
        """Per op kind: how many nodes took each path (the Rust original's summary)."""
        out: dict[str, dict[str, int]] = {}
        for e in self.entries:
            d = out.setdefault(e.op, {"native": 0, "common_ir": 0, "rewritten": 0})
            d[e.path] += 1
        return out

    @property
    def num_kernels(self) -> int:
        return sum(len(e.kernels) for e in self.entries)

    def to_json(self) -> dict[str, Any]:
        return {
            "graph": self.graph, "backend": self.backend, "backend_version": self.backend_version,
            "device": self.device, "bindings": self.bindings, "compile_ready": True,
            "counts": self.counts(), "by_op": self.by_op(), "kernels": self.num_kernels,
            "estimated_seconds": {"kernels": self.kernel_seconds, "transfers": self.transfer_seconds,
                                  "total": self.total_seconds},
            "memory": {"arena_bytes": self.arena_bytes, "naive_bytes": self.naive_bytes},
            "nodes": [dict(asdict(e), kernels=list(e.kernels)) for e in self.entries],
            "transfers": [asdict(t) for t in self.transfers],
            "fused": self.fused,
            "from_cache": self.from_cache,
        }

    def to_text(self, *, max_rows: int | None = None) -> str:
        head = (f"Dispatch report: graph {self.graph!r} on {self.device} "
                f"(backend {self.backend} {self.backend_version})")
        if self.bindings:
            head += " with " + ", ".join(f"{k}={v}" for k, v in self.bindings.items())
        rows = [("node", "op", "variant", "path", "via / kernels", "est.")]
        entries = self.entries if max_rows is None else self.entries[:max_rows]
        for e in entries:
            how = ", ".join(e.kernels[:4]) + (f", +{len(e.kernels) - 4}" if len(e.kernels) > 4 else "")
            if e.via:
                how = f"{e.via} -> {how}"
            rows.append((e.node, e.op, e.variant, e.path, how, fmt_seconds(e.seconds)))
        widths = [min(max(len(r[i]) for r in rows), 60) for i in range(len(rows[0]))]
        lines = [head]
        for r in rows:
            lines.append("  " + "  ".join(_cut(c, w).ljust(w) for c, w in zip(r, widths)).rstrip())
        if max_rows is not None and len(self.entries) > max_rows:
            lines.append(f"  ... {len(self.entries) - max_rows} more nodes")
        c = self.counts()
        lines.append(f"summary: {len(self.entries)} nodes: {c['native']} native, {c['common_ir']} "
                     f"common_ir, {c['rewritten']} rewritten; {self.num_kernels} kernels")
        if self.fused:
            lines.append(f"fused: {len(self.fused)} groups "
                         f"({sum(len(g) for g in self.fused)} nodes -> {len(self.fused)} kernels)")
            for grp in self.fused[:20]:
                lines.append(f"  {grp[-1]} <- " + " + ".join(grp))
            if len(self.fused) > 20:
                lines.append(f"  ... {len(self.fused) - 20} more groups")
        if self.transfers:
            tb = sum(t.nbytes for t in self.transfers)
            lines.append(f"transfers: {len(self.transfers)} ({fmt_bytes(tb)}, "
                         f"{fmt_seconds(self.transfer_seconds)})")
            for t in self.transfers:
                lines.append(f"  {t.value}: {t.src} -> {t.dst} {fmt_bytes(t.nbytes)}")
        else:
            lines.append("transfers: none (device uses host memory)")
        if self.arena_bytes is not None and self.naive_bytes:
            lines.append(f"memory: arena {fmt_bytes(self.arena_bytes)} planned vs "
                         f"{fmt_bytes(self.naive_bytes)} without reuse "
                         f"({100 * self.arena_bytes / self.naive_bytes:.0f}%)")
        lines.append(f"estimated: {fmt_seconds(self.total_seconds)} per run; compile-ready: yes")
        return "\n".join(lines)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)


def _cut(s: str, w: int) -> str:
    return s if len(s) <= w else s[: w - 1] + "…"


def fmt_seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    if s >= 1e-6:
        return f"{s * 1e6:.1f} µs"
    return f"{s * 1e9:.0f} ns"


def fmt_bytes(n: int) -> str:
    f = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if f < 1024 or unit == "GiB":
            return f"{f:.0f} {unit}" if unit == "B" else f"{f:.1f} {unit}"
        f /= 1024
    return f"{f:.1f} GiB"  # pragma: no cover

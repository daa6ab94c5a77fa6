"""The small typed records that hooks return. Plain frozen dataclasses, validated at construction."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .dtypes import DType
from .errors import PluginError
from .ir.types import Attrs, TensorType

if TYPE_CHECKING:
    import click
    import numpy as np


def _need(cond: bool, what: str, fix: str) -> None:
    if not cond:
        raise PluginError(what, fix=fix)


@dataclass(frozen=True)
class BackendInfo:
    """Who a backend is. ``api_version`` is the RLX plugin API it was written for ("MAJOR.MINOR")."""

    name: str
    version: str
    api_version: str
    description: str = ""
    vendor: str = ""
    #: True when ``rlx_compile`` turns the whole LIR program into one artifact (C, wasm, RTL...).
    whole_program: bool = False

    def __post_init__(self) -> None:
        _need(isinstance(self.name, str) and self.name.replace("_", "").replace("-", "").isalnum(),
              f"backend name {self.name!r} is invalid", "use a short lowercase name such as 'cuda'")
        parts = str(self.api_version).split(".")
        _need(len(parts) == 2 and all(p.isdigit() for p in parts),
              f"backend {self.name!r} declares api_version {self.api_version!r}",
              "api_version is 'MAJOR.MINOR', e.g. rlx_core.API_VERSION")

    @property
    def api_major(self) -> int:
        return int(self.api_version.split(".")[0])


@dataclass(frozen=True)
class DeviceCaps:
    """What the cost model needs to know about a device. Rates are per second."""

    peak_flops: Mapping[str, float]
    mem_bandwidth: float
    launch_overhead: float
    #: Host<->device bandwidth in bytes/s; ``None`` when buffers live in host memory.
    host_link_bandwidth: float | None = None
    source: str = "plugin defaults"
    #: Why these figures may be far from what the device really does (a software device, a guessed
    #: class), or "" when they can be trusted. Automatic device choice never picks a device for a
    #: first run on such figures; measuring them (``rlx calibrate``) clears it.
    unreliable: str = ""

    def __post_init__(self) -> None:
        _need(bool(self.peak_flops) and all(v > 0 for v in self.peak_flops.values()),
              "DeviceCaps.peak_flops must map dtype names (or 'default') to positive FLOP/s",
              "e.g. {'f32': 1e11, 'default': 5e10}")
        _need(self.mem_bandwidth > 0 and self.launch_overhead >= 0,
              "DeviceCaps needs mem_bandwidth > 0 and launch_overhead >= 0", "measure with rlx calibrate")
        _need(self.host_link_bandwidth is None or self.host_link_bandwidth > 0,
              "DeviceCaps.host_link_bandwidth must be positive or None", "use None for host memory")

    def peak(self, dtype: DType) -> float:
        return self.peak_flops.get(dtype.value, self.peak_flops.get("default",
                                                                    min(self.peak_flops.values())))


@dataclass(frozen=True)
class DeviceInfo:
    backend: str
    name: str
    available: bool
    caps: DeviceCaps
    reason: str = ""
    #: Buffers live in host memory: no transfers are needed to run on it.
    host_memory: bool = True
    details: Mapping[str, str] = field(default_factory=dict)
    #: Steps a buffer stays reserved after its value's last use before the memory planner gives
    #: it to another value. A backend that overlaps consecutive kernels (one thread still on
    #: kernel i while another starts kernel i+1) sets it so that reusing bytes a neighbour may
    #: still read does not force the threads to wait for each other. Costs arena memory.
    reuse_distance: int = 0

    def __post_init__(self) -> None:
        _need(self.available or bool(self.reason), f"device {self.name!r} is unavailable without a reason",
              "say why (e.g. 'no CUDA driver found') so `rlx doctor` can tell the user")
        _need(self.reuse_distance >= 0, f"device {self.name!r}: reuse_distance must be >= 0",
              "use 0 unless kernels overlap")


@dataclass(frozen=True)
class NodeVariant:
    """One concrete use of an op: the unit a kernel claims (op, dtypes, attributes, shapes)."""

    op: str
    in_types: tuple[TensorType, ...]
    out_types: tuple[TensorType, ...]
    attrs: Attrs

    @property
    def in_dtypes(self) -> tuple[DType, ...]:
        return tuple(t.dtype for t in self.in_types)

    def describe(self) -> str:
        if self.op == "fused_elementwise" and isinstance(self.attrs.get("program"), str):
            import json

            chain = ",".join(o[0] for o in json.loads(self.attrs["program"])["ops"])  # type: ignore[arg-type]
            ins = ", ".join(str(t) for t in self.in_types)
            return f"fused[{chain}]({ins}) -> {', '.join(str(t) for t in self.out_types)}"
        attrs = ", ".join(f"{k}={v}" for k, v in self.attrs.items() if v is not None)
        ins = ", ".join(str(t) for t in self.in_types)
        outs = ", ".join(str(t) for t in self.out_types)
        return f"{self.op}({ins}{'; ' + attrs if attrs else ''}) -> {outs}"


#: A predicate returns ``None`` to accept a variant, or a short reason it is rejected.
Predicate = Callable[[NodeVariant], "str | None"]


@dataclass(frozen=True)
class KernelClaim:
    """A backend's promise to run one op variant natively.

    ``dtypes`` limits the input dtypes (output dtypes for ops without inputs), ``out_dtypes`` the
    output dtypes, ``predicate`` anything else (attributes, shapes). ``impl`` is private to the
    backend. ``in_place`` lets the memory planner put the output in a dying input's buffer.
    """

    op: str
    name: str
    impl: Any = None
    dtypes: frozenset[DType] | None = None
    out_dtypes: frozenset[DType] | None = None
    predicate: Predicate | None = None
    constraint: str = ""
    cost: Callable[[NodeVariant, DeviceCaps], float] | None = None
    in_place: bool = False

    def __post_init__(self) -> None:
        for f in ("dtypes", "out_dtypes"):
            v = getattr(self, f)
            if v is not None:
                object.__setattr__(self, f, frozenset(DType.parse(d) for d in v))

    def check(self, v: NodeVariant) -> str | None:
        """``None`` if this claim accepts ``v``, else why not (shown in the dispatch error)."""
        ins = v.in_types if v.in_types else v.out_types
        if self.dtypes is not None:
            bad = [str(t.dtype) for t in ins if t.dtype not in self.dtypes]
            if bad:
                return (f"{self.name} accepts {', '.join(sorted(d.value for d in self.dtypes))}; "
                        f"got {', '.join(bad)}")
        if self.out_dtypes is not None:
            bad = [str(t.dtype) for t in v.out_types if t.dtype not in self.out_dtypes]
            if bad:
                return f"{self.name} produces {sorted(d.value for d in self.out_dtypes)}; needs {bad}"
        if self.predicate is not None:
            why = self.predicate(v)
            if why:
                return f"{self.name}: {why}"
        return None


@dataclass(frozen=True)
class Decomposition:
    """Build ``op`` from other ops (the ``common_ir`` path). ``expand(builder, inputs, attrs)``."""

    op: str
    name: str
    expand: Callable[..., Any]
    applies: Callable[[NodeVariant], bool] | None = None
    provider: str = ""


@dataclass(frozen=True)
class Rewrite:
    """Change a node so the backend can run it (the ``rewritten`` path): e.g. f16 computed in f32.

    ``apply(builder, inputs, variant)`` returns the replacement outputs; it must preserve meaning
    up to the documented precision change.
    """

    name: str
    description: str
    applies: Callable[[NodeVariant], bool]
    apply: Callable[..., Any]
    provider: str = ""


@dataclass(frozen=True)
class Region:
    """Nodes of a graph (``members``, by name) and the fewer ``nodes`` that may replace them.

    The replacement must produce every member output that is read outside the region (under the
    same value names) and reads only values defined before the region's last member. ``claim``
    names the replacement nodes the backend must run natively for the region to be taken
    (``None``: all of them); the others (a transpose the new node needs) are dispatched as usual.
    """

    members: tuple[str, ...]
    nodes: tuple[Any, ...]
    claim: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "members", tuple(self.members))
        object.__setattr__(self, "nodes", tuple(self.nodes))
        _need(len(self.members) >= 1 and len(set(self.members)) == len(self.members),
              f"region members {self.members!r} are empty or repeated", "name each replaced node once")
        _need(len(self.nodes) >= 1, f"region over {self.members!r} has no replacement nodes",
              "give the nodes that replace the region")
        if self.claim is not None:
            object.__setattr__(self, "claim", tuple(self.claim))
            names = {getattr(n, "name", None) for n in self.nodes}
            _need(set(self.claim) <= names, f"region claim {self.claim!r} names nodes it does not add",
                  "claim only replacement nodes")


@dataclass(frozen=True)
class FusionRule:
    """A pattern that proposes :class:`Region` s (hook ``rlx_fusion_rules``; see :mod:`rlx_core.regions`).

    ``find(graph)`` returns candidate regions in preference order; the backend takes those whose
    replacement it claims natively. ``stage`` is ``"graph"`` (the graph as built) or ``"legal"``
    (after legalization, when decomposed HIR ops are primitives too).
    """

    name: str
    find: Callable[[Any], Any]
    stage: str = "legal"
    doc: str = ""
    provider: str = ""

    def __post_init__(self) -> None:
        _need(isinstance(self.name, str) and bool(self.name), "a fusion rule needs a name",
              "name it after the pattern, prefixed by the vendor ('acme.gemm_bias')")
        _need(self.stage in ("graph", "legal"), f"fusion rule {self.name!r}: stage {self.stage!r} is unknown",
              "use stage='graph' or stage='legal'")
        _need(callable(self.find), f"fusion rule {self.name!r}: find is not callable",
              "pass find=function(graph) -> list[Region]")


@runtime_checkable
class CompiledProgram(Protocol):
    """What ``rlx_compile`` returns: runs the whole program on host NumPy arrays."""

    def run(self, inputs: Mapping[str, Any]) -> dict[str, Any]: ...


@runtime_checkable
class BufferBinding(CompiledProgram, Protocol):
    """An optional capability of a compiled program: its values live in host memory the caller
    may address by name, so state can stay in the program between runs and inputs can be fed
    without a copy. Resident training (``ResidentTrainer``) needs it; a program declares it by
    having these methods (``isinstance(program, BufferBinding)``), and
    ``Executable.buffers()`` hands it out or raises :class:`~rlx_core.errors.CapabilityError`.

    Values keep their planned memory for the program's lifetime. ``run`` still works and may
    overwrite anything set here; callers holding views must not mix the two without re-setting.
    """

    def buffer(self, name: str) -> np.ndarray:
        """The array holding value ``name`` (an input, output or intermediate of the program) in
        the program's own memory: writing an input's array sets it for the next runs; an output's
        array holds its value from the end of one run until the next run starts."""
        ...

    def bind_input(self, name: str, array: np.ndarray) -> bool:
        """Give input ``name`` ``array``'s value for the next runs. True: the program reads
        ``array`` itself (the caller keeps it alive and unchanged while it runs); False: it was
        copied into ``buffer(name)``."""
        ...

    def run_bound(self) -> None:
        """Run every kernel once on what the buffers hold now: nothing copied in or out."""
        ...


@dataclass(frozen=True)
class ExporterInfo:
    """One target of ``rlx export --target TARGET`` (hook ``rlx_exporters``): an artifact generator.

    Give either ``command``, a click command taking ``MODEL --target TARGET ...`` (or its
    ``"package.module:attr"`` name, imported only when that target is used, so listing exporters
    stays cheap), or ``function`` with ``options``: the core then builds the command from the shared
    arguments (MODEL, ``--output/-o``, ``--bind``, ``--json``) plus ``options`` (click parameters) and
    calls ``function(graph, out_dir, bindings, **options)``, which writes the artifact and returns a
    JSON-able summary. ``distribution`` and ``backend`` are filled in by the core.
    """

    target: str
    help: str
    command: click.Command | str | None = None
    function: Callable[..., Mapping[str, Any] | None] | None = None
    options: tuple[click.Parameter, ...] = ()
    distribution: str = ""
    backend: str = ""

    def __post_init__(self) -> None:
        _need(isinstance(self.target, str) and self.target.replace("-", "").replace("_", "").isalnum()
              and self.target[:1].isalpha(),
              f"exporter target {self.target!r} is invalid", "use a short lowercase name such as 'wasm'")
        _need(isinstance(self.help, str) and bool(self.help.strip()) and "\n" not in self.help.strip(),
              f"exporter {self.target!r}: help must be one non-empty line", "describe the artifact in a line")
        _need((self.command is None) != (self.function is None),
              f"exporter {self.target!r} gives {'both' if self.function else 'neither'} a command and a "
              "function", "give command=... (a click command or 'module:attr') or function=... with options")
        _need(self.command is None or isinstance(self.command, str) or hasattr(self.command, "main"),
              f"exporter {self.target!r}: command is {type(self.command).__name__}, not a click command",
              "pass a click.Command or its 'package.module:attr' name")

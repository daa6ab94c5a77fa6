"""Every hook a backend plugin can implement, in one module (read this to write a backend).

A plugin is a module (or object) named by an entry point in the group ``rlx.backends``; the entry
point's name is the backend name. Implement hooks with ``@rlx_core.plugin.hookimpl``. A hook
implementation may take fewer arguments than its spec (pluggy's opt-in arguments), so specs can
grow without breaking plugins. Hooks must only *describe* things: importing heavy libraries
(cupy, wasmtime ...) belongs in ``rlx_probe_devices`` or ``rlx_compile``, never at module import.

Minimal plugin::

    from rlx_core.plugin import BackendInfo, DeviceCaps, DeviceInfo, KernelClaim, hookimpl

    @hookimpl
    def rlx_backend_info():
        return BackendInfo(name="mydev", version="0.1.0", api_version="1.0")

    @hookimpl
    def rlx_probe_devices():
        caps = DeviceCaps(peak_flops={"default": 1e9}, mem_bandwidth=1e9, launch_overhead=1e-6)
        return [DeviceInfo(backend="mydev", name="mydev:0", available=True, caps=caps)]

    @hookimpl
    def rlx_kernels(device):
        return [KernelClaim(op="add", name="mydev.add", dtypes={"f32"}, impl=my_add)]

    @hookimpl
    def rlx_compile(program, device):
        return MyProgram(program)          # has .run(inputs: dict) -> dict
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:  # the records and IR types, for type checkers only: importing them loads NumPy
    from collections.abc import Sequence

    import click

    from .ir.schema import OpSchema
    from .lir import Program
    from .records import (
        BackendInfo,
        CompiledProgram,
        Decomposition,
        DeviceCaps,
        DeviceInfo,
        ExporterInfo,
        FusionRule,
        KernelClaim,
        NodeVariant,
        Rewrite,
    )
    from .settings import Setting

PROJECT = "rlx"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec(firstresult=True)
def rlx_backend_info() -> BackendInfo:
    """Return the backend's :class:`~rlx_core.records.BackendInfo` (identity and API version).

    Called right after import; a major ``api_version`` different from ``rlx_core.API_VERSION``
    refuses the plugin with a message telling the user which versions match.

    Example::

        @hookimpl
        def rlx_backend_info():
            return BackendInfo(name="cpu", version="0.1.0", api_version="1.0")
    """


@hookspec(firstresult=True)
def rlx_probe_devices() -> Sequence[DeviceInfo]:
    """Return a list of :class:`~rlx_core.records.DeviceInfo`, one per device, available or not.

    An unavailable device carries the reason (``"no CUDA driver: libcuda.so.1 not found"``) so
    ``rlx doctor`` can explain it. Must not raise when the hardware is absent.

    Example::

        @hookimpl
        def rlx_probe_devices():
            return [DeviceInfo(backend="cpu", name="cpu:0", available=True, caps=CPU_CAPS)]
    """


@hookspec(firstresult=True)
def rlx_kernels(device: DeviceInfo) -> Sequence[KernelClaim]:
    """Return the :class:`~rlx_core.records.KernelClaim` list for ``device``.

    Each claim names one op and the variants (dtypes, attributes, shapes) it runs natively. The
    dispatcher asks claims in order, so put specialised kernels first.

    Example::

        @hookimpl
        def rlx_kernels(device):
            return [KernelClaim(op="matmul", name="cpu.matmul", dtypes={"f32", "f64"}, impl=k_matmul)]
    """


@hookspec
def rlx_decompositions() -> Sequence[Decomposition]:
    """Return :class:`~rlx_core.records.Decomposition` records: ops built from simpler ops.

    The core registers the decompositions of every HIR op through this same hook; a plugin adds
    expansions that suit its hardware. They are tried in registration order, plugin ones first.

    Example::

        @hookimpl
        def rlx_decompositions():
            return [Decomposition(op="gelu", name="mydev.gelu_tanh", expand=my_gelu)]
    """


@hookspec
def rlx_rewrites() -> Sequence[Rewrite]:
    """Return :class:`~rlx_core.records.Rewrite` records: legal changes of a node (``rewritten``).

    Example: compute an f16 node in f32 between two casts when the device has no f16 kernel.
    """


@hookspec
def rlx_fusion_rules() -> Sequence[FusionRule]:
    """Return :class:`~rlx_core.records.FusionRule` records: patterns that propose regions to fuse.

    A rule's ``find(graph)`` returns :class:`~rlx_core.records.Region` s (nodes, and the fewer
    nodes replacing them); a region is applied only where this backend claims its replacement
    natively (ONNX Runtime's GetCapability, answered by your kernel claims), so a rule never makes
    a graph illegal. Your rules are tried before the core's (elementwise chains, attention).

    Example::

        @hookimpl
        def rlx_fusion_rules():
            return [FusionRule("acme.gemm_bias", find=find_gemm_bias, stage="graph")]
    """


@hookspec
def rlx_ops() -> Sequence[OpSchema]:
    """Return :class:`~rlx_core.ir.schema.OpSchema` records for ops this plugin adds to the IR.

    A new op must come with inference and a float64 NumPy reference; the conformance suite then
    tests it like a core op. Prefix names with the vendor (``"acme.fused_gemm"``).
    """


@hookspec(firstresult=True)
def rlx_kernel_cost(claim: KernelClaim, variant: NodeVariant, caps: DeviceCaps) -> float | None:
    """Return the estimated seconds for ``claim`` on ``variant``, or ``None`` for the roofline default.

    Example::

        @hookimpl
        def rlx_kernel_cost(claim, variant, caps):
            if variant.op == "matmul":
                return my_gemm_model(variant, caps)
            return None
    """


@hookspec(firstresult=True)
def rlx_compile(program: Program, device: DeviceInfo) -> CompiledProgram:
    """Turn an LIR :class:`~rlx_core.lir.Program` into an object with ``run(inputs) -> outputs``.

    ``program.steps`` are in execution order; each kernel step names the claim the dispatcher
    chose. ``program.plan`` gives every value its offset in one arena. A kernel-per-node backend
    maps steps to calls; a whole-program backend emits one artifact (C, wasm, RTL).
    """


@hookspec
def rlx_exporters() -> list[ExporterInfo]:
    """Return :class:`~rlx_core.records.ExporterInfo` records: the targets of ``rlx export --target T``.

    Name the command by ``"package.module:attr"`` so the exporter's own imports wait until it is used;
    ``rlx export --help`` lists every installed target, ``rlx export --target T --help`` shows its
    options. Two distributions exporting one target is an error naming both.

    Example::

        @hookimpl
        def rlx_exporters():
            return [ExporterInfo(target="mydev", help="C sources for My board",
                                 command="rlx_mydev.export:export_command")]
    """


@hookspec
def rlx_cli_commands() -> list[click.Command]:
    """Return click commands this plugin adds to ``rlx``: ``rlx <name> ...``.

    Names are namespaced by the backend: ``NAME`` (e.g. a click group) or ``NAME-something``. A name
    taken by a core command or by another plugin is an error naming both distributions; ``rlx doctor``
    reports a plugin whose hook fails. Plugins are imported only when such a command is invoked or
    listed (``rlx plugins``), so ``rlx --help`` stays fast.

    Example::

        @hookimpl
        def rlx_cli_commands():
            from .cli import flash_command   # a click command named "mydev-flash"
            return [flash_command]
    """


@hookspec
def rlx_settings() -> Sequence[Setting]:
    """Return the :class:`~rlx_core.settings.Setting` records of this plugin's ``RLX_*`` variables.

    Declare each once at import with ``rlx_core.plugin.declare_setting`` (``owner`` = the plugin's
    distribution) and read it with ``SETTING.get()``, never ``os.environ``: one parser, one error
    message. This hook lets ``rlx doctor --settings`` list them, selected plugin or not.

    Example::

        THREADS = declare_setting("RLX_MYDEV_THREADS", "int", 4, "Worker threads.", owner="rlx-mydev",
                                  min=1)

        @hookimpl
        def rlx_settings():
            return [THREADS]
    """

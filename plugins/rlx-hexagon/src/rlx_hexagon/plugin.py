"""rlx-hexagon hook implementations: identity, the (unavailable) device, claims, the exporter and the
compile check command.

The kernels are freestanding C for Hexagon HVX (:mod:`rlx_hexagon.codegen`), compiled with clang's
Hexagon target (:mod:`rlx_hexagon.build`). No Hexagon HVX hardware, HVX-capable simulator or QNN
runtime is installable from the package registries this project uses, so the device is always reported
unavailable: no HVX code executes, nothing is certified; ``rlx hexagon-compile-check`` compiles every
kernel the conformance programs generate ("code generated and compiled") and ``rlx export --target
hexagon`` writes a model's C and object. Where Debian's ``qemu-hexagon`` is installed, the same C built
for the scalar V67 core executes under it (:mod:`rlx_hexagon.qemu`): the tests compare it with NumPy,
but scalar emulation is not the HVX target, so it certifies nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlx_core import API_VERSION
from rlx_core.plugin import (
    FUSED,  # noqa: F401  (importing it registers the fused_elementwise op)
    BackendInfo,
    DeviceCaps,
    DeviceInfo,
    KernelClaim,
    hookimpl,
)

from . import __version__


@hookimpl
def rlx_backend_info() -> BackendInfo:
    return BackendInfo(name="hexagon", version=__version__, api_version=API_VERSION, vendor="RLX",
                       whole_program=True,
                       description="freestanding C for Qualcomm Hexagon HVX (clang --target=hexagon); "
                                   "code generated and compiled, not executed")


def _caps() -> DeviceCaps:
    # A v73 cDSP at ~1.4 GHz, four HVX contexts of 32 f32 lanes: rough datasheet-level guesses.
    return DeviceCaps(peak_flops={"f32": 1.4e9 * 32 * 4, "default": 1.4e9 * 32},
                      mem_bandwidth=2.5e10, launch_overhead=1e-4, host_link_bandwidth=5e9,
                      source="datasheet estimate (Hexagon v73, 128-byte HVX)",
                      unreliable="not measured: no Hexagon device here")


@hookimpl
def rlx_probe_devices() -> list[DeviceInfo]:
    from .build import APT, find_clang, flags
    from .qemu import APT as QEMU_APT
    from .qemu import CPU as QEMU_CPU
    from .qemu import find_qemu

    clang, qemu = find_clang(), find_qemu()
    can = (f"{clang} compiles the generated C ({' '.join(flags()[:5])}): code generated and compiled, "
           "not executed (rlx export --target hexagon, rlx hexagon-compile-check)" if clang
           else f"no clang with the Hexagon target: C is generated but not compiled ({APT})")
    scalar = (f"{qemu} runs the same C built for scalar {QEMU_CPU} (no HVX; rlx_hexagon.qemu, used by the "
              "tests): executed only as scalar code, not certified" if qemu and clang
              else f"no qemu-hexagon: the scalar build is not executed ({QEMU_APT})")
    return [DeviceInfo("hexagon", "hexagon:0", False, _caps(), details={"offline": can, "qemu": scalar},
                       reason="no Hexagon HVX device, simulator or QNN runtime here (none is installable "
                              "from PyPI/Debian; Debian's qemu-hexagon 7.2 lacks V68+ HVX floating point): "
                              f"cannot execute HVX code. {can}")]


@hookimpl
def rlx_kernels(device: DeviceInfo) -> list[KernelClaim]:
    from .claims import claims

    return claims()


@hookimpl
def rlx_compile(program: Any, device: DeviceInfo) -> Any:
    from rlx_core.plugin import BackendNotFoundError

    raise BackendNotFoundError("rlx-hexagon cannot execute: there is no Hexagon device here",
                               fix="use `rlx export --target hexagon` for the C and object")


def _export(graph: Any, out_dir: Path, bindings: dict[str, int], cpu: str, no_build: bool) -> Any:
    from .export import export_graph

    return export_graph(graph, out_dir, bindings=bindings, cpu=cpu, build=not no_build)


@hookimpl
def rlx_exporters() -> list[Any]:
    import click

    from rlx_core.plugin import ExporterInfo

    return [ExporterInfo(
        target="hexagon", function=_export, help="freestanding C for Hexagon HVX, its object and io.json",
        options=(click.Option(["--cpu"], default="hexagonv73", show_default=True,
                              help="Hexagon core (-mcpu), e.g. hexagonv69, hexagonv73, hexagonv75."),
                 click.Option(["--no-build"], is_flag=True, help="Write the C only (no clang needed).")))]


@hookimpl
def rlx_cli_commands() -> list[Any]:
    from .cli import compile_check_command, qemu_check_command

    return [compile_check_command, qemu_check_command]


@hookimpl
def rlx_settings() -> list[Any]:
    from .settings import SETTINGS

    return list(SETTINGS)

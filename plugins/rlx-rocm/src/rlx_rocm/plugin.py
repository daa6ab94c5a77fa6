"""rlx-rocm hook implementations: identity, the device, claims, compile, the exporter and the compile
check command.

The kernels are the device kit's C-style kernel library in a HIP dialect (:mod:`rlx_rocm.hip`, the
shared renderer's CUDA dialect underneath). On a machine with an AMD GPU and ROCm they are compiled by
hiprtc and launched through libamdhip64 (:mod:`rlx_rocm.runtime`). Everywhere else the device is
reported unavailable, and what this package can still do is say so and build the same kernels
offline with clang's AMDGPU back end: ``rlx export --target rocm`` and ``rlx rocm-compile-check``.
Nothing is certified without a GPU: the compile check's verdict is "code generated and compiled".
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
    cstyle,
    hookimpl,
)

from . import __version__


@hookimpl
def rlx_backend_info() -> BackendInfo:
    return BackendInfo(name="rocm", version=__version__, api_version=API_VERSION, vendor="RLX",
                       description="HIP kernels for AMD GPUs (hiprtc + libamdhip64; offline gfx90a/gfx942 "
                                   "code objects through clang)")


def _offline_note() -> dict[str, str]:
    from .offline import APT, ARCHS, find_clang

    clang = find_clang()
    if clang is None:
        return {"offline": f"no clang with AMDGPU: kernels are generated but not compiled ({APT})"}
    return {"offline": f"{clang} compiles the generated kernels for {', '.join(ARCHS)} "
                       "(rlx export --target rocm, rlx rocm-compile-check): code generated and compiled, "
                       "not executed"}


def _caps(name: str = "") -> DeviceCaps:
    # An MI200-class part running one thread per output element, no tiling or LDS: rough.
    return DeviceCaps(peak_flops={"f32": 2e13, "default": 2e13}, mem_bandwidth=1.2e12, launch_overhead=8e-6,
                      host_link_bandwidth=2.5e10,
                      source=f"plugin estimate ({name or 'AMD GPU'}; naive kernels)",
                      unreliable="rough guesses: run `rlx calibrate rocm` on the machine")


def _probe() -> list[DeviceInfo]:
    note = _offline_note()
    try:
        from .runtime import hip

        h = hip()
    except OSError:
        return [DeviceInfo("rocm", "rocm:0", False, _caps(), details=note,
                           reason="no ROCm device (libamdhip64 not found); cannot execute here. "
                                  f"{note['offline']}")]
    except Exception as e:
        return [DeviceInfo("rocm", "rocm:0", False, _caps(), details=note,
                           reason=f"no ROCm device (the HIP runtime failed to start: {e})")]
    n = h.device_count()
    if n == 0:
        return [DeviceInfo("rocm", "rocm:0", False, _caps(), details=note,
                           reason="no ROCm device (libamdhip64 is installed but sees no AMD GPU)")]
    out = []
    for i in range(n):
        name = h.device_name(i)
        out.append(DeviceInfo("rocm", f"rocm:{i}", True, _caps(name), host_memory=False,
                              details={"device": name, "hip_runtime": str(h.runtime_version()), **note}))
    return out


_DEVICES: list[DeviceInfo] | None = None


@hookimpl
def rlx_probe_devices() -> list[DeviceInfo]:
    global _DEVICES
    if _DEVICES is None:
        _DEVICES = _probe()
    return _DEVICES


@hookimpl
def rlx_kernels(device: DeviceInfo) -> list[KernelClaim]:
    """The C-style kernel library's claims (f32, plus exact i32/i64/bool ops)."""
    return list(cstyle.claims(_hip_dialect(), "rocm."))


def _hip_dialect() -> Any:
    from .hip import HIP

    return HIP


@hookimpl
def rlx_compile(program: Any, device: DeviceInfo) -> Any:
    from .runtime import compile_program

    return compile_program(program, int(device.name.split(":")[1]))


def _export(graph: Any, out_dir: Path, bindings: dict[str, int], arch: tuple[str, ...],
            no_build: bool) -> Any:
    from .export import export_graph

    return export_graph(graph, out_dir, bindings=bindings, archs=arch, build=not no_build)


@hookimpl
def rlx_exporters() -> list[Any]:
    import click

    from rlx_core.plugin import ExporterInfo

    from .offline import ARCHS, MACH

    return [ExporterInfo(
        target="rocm", function=_export,
        help="HIP C++ kernels, AMDGPU code objects (gfx90a, gfx942) and the launch table",
        options=(click.Option(["--arch"], type=click.Choice(sorted(MACH)), multiple=True, default=ARCHS,
                              show_default=True, help="AMD targets to build code objects for (repeatable)."),
                 click.Option(["--no-build"], is_flag=True,
                              help="Write the HIP source and launch table only (no clang needed).")))]


@hookimpl
def rlx_cli_commands() -> list[Any]:
    from .cli import compile_check_command

    return [compile_check_command]


@hookimpl
def rlx_settings() -> list[Any]:
    from .settings import SETTINGS

    return list(SETTINGS)

"""rlx-cuda hook implementations: identity, device probing, kernel claims and compilation.

Nothing here imports CuPy at module import: probing imports it inside ``rlx_probe_devices`` (and
reports "no CUDA device: <cause>" when it is missing or finds no GPU), compilation inside
``rlx_compile``. Claims are honest: f16/bf16 are claimed for GEMMs (tensor cores, f32
accumulation), the row kernels (f32 compute), casts and data movement; other f16/bf16 arithmetic
takes the core's ``compute_f16_in_f32`` rewrite, which fusion then folds into one kernel.
"""

from __future__ import annotations

from typing import Any

from rlx_core import API_VERSION
from rlx_core.plugin import (
    FUSED,  # noqa: F401  (importing it registers the fused_elementwise op)
    FUSIBLE,
    BackendInfo,
    DeviceCaps,
    DeviceInfo,
    DType,
    KernelClaim,
    all_of,
    dtypes_in,
    elementwise_claims,
    fused_claim,
    hookimpl,
    normalize_axis,
    render_check,
    renders,
)

from . import __version__, codegen

ELEMENTWISE = tuple(sorted(FUSIBLE))
HALF = codegen.HALF
#: Dtypes the generated elementwise kernels compute in.
GEN = codegen.COMPUTE
#: Every dtype a device buffer can hold (c64 is not supported).
STORE = frozenset(codegen.STORAGE)
FLOATS = frozenset({DType.F32, DType.F64, DType.F16, DType.BF16})
F = frozenset({DType.F32, DType.F64})
SUM_DTS = frozenset({DType.F32, DType.F64, DType.I32, DType.I64})
ORDER_DTS = frozenset({DType.F32, DType.F64, DType.I8, DType.I16, DType.I32, DType.I64, DType.U8})
INDEX = frozenset({DType.I32, DType.I64})


@hookimpl
def rlx_backend_info() -> BackendInfo:
    return BackendInfo(name="cuda", version=__version__, api_version=API_VERSION,
                       description="NVIDIA GPUs through CuPy: cuBLAS, NVRTC kernels, CUDA graphs",
                       vendor="RLX")


# -- devices --------------------------------------------------------------------------------------

_DEFAULT_CAPS = DeviceCaps(peak_flops={"default": 1e12}, mem_bandwidth=1e11, launch_overhead=1e-5,
                           host_link_bandwidth=1e10)
#: Dense f16/bf16 tensor-core FLOP per clock per SM, by compute capability major (datasheet ratios).
_TC_PER_SM = {7: 1024, 8: 2048, 9: 4096, 10: 8192, 12: 2048}
#: f32 FMA lanes per SM.
_F32_LANES = {7: 64, 8: 64, 9: 128, 10: 128, 12: 128}


def _unavailable(reason: str) -> list[DeviceInfo]:
    return [DeviceInfo(backend="cuda", name="cuda:0", available=False, caps=_DEFAULT_CAPS,
                       reason=f"no CUDA device: {reason}", host_memory=False)]


def _attr(rt: Any, attr: int, dev: int) -> int | None:
    try:
        return int(rt.deviceGetAttribute(attr, dev))
    except Exception:
        return None


#: Share of the PCIe link rate a transfer reaches: inputs and outputs are pageable NumPy memory,
#: staged by the driver. On an H200 (gen5 x16) `rlx calibrate cuda --quick` moved 48 MB that way
#: in 5.8 ms (8.3 GB/s, 13% of the link rate), where 80% put its estimate 5.5x too low.
_PAGEABLE = 0.2


def _host_link(index: int, cc_major: int, integrated: bool) -> tuple[float, str]:
    """Host<->device bandwidth estimate (bytes/s) for pageable copies, and where it came from."""
    if integrated:
        return 4.5e11, "integrated (NVLink-C2C class) estimate"
    try:  # the PCIe link actually negotiated, through NVML when it is installed
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        gen = pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h)
        width = pynvml.nvmlDeviceGetMaxPcieLinkWidth(h)
        lane = {3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}.get(int(gen), 0.985e9)
        return _PAGEABLE * lane * int(width), (f"PCIe gen{gen} x{width} (NVML), pageable copies at "
                                               f"{_PAGEABLE:.0%} of the link rate")
    except Exception:
        pass
    gen = 5 if cc_major >= 9 else 4
    lane = 3.938e9 if gen == 5 else 1.969e9
    return _PAGEABLE * lane * 16, f"PCIe gen{gen} x16 estimate (no NVML), pageable copies"


def _probe() -> list[DeviceInfo]:
    try:
        import cupy
    except Exception as e:  # ImportError, or a CuPy build that cannot load its CUDA libraries
        return _unavailable(f"CuPy cannot be imported ({type(e).__name__}: {e}); install "
                            "rlx-cuda[cuda12] or rlx-cuda[cuda13] on a machine with an NVIDIA driver")
    rt = cupy.cuda.runtime
    try:
        n = rt.getDeviceCount()
    except Exception as e:
        return _unavailable(f"the CUDA runtime found no usable GPU ({type(e).__name__}: {e})")
    if n == 0:
        return _unavailable("cudaGetDeviceCount() returned 0")
    devs = []
    for i in range(n):
        try:
            p = rt.getDeviceProperties(i)
            name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
            major, minor, sms = int(p["major"]), int(p["minor"]), int(p["multiProcessorCount"])
            clock = p.get("clockRate") or _attr(rt, 13, i) or 1_500_000  # kHz
            mclock = p.get("memoryClockRate") or _attr(rt, 36, i)
            bus = p.get("memoryBusWidth") or _attr(rt, 37, i)
            f32 = 2.0 * _F32_LANES.get(major, 64) * sms * clock * 1e3
            tc = float(_TC_PER_SM.get(major, 512)) * sms * clock * 1e3
            f64 = f32 / 2 if (major, minor) in ((6, 0), (7, 0), (8, 0), (9, 0), (10, 0)) else f32 / 64
            bw = 2.0 * mclock * 1e3 * bus / 8 if mclock and bus else 1e12
            link, link_src = _host_link(i, major, bool(p.get("integrated", 0)))
            caps = DeviceCaps(peak_flops={"f32": f32, "f64": f64, "f16": tc, "bf16": tc, "default": f32},
                              mem_bandwidth=0.8 * bw, launch_overhead=8e-6, host_link_bandwidth=link,
                              source="plugin estimates from device properties")
            details = {"gpu": name, "compute_capability": f"{major}.{minor}", "sms": str(sms),
                       "memory": f"{int(p['totalGlobalMem']) / 2**30:.1f} GiB",
                       "driver": _version(rt.driverGetVersion()), "runtime": _version(rt.runtimeGetVersion()),
                       "cupy": cupy.__version__, "host_link": link_src}
            devs.append(DeviceInfo(backend="cuda", name=f"cuda:{i}", available=True, caps=caps,
                                   host_memory=False, details=details))
        except Exception as e:
            devs.append(DeviceInfo(backend="cuda", name=f"cuda:{i}", available=False, caps=_DEFAULT_CAPS,
                                   reason=f"no CUDA device: probing failed ({type(e).__name__}: {e})",
                                   host_memory=False))
    return devs


def _version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


@hookimpl
def rlx_probe_devices() -> list[DeviceInfo]:
    return _probe()


# -- claims ---------------------------------------------------------------------------------------

def _cuda_source(program: str, in_dtypes: tuple[DType, ...], out_dtype: DType) -> tuple[str, str]:
    return codegen.elementwise_source(program, in_dtypes, out_dtype, "f" * len(in_dtypes), 0, False)


#: the render check (device kit): the variant's program renders as CUDA
_renderable = render_check(_cuda_source, "for CUDA")
_ew_pred = renders(_renderable)
_fused_pred = all_of(dtypes_in(STORE, "no CUDA kernels for"), _ew_pred)


def _last_axis(v: Any) -> str | None:
    t = v.in_types[0]
    if t.rank and normalize_axis(int(v.attrs["axis"]), t.rank) != t.rank - 1:
        return "only the last axis (other axes run through the decomposition)"
    return None


def _attention_pred(v: Any) -> str | None:
    q = v.in_types[0]
    if q.dtype not in FLOATS:
        return "queries must be f32/f64/f16/bf16"
    if v.attrs["mask"] == "padding" and v.in_types[3].dtype not in STORE:
        return f"padding mask dtype {v.in_types[3].dtype} is not supported"
    return None


def _claim(op: str, dtypes: frozenset[DType] | None, **kw: Any) -> KernelClaim:
    return KernelClaim(op, f"cuda.{op}", dtypes=dtypes, **kw)


@hookimpl
def rlx_kernels(device: DeviceInfo) -> list[KernelClaim]:
    claims = elementwise_claims("cuda.", GEN, _ew_pred, ops=ELEMENTWISE, overrides={
        "cast": {"dtypes": STORE, "out_dtypes": STORE,
                 "constraint": "any dtype but c64 (f16/bf16 rounded once, nearest-even)"}})
    claims += [
        fused_claim("cuda.fused_elementwise", _fused_pred,
                    constraint="programs the shared CUDA renderer can emit (no bf16 intermediates)"),
        _claim("matmul", FLOATS | {DType.I32, DType.I64},
               constraint="cuBLAS for floats (TF32 only with RLX_CUDA_TF32=1), CuPy for integers"),
        _claim("linear", FLOATS,
               constraint="one cuBLASLt matmul, bias in the epilogue (else one GEMM onto the bias)"),
        _claim("attention", FLOATS | STORE, out_dtypes=FLOATS, predicate=_attention_pred,
               constraint="f16/bf16 with head dim <= 128 and no bias mask on sm_80+: one fused flash "
                          "kernel (RLX_CUDA_FLASH); else two batched cuBLAS GEMMs + one masked softmax"),
        _claim("softmax", FLOATS, predicate=_last_axis, constraint="last axis"),
        _claim("log_softmax", FLOATS, predicate=_last_axis, constraint="last axis"),
        _claim("layer_norm", FLOATS),
        _claim("reduce_sum", SUM_DTS), _claim("reduce_prod", SUM_DTS), _claim("reduce_mean", F),
        _claim("reduce_max", ORDER_DTS), _claim("reduce_min", ORDER_DTS),
        _claim("argmax", ORDER_DTS), _claim("argmin", ORDER_DTS),
        _claim("reshape", STORE, in_place=True), _claim("transpose", STORE), _claim("expand", STORE),
        _claim("slice", STORE), _claim("concat", STORE), _claim("pad", STORE),
        _claim("gather", STORE | INDEX, out_dtypes=STORE),
        _claim("scatter_add", frozenset({DType.F32, DType.F64, DType.I32}) | INDEX,
               out_dtypes=frozenset({DType.F32, DType.F64, DType.I32})),
        _claim("iota", STORE - {DType.BOOL}),
        _claim("cumsum", SUM_DTS),
    ]
    # 3D Gaussian splatting (rlx_cuda.splat): NVRTC kernels; the rasterizer runs a tile per block
    claims += [_claim(op, F, predicate=_splat_tile if "rasterize" in op else None,
                      constraint="tile_size <= 32" if "rasterize" in op else "")
               for op in ("splat_project", "splat_project_grad", "splat_sh_color", "splat_sh_color_grad",
                          "splat_rasterize", "splat_rasterize_grad")]
    from .linalg import claims as linalg_claims  # no CuPy import: the claims are plain records

    claims += linalg_claims()
    from .collectives import claims as collective_claims  # NCCL; no CuPy import either

    claims += collective_claims()
    return claims


def _splat_tile(v: Any) -> str | None:
    t = int(v.attrs["tile_size"])
    return None if 1 <= t <= 32 else f"tile_size {t} > 32 (one thread per pixel of a tile, at most 1024)"


@hookimpl
def rlx_compile(program: Any, device: DeviceInfo) -> Any:
    from .program import CudaProgram

    return CudaProgram(program, int(device.name.split(":")[1]))


@hookimpl
def rlx_settings() -> list[Any]:
    from .settings import SETTINGS

    return list(SETTINGS)

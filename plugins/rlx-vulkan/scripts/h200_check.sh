#!/usr/bin/env bash
# rlx-vulkan on the lent H200 through NVIDIA's Vulkan driver (issue 18), one call, no network, < 9 min:
#   1. install rlx-core, rlx-conformance, rlx-cpu, rlx-cuda, rlx-vulkan editable (--no-index --no-deps)
#   2. rlx doctor (vulkan must show the H200, not lavapipe)
#   3. rlx conformance vulkan on the NVIDIA ICD (the GPU kernels: tiled GEMMs, row-per-workgroup softmax/
#      layer_norm, device-local memory) -> $OUT/vulkan-h200-cert.{json,md}
#   4. bench/vulkan_vs_cuda.py: 4096^3 f32 GEMM and MiniLM b32 s128, rlx-vulkan vs rlx-cuda, p50, ratio,
#      the GEMM variant that ran, MiniLM's device time per kernel class (RLX_VULKAN_PROFILE), and the fused
#      attention's before/after (RLX_VULKAN_ATTENTION=off vs fused, same GEMMs) -> $OUT/vulkan-vs-cuda.json
# Every stage is time-bounded and ends in one PASS/FAIL/TIMEOUT line; the summary lists them all.
#
#   run(command="bash plugins/rlx-vulkan/scripts/h200_check.sh", timeout_s=600,
#       carry=["build/gpu-carry/deb", "build/gpu-carry/whl", "build/gpu-carry/bin"])
#
# Carried (git-ignored, made on a networked machine; see bench/gpu_targets_device.sh): deb/ (apt-get download
# libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2), whl/ (the `vulkan`, cffi, pycparser wheels
# for the device's Python), bin/glslangValidator. Environment: OUT (default build/device-out), BUDGET (seconds
# for the whole script, default 530), T_CONF (conformance cap, default 200), PY (default python3), BENCH_ARGS
# (extra bench arguments), LOCAL_DRY=1 (skip setup and install: a dry run of the rest on a machine that has
# everything installed, e.g. lavapipe: the doctor stage then FAILs, as it must off the H200).
set -u -o pipefail
cd "$(dirname "$0")/../../.."
ROOT="$PWD"
OUT="${OUT:-$ROOT/build/device-out}"
mkdir -p "$OUT"
exec > >(tee "$OUT/vulkan-h200-check.log") 2>&1
C="$ROOT/build/gpu-carry"
export PYTHONUNBUFFERED=1 RLX_CACHE_DIR=/tmp/rlx-cache XDG_RUNTIME_DIR=/tmp
BUDGET="${BUDGET:-530}"
ORDER=(setup install doctor conformance bench)
source scripts/device_lib.sh

log "machine"
nvidia-smi -L 2>&1 || echo "nvidia-smi: not available"
"$PY" -c 'import sys; print("python", sys.version.split()[0], sys.executable)'

setup_carry() {  # the Vulkan loader, the bindings, glslang and the NVIDIA ICD; returns 1 on any gap
  local ok=0
  unpack_debs "$C/deb" || ok=1
  if ls "$C"/whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$C"/whl/*.whl || ok=1
  else
    echo "FAIL: no $C/whl/*.whl (carry build/gpu-carry/whl)"; ok=1
  fi
  command -v glslangValidator >/dev/null || { echo "FAIL: no glslangValidator (carry build/gpu-carry/bin)"; ok=1; }
  nvidia_vulkan_icd || ok=1
  nvidia_egl_vendor || true  # the Vulkan ICD in libGLX_nvidia may want GLVND's EGL vendor file
  return $ok
}

if [ "${LOCAL_DRY:-0}" = 1 ]; then
  RESULT[setup]="PASS (skipped: LOCAL_DRY)"; RESULT[install]="PASS (skipped: LOCAL_DRY)"
else
  log "setup: Vulkan loader + GLVND from $C/deb, vulkan bindings from $C/whl, glslangValidator from $C/bin"
  # set before setup_carry: its glslang check and every later stage need them
  export PATH="$C/bin:$PATH" PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  if setup_carry; then RESULT[setup]="PASS"; else RESULT[setup]="FAIL (see the FAIL lines above)"; fi
  log "install (editable, --no-index --no-deps --no-build-isolation)"
  if "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --disable-pip-version-check \
      -e . -e conformance -e plugins/rlx-cpu -e plugins/rlx-cuda -e plugins/rlx-vulkan; then
    RESULT[install]="PASS"
  else
    RESULT[install]="FAIL: pip could not install the repository"
    echo "FAIL install"; exit 1
  fi
fi

# doctor must list vulkan:0 on the H200 (a lavapipe fallback would certify the wrong device)
timeout --kill-after=5 60 "${RLX[@]}" doctor || echo "(rlx doctor exited $?)"
DOCTOR_PY=$(cat <<'PY'
from rlx_vulkan import plugin
from rlx_vulkan.vk import context
d = plugin.rlx_probe_devices()[0]
print("vulkan:0", d.available, dict(d.details), d.reason or "")
ctx = context()
mp = ctx.mem_props
for i in range(mp.memoryTypeCount):
    t = mp.memoryTypes[i]
    print(f"  memory type {i}: flags 0x{int(t.propertyFlags):x} heap {t.heapIndex} "
          f"({mp.memoryHeaps[t.heapIndex].size / 2**30:.1f} GiB)")
if not (d.available and not ctx.is_cpu and "NVIDIA" in d.details.get("device", "")):
    raise SystemExit("FAIL: vulkan:0 is not the NVIDIA GPU")
PY
)
stage doctor 60 "$PY" -c "$DOCTOR_PY"
# informational (a crash here fails nothing): what VK_KHR_cooperative_matrix offers on this driver
COOP_PY=$(cat <<'PY'
from rlx_vulkan.vk import context
ctx = context()
vk = ctx.vk
names = [e.extensionName if isinstance(e.extensionName, str) else vk.ffi.string(e.extensionName).decode()
         for e in vk.vkEnumerateDeviceExtensionProperties(ctx.physical, None)]
print("cooperative-matrix extensions:", [n for n in names if "cooperative_matrix" in n] or "none")
if "VK_KHR_cooperative_matrix" in names:
    kinds = {0: "f16", 1: "f32", 2: "f64", 3: "s8", 4: "s16", 5: "s32", 6: "s64", 7: "u8", 8: "u16", 9: "u32",
             10: "u64", 1000141000: "bf16"}
    fn = vk.vkGetInstanceProcAddr(ctx.instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR")
    for p in fn(ctx.physical):
        t = [kinds.get(int(x), str(int(x))) for x in (p.AType, p.BType, p.CType, p.ResultType)]
        print(f"  {p.MSize}x{p.NSize}x{p.KSize} A {t[0]} B {t[1]} C {t[2]} -> {t[3]} scope {p.scope}")
PY
)
timeout --kill-after=5 30 "$PY" -c "$COOP_PY" || echo "(cooperative-matrix query failed, exit $?: informational only)"
stage conformance "${T_CONF:-200}" "${RLX[@]}" conformance vulkan -q \
  --json "$OUT/vulkan-h200-cert.json" --markdown "$OUT/vulkan-h200-cert.md"
# shellcheck disable=SC2086  # BENCH_ARGS: words
stage bench 100000 "$PY" bench/vulkan_vs_cuda.py --json "$OUT/vulkan-vs-cuda.json" ${BENCH_ARGS:-}

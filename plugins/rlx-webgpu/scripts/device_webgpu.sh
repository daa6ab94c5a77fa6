#!/usr/bin/env bash
# Certify rlx-webgpu on a machine with a real Vulkan driver (the lent NVIDIA H200), no network.
# Carried (git-ignored, made on a networked machine): build/webgpu-carry/gl (libvulkan1 + GLVND .debs:
# `apt-get download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2`) and
# build/webgpu-carry/whl (`pip download --no-deps wgpu==0.32.0 rendercanvas==2.7.2 pycparser` and cffi
# wheels for the device's Python). Results go to $OUT.
#   run(command="bash plugins/rlx-webgpu/scripts/device_webgpu.sh", carry=["build/webgpu-carry"])
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT="${OUT:-build/device-out}"
CARRY=build/webgpu-carry
mkdir -p "$OUT"
exec > >(tee "$OUT/webgpu-device.log") 2>&1
export PYTHONUNBUFFERED=1 RLX_CACHE_DIR=/tmp/rlx-cache XDG_RUNTIME_DIR=/tmp
source scripts/device_lib.sh
# The NVIDIA Vulkan ICD lives in libGLX_nvidia and needs the GLVND/EGL libraries next to the loader.
unpack_debs "$CARRY/gl"
python3 --version
py=$(python3 -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
  "$CARRY"/whl/wgpu-*.whl "$CARRY"/whl/rendercanvas-*.whl "$CARRY"/whl/pycparser-*.whl \
  $(ls "$CARRY"/whl/cffi-*-"$py"-*.whl 2>/dev/null) && export PYTHONPATH=/tmp/site
nvidia_vulkan_icd
nvidia_egl_vendor
nvidia-smi -L
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e conformance -e plugins/rlx-cpu \
  -e plugins/rlx-webgpu || { echo "install failed"; exit 1; }
RLX_BACKENDS=cpu,webgpu "${RLX[@]}" doctor
RLX_BACKENDS=cpu,webgpu "${RLX[@]}" conformance webgpu -q --json "$OUT/webgpu-h200.json" --markdown "$OUT/webgpu-h200.md"
rc=$?
RLX_BACKENDS=cpu,webgpu python3 - <<'PY'
import time
import numpy as np
from rlx_core import GraphBuilder, Session
g = GraphBuilder("mm"); a = g.input("a", "f32", (1024, 1024)); g.output(g.tanh(a @ a) + 1.0)
gr = g.build()
x = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32) * 0.05
w = Session("webgpu", use_cache=False).compile(gr)
c = Session("cpu", use_cache=False).compile(gr)
print("webgpu device:", w.device.name, dict(w.device.details))
print("max |webgpu - cpu|:", float(np.abs(w(x) - c(x)).max()))
w(x)
t = time.perf_counter(); n = 20
for _ in range(n):
    w(x)
dt = (time.perf_counter() - t) / n
print(f"1024^3 matmul + tanh, incl. 4 MiB in/out copies: {dt * 1e3:.2f} ms per run "
      f"({2 * 1024**3 / dt / 1e9:.1f} GFLOP/s end to end)")
PY
exit $rc

#!/usr/bin/env bash
# Certify rlx-vulkan on a machine with a real Vulkan driver (the lent NVIDIA H200), no network.
# Carried (git-ignored, made on a networked machine): .gl/ (libvulkan1 .deb), .whl/ (vulkan, cffi,
# pycparser wheels for Python 3.12), .carrybin/ (glslangValidator). Results go to $OUT.
#   run(command="bash plugins/rlx-vulkan/scripts/device_vulkan.sh", carry=[".gl", ".whl", ".carrybin"])
# .gl: apt-get download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 (amd64).
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT="${OUT:-build/device-out}"
mkdir -p "$OUT"
exec > >(tee "$OUT/vulkan-device.log") 2>&1
export PYTHONUNBUFFERED=1 RLX_CACHE_DIR=/tmp/rlx-cache
# The NVIDIA Vulkan ICD lives in libGLX_nvidia and needs the GLVND/EGL libraries next to the loader.
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PATH="$PWD/.carrybin:$PATH"
icd=$(find /usr/local/nvidia /usr/share/vulkan /etc/vulkan /usr/lib -name 'nvidia_icd*.json' 2>/dev/null | head -1)
if [ -z "$icd" ]; then
  # The driver ships the Vulkan ICD inside libGLX_nvidia; describe it to the loader ourselves.
  lib=$(ldconfig -p | awk '/libGLX_nvidia.so.0/{print $NF; exit}')
  [ -z "$lib" ] && lib=$(find /usr/local/nvidia /usr/lib -name 'libGLX_nvidia.so.0' 2>/dev/null | head -1)
  if [ -n "$lib" ]; then
    icd=/tmp/nvidia_icd.json
    printf '{"file_format_version":"1.0.0","ICD":{"library_path":"%s","api_version":"1.3.0"}}\n' "$lib" > "$icd"
  fi
fi
echo "Vulkan ICD: ${icd:-none found}"
[ -n "$icd" ] && export VK_DRIVER_FILES="$icd" VK_ICD_FILENAMES="$icd"
egl=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
[ -f "$egl" ] && export __EGL_VENDOR_LIBRARY_FILENAMES="$egl"
nvidia-smi -L
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e conformance -e plugins/rlx-cpu \
  -e plugins/rlx-vulkan || { echo "install failed"; exit 1; }
rlx() { python3 -c 'import sys; from rlx_core.cli import main; sys.argv[0] = "rlx"; main()' "$@"; }
RLX_BACKENDS=cpu,vulkan rlx doctor
RLX_BACKENDS=cpu,vulkan rlx conformance vulkan -q --json "$OUT/vulkan-h200.json" --markdown "$OUT/vulkan-h200.md"
rc=$?
python3 - <<'PY'
import json, sys
import numpy as np
from rlx_core import GraphBuilder, Session
g = GraphBuilder("mm"); a = g.input("a", "f32", (512, 512)); g.output(g.tanh(a @ a) + 1.0)
gr = g.build()
x = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32) * 0.05
v = Session("vulkan", use_cache=False).compile(gr)
c = Session("cpu", use_cache=False).compile(gr)
print("vulkan device:", v.device.name, dict(v.device.details))
print("max |vulkan - cpu|:", float(np.abs(v(x) - c(x)).max()))
PY
exit $rc

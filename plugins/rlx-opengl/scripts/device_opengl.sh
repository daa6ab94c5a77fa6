#!/usr/bin/env bash
# Certify rlx-opengl on a machine with a real OpenGL driver (the lent NVIDIA H200), no network.
# Carried (git-ignored, made on a networked machine) in build/gl-carry/: deb/ (apt-get download libegl1
# libglvnd0 libgl1 libglx0 libopengl0, amd64) and whl/ (pip download moderngl glcontext for the
# device's Python). Results go to $OUT.
#   run(command="bash plugins/rlx-opengl/scripts/device_opengl.sh", carry=["build/gl-carry"])
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT="${OUT:-build/device-out}"
mkdir -p "$OUT"
exec > >(tee "$OUT/opengl-device.log") 2>&1
export PYTHONUNBUFFERED=1 RLX_CACHE_DIR=/tmp/rlx-cache
C=build/gl-carry
# GLVND's libEGL/libGL dispatch to the vendor library the driver ships (libEGL_nvidia).
for f in "$C"/deb/*.deb; do dpkg -x "$f" /; done
ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$C"/whl/*.whl && export PYTHONPATH=/tmp/site
egl=$(find /usr/local/nvidia /usr/share/glvnd /etc/glvnd -name '10_nvidia.json' 2>/dev/null | head -1)
if [ -z "$egl" ]; then
  lib=$(ldconfig -p | awk '/libEGL_nvidia.so.0/{print $NF; exit}')
  [ -z "$lib" ] && lib=$(find /usr/local/nvidia /usr/lib -name 'libEGL_nvidia.so.0' 2>/dev/null | head -1)
  if [ -n "$lib" ]; then
    egl=/tmp/10_nvidia.json
    printf '{"file_format_version":"1.0.0","ICD":{"library_path":"%s"}}\n' "$lib" > "$egl"
  fi
fi
echo "EGL vendor: ${egl:-none found}"
[ -n "$egl" ] && export __EGL_VENDOR_LIBRARY_FILENAMES="$egl"
nvidia-smi -L
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e conformance -e plugins/rlx-cpu \
  -e plugins/rlx-opengl || { echo "install failed"; exit 1; }
rlx() { python3 -c 'import sys; from rlx_core.cli import main; sys.argv[0] = "rlx"; main()' "$@"; }
RLX_BACKENDS=cpu,opengl rlx doctor
RLX_BACKENDS=cpu,opengl rlx conformance opengl -q --json "$OUT/opengl-h200.json" --markdown "$OUT/opengl-h200.md"
rc=$?
RLX_BACKENDS=cpu,opengl python3 -m pytest -q -p no:cacheprovider tests/test_opengl_plugin.py
RLX_BACKENDS=cpu,opengl python3 - <<'PY'
import time
import numpy as np
from rlx_core import GraphBuilder, Session
g = GraphBuilder("mm"); a = g.input("a", "f32", (1024, 1024)); g.output(g.tanh(a @ a) + 1.0)
gr = g.build()
x = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32) * 0.05
o = Session("opengl", use_cache=False).compile(gr)
c = Session("cpu", use_cache=False).compile(gr)
print("opengl device:", o.device.name, dict(o.device.details))
print("max |opengl - cpu|:", float(np.abs(o(x) - c(x)).max()))
o(x)
t = time.perf_counter(); o(x); print(f"1024^3 matmul + tanh, incl. copies: {1e3 * (time.perf_counter() - t):.1f} ms")
PY
exit $rc

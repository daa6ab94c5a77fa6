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
source scripts/device_lib.sh
# GLVND's libEGL/libGL dispatch to the vendor library the driver ships (libEGL_nvidia).
unpack_debs "$C/deb"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$C"/whl/*.whl && export PYTHONPATH=/tmp/site
nvidia_egl_vendor
nvidia-smi -L
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e conformance -e plugins/rlx-cpu \
  -e plugins/rlx-opengl || { echo "install failed"; exit 1; }
RLX_BACKENDS=cpu,opengl "${RLX[@]}" doctor
RLX_BACKENDS=cpu,opengl "${RLX[@]}" conformance opengl -q --json "$OUT/opengl-h200.json" --markdown "$OUT/opengl-h200.md"
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

